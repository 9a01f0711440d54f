"""Distribution strategies and `tf.estimator.RunConfig` for estimator-dist.

Modules: `run_config.names` (strategy and collective names, no TensorFlow
import), `run_config.strategies` (strategy factory, role-aware selection),
`run_config.run_config` (the RunConfig builder), `run_config.wire` (gradients in
bfloat16/float16 on the network), `run_config.sparse` (sparse gradients
all-reduced as dense tensors) and `run_config.teardown` (input iterators that
let a training session close at once).
"""
