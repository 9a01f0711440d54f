"""The package's exceptions.

Every exception raised on purpose by estimator-dist derives from `Error`.
`UsageError` marks a problem the user fixes by changing a flag, a TF_CONFIG
or a data path: entry points print its message and exit with code 2.
"""


class Error(Exception):
    """Base class of the errors estimator-dist raises on purpose."""


class UsageError(Error, ValueError):
    """A bad flag, parameter, TF_CONFIG or data path; exit code 2."""


class ClusterConfigError(UsageError):
    """TF_CONFIG is malformed or inconsistent."""


class DatasetNotFoundError(UsageError):
    """A dataset is not present where the input function looks for it."""


class RegistryError(UsageError):
    """A name or `module:function` path does not resolve to a callable."""


class PeerFailureError(Error):
    """A collective operation failed: a peer died, or the network between tasks failed."""
