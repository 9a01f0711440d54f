"""The package's exceptions.

Every exception raised on purpose by estimator-dist derives from `Error`.
`UsageError` marks a problem the user fixes by changing a flag, a TF_CONFIG
or a data path: entry points print its message and exit with code 2.
`DataError` marks a bad record found while training: exit code 3, and
retrying fails the same way.
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


class DataError(Error):
    """Training read a record it cannot use (corrupt, truncated, mistyped); exit code 3.

    Retrying fails the same way: the data must be fixed, or bad records
    skipped with `--params=skip_bad_records=true`.
    """
