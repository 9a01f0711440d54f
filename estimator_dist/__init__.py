"""estimator-dist: multi-worker `tf.estimator` training that works the first time.

Modules: `cluster` (TF_CONFIG), `driver` (train_and_evaluate on any role),
`train` (the absl entry point), `launch` (a local cluster on one machine),
`registry` and `params` (names and hyper-parameters from the command line).
"""

__version__ = "0.1.0"
