"""estimator-dist: multi-worker `tf.estimator` training that works the first time.

The programs users run are the modules here (`python -m estimator_dist.train`,
`.launch`, `.script`, `.manifest`, `.check`, `.predict`); the rest lives in one
folder per concern (`base/`, `config/`, `guards/`, `task/`, `serving/`,
`programs/`, `kubernetes/`, `launcher/`), described in docs/architecture.md.
"""

__version__ = "0.1.0"
