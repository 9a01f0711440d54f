"""Distribution strategies and `tf.estimator.RunConfig` for estimator-dist.

Modules: `run_config.names` (strategy and collective names, no TensorFlow
import), `run_config.strategies` (strategy factory, role-aware selection, the
one decision of the collective implementation) and `run_config.run_config`
(the RunConfig builder). The TensorFlow workarounds the strategies rely on
(sparse gradients all-reduced dense, gradients in bfloat16/float16 on the
wire, input iterators that close at once) live in
`estimator_dist.tf_runtime.patches`, installed once per process.

Importing this package readies `estimator_dist.tf_runtime.compat` before its
modules import TensorFlow, so that `tf.estimator` exists on TensorFlow 2.16+.
"""

from estimator_dist.tf_runtime import compat as _compat

_compat.prepare()
