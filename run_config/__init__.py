"""Distribution strategies and `tf.estimator.RunConfig` for estimator-dist.

Modules: `run_config.names` (strategy and collective names, no TensorFlow
import), `run_config.strategies` (strategy factory, role-aware selection) and
`run_config.run_config` (the RunConfig builder).
"""
