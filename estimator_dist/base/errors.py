"""The package's exceptions, each with the exit code an entry point ends with.

Every exception raised on purpose by estimator-dist derives from `Error`.
`UsageError` marks a problem the user fixes by changing a flag, a TF_CONFIG
or a data path: entry points print its message and exit with code 2. See
`estimator_dist.base.exit_codes` for what each code means to a scheduler.
`DataError` marks a bad record found while training: exit code 3, and
retrying fails the same way.
"""

from estimator_dist.base import exit_codes


class Error(Exception):
    """Base class of the errors estimator-dist raises on purpose."""

    exit_code = exit_codes.FAILURE


class UsageError(Error, ValueError):
    """A bad flag, parameter, TF_CONFIG or data path; exit code 2."""

    exit_code = exit_codes.USAGE


class ClusterConfigError(UsageError):
    """TF_CONFIG is malformed or inconsistent."""


class DatasetNotFoundError(UsageError):
    """A dataset is not present where the input function looks for it."""


class RegistryError(UsageError):
    """A name or `module:function` path does not resolve to a callable."""


class ClusterMismatchError(Error):
    """The tasks of a cluster disagree on the cluster or the job; exit code 4."""

    exit_code = exit_codes.CLUSTER_MISMATCH


class PeerFailureError(Error):
    """A collective operation failed: a peer died, or the network between tasks failed."""

    exit_code = exit_codes.PEER_FAILURE


class ClusterTimeoutError(Error):
    """The cluster did not assemble before the start-up deadline."""

    exit_code = exit_codes.CLUSTER_TIMEOUT


class PortInUseError(Error):
    """This task's port is held by another process."""

    exit_code = exit_codes.PORT_IN_USE


class DataError(Error):
    """Training read a record it cannot use (corrupt, truncated, mistyped); exit code 3.

    Retrying fails the same way: the data must be fixed, or bad records
    skipped with `--params=skip_bad_records=true`.
    """

    exit_code = exit_codes.BAD_DATA


class UserCodeError(Error):
    """The user's model_fn, input_fn or script raised: restarting would raise again."""

    exit_code = exit_codes.USER_CODE


class CollectiveMismatchError(Error):
    """The tasks all-reduced tensors that differ in shape or type: a deterministic fault."""

    exit_code = exit_codes.COLLECTIVE_MISMATCH


class CheckpointGoneError(Error):
    """The checkpoint a task was restoring was deleted meanwhile; exit code 159, retryable.

    Training keeps the newest `--keep_checkpoint_max` checkpoints: one a slow
    or frozen evaluator listed can be gone when it restores it. Restarted, the
    task takes the newest instead.
    """

    exit_code = exit_codes.CHECKPOINT_GONE


class ModelDirUnwritableError(Error):
    """The storage of model_dir refused a write (full, read-only, no permission); exit code 9.

    Retrying fails the same way until someone frees space, remounts the
    filesystem read-write or grants permission; the checkpoints already
    written stay loadable, and a new run resumes from the latest.
    """

    exit_code = exit_codes.MODEL_DIR_UNWRITABLE


class StorageUnreachableError(Error):
    """The object storage holding the job's results did not answer in time; exit code 160.

    A store that is down or cut off may come back: a restart of the job
    resumes from the latest checkpoint the storage holds.
    """

    exit_code = exit_codes.STORAGE_UNREACHABLE
