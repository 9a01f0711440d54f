"""estimator-dist: multi-worker `tf.estimator` training that works the first time.

The programs users run are the modules here (`python -m estimator_dist.train`,
`.launch`, `.script`, `.manifest`, `.check`, `.predict`); the rest lives in one
folder per concern (`base/`, `config/`, `guards/`, `task/`, `serving/`,
`programs/`, `kubernetes/`, `launcher/`), described in docs/architecture.md.
"""

__version__ = "0.1.0"

# Before anything of the package, or of a program run by it, imports TensorFlow: on
# TensorFlow 2.16 and later, tf.estimator needs tf-keras and the compatibility layer
# (estimator_dist.tf_runtime.compat); on TensorFlow 2.15 this does nothing.
from estimator_dist.tf_runtime import compat as _compat

_compat.prepare()
