"""What a failed training means: the error with an exit code of its own, and its fix.

`explain_training_error` turns what `tf.estimator.train_and_evaluate` raised
into a bad record (exit 3), an unwritable model_dir (exit 9), tensors whose
shapes differ between tasks (exit 7), a lost peer (exit 150) or a checkpoint
deleted while it was restored (exit 159, `explain_checkpoint_gone`);
`explain_user_error` into the user's code failing (exit 5). The driver and
the script runner both use them, so a task fails alike whichever started it.

>>> is_peer_error(tf.errors.UnavailableError(None, None, "Socket closed"))
True
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from typing import Iterator, Optional

import tensorflow as tf
from absl import logging

from estimator_dist.base import files
from estimator_dist.base.errors import (
    CheckpointGoneError,
    CollectiveMismatchError,
    Error,
    ModelDirUnwritableError,
    PeerFailureError,
    UsageError,
    UserCodeError,
)
from estimator_dist.base.files import METRICS_FILE, RUN_RECORD_FILE
from estimator_dist.tf_runtime import compat
from input_fns import bad_data

#: Errors of collective operations and lost peers, fatal once training runs.
PEER_ERRORS = (
    tf.errors.AbortedError,
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.CancelledError,
)

#: Starts the message of any error from a collective that a peer aborted.
COLLECTIVE_ABORT = "Collective ops is aborted by"

#: In the message of a collective whose tasks contributed tensors of different shapes.
COLLECTIVE_SHAPE_MISMATCH = "Shape mismatch in the collective instance"

#: In the error of a TF1 optimizer that cannot update variables under a strategy.
DISTRIBUTED_HANDLE = "DistributedVariable.handle is not available"

#: Names the optimizers behind `DISTRIBUTED_HANDLE`, and what to use instead.
DISTRIBUTED_OPTIMIZER_HINT = (
    "Some tf.compat.v1.train optimizers (ProximalAdagradOptimizer, AdagradDAOptimizer, "
    "ProximalGradientDescentOptimizer) cannot update variables under a tf.distribute strategy, "
    "in any TensorFlow 2.15 job; use AdagradOptimizer, FtrlOptimizer (which has l1 and l2 "
    "regularization) or GradientDescentOptimizer. "
)

#: What a collective shape mismatch means, and its fixes.
COLLECTIVE_MISMATCH_MESSAGE = (
    "{kind} at global step {step}: the tasks all-reduced tensors of different shapes ({summary}). "
    "The same graph would fail the same way after a restart. Usual causes: a model whose "
    "variables differ between tasks (shapes computed from data a task read alone, such as a "
    "vocabulary built per worker), or per-task sizes of a value that is reduced. Build every "
    "shape from settings every task shares."
)

#: The refused writes no restart fixes, by errno, each with its fix.
STORAGE_FIXES = {
    errno.ENOSPC: (
        "free space on that filesystem (delete old runs, or keep fewer checkpoints with "
        "--keep_checkpoint_max and exports with --exports_to_keep) or give a --model_dir on a "
        "filesystem with room"
    ),
    errno.EDQUOT: (
        "raise this user's quota on that filesystem, free space under it, or give a --model_dir "
        "elsewhere"
    ),
    errno.EROFS: (
        "remount that filesystem read-write (one the kernel remounted read-only after I/O errors "
        "needs checking first) or give a --model_dir on a writable filesystem"
    ),
    errno.EACCES: (
        "give this user (uid {uid}) write permission on that directory, or give a --model_dir it "
        "may write to"
    ),
}

#: The errno behind each message of a refused write.
_ERRNO_OF = {os.strerror(code): code for code in STORAGE_FIXES}

#: How TensorFlow reports a refused write: a line `<path>; <strerror>`.
_REFUSED_WRITE = re.compile(
    r"^\s*(.+?); (" + "|".join(map(re.escape, _ERRNO_OF)) + ")", re.MULTILINE
)

#: Why a write to model_dir failed, what is kept, and the fix.
MODEL_DIR_UNWRITABLE_MESSAGE = (
    "cannot write the {what} to {model_dir}{at_step}: {reason} ({path}; {space}). {kept} "
    "A restart would fail the same way, so the job is not retried: {fix}, then run the same "
    "command again."
)


#: How TensorFlow 2.15 names a checkpoint it cannot restore because its files are gone: Saver's
#: check of the index, RestoreV2 opening a file, a checkpoint reader finding none.
_GONE = (
    re.compile(r"The passed save_path is not a valid checkpoint: (\S+)"),
    re.compile(r"^\s*(\S+?)\.(?:index|data-\d+-of-\d+); No such file or directory", re.MULTILINE),
    re.compile(r"Failed to find any matching files for (\S+)"),
)

#: Why a task exits 159: which checkpoint disappeared, and what a restart takes instead.
CHECKPOINT_GONE_MESSAGE = (
    "the checkpoint {path} was deleted while this task restored it: training keeps the newest "
    "--keep_checkpoint_max checkpoints and removed it meanwhile (this task was slow or "
    "frozen). Restarted, the task takes the newest checkpoint instead ({newest})."
)


def explain_checkpoint_gone(error: BaseException) -> Optional[CheckpointGoneError]:
    """The `CheckpointGoneError` (exit 159) that `error` means, if its checkpoint is gone.

    Only a checkpoint whose files are missing now counts: an error naming one
    that is whole (a variable missing from it, a corrupt file) is another fault.

    Args:
      error: What restoring a checkpoint raised: Saver's ValueError, or
        RestoreV2's or a reader's NotFoundError.

    >>> explain_checkpoint_gone(ValueError("The passed save_path is not a valid checkpoint: "
    ...                                    "/nowhere/model.ckpt-300"))  # doctest: +ELLIPSIS
    CheckpointGoneError('the checkpoint /nowhere/model.ckpt-300 was deleted while this task...')
    """
    if not isinstance(error, (ValueError, tf.errors.NotFoundError)):
        return None
    message = getattr(error, "message", str(error))
    found = next((m for m in (p.search(message) for p in _GONE) if m), None)
    if found is None:
        return None
    path = found.group(1)
    if tf.io.gfile.exists(f"{path}.index") and tf.io.gfile.glob(f"{path}.data-*"):
        return None
    newest = tf.train.latest_checkpoint(os.path.dirname(path)) if "/" in path else None
    logging.info("The checkpoint being restored is gone; full error: %s", message)
    return CheckpointGoneError(
        CHECKPOINT_GONE_MESSAGE.format(path=path, newest=newest or "none is left")
    )


def is_peer_error(error: tf.errors.OpError) -> bool:
    """Whether `error` means a peer task or the network failed.

    A peer that leaves a step early aborts the collectives waiting for it;
    TensorFlow reports that as an InternalError naming the abort.

    >>> is_peer_error(tf.errors.UnavailableError(None, None, "Socket closed"))
    True
    >>> is_peer_error(tf.errors.InternalError(
    ...     None, None, "Collective ops is aborted by: Delete called on non-empty BufRendezvous"))
    True
    >>> is_peer_error(tf.errors.InternalError(None, None, "cuDNN failed"))
    False
    """
    return isinstance(error, PEER_ERRORS) or COLLECTIVE_ABORT in error.message


def explain_storage_error(
    error: BaseException, model_dir: Optional[str], step: Optional[int] = None
) -> Optional[ModelDirUnwritableError]:
    """The `ModelDirUnwritableError` (exit 9) that `error` means, if the storage refused a write.

    TensorFlow 2.15 reports a refused write as `<path>; <strerror>`: a full
    filesystem as ResourceExhaustedError (checkpoints, graph.pbtxt, files),
    or as RuntimeError from the thread writing event files; a read-only one,
    or a missing permission, as PermissionDeniedError. Python's own writes
    raise OSError.

    Args:
      error: What a write, or training, raised.
      model_dir: The job's model_dir. A refused permission counts only for a
        path in it (or one of its parents): reading data can be refused too.
        None: only a full or read-only filesystem counts, wherever it is.
      step: The last global step this task looked at, or None before training;
        a refused checkpoint's own step replaces it when newer.

    Returns:
      The error naming the path, what was written, the free space, the
      latest checkpoint and the fix; None for any other error.

    >>> error = tf.errors.ResourceExhaustedError(
    ...     None, None, "/runs/1/model.ckpt-100.data-00000-of-00001; No space left on device")
    >>> print(explain_storage_error(error, None, 100))  # doctest: +ELLIPSIS
    cannot write the checkpoint of step 100 to its directory at global step 100: No space ...
    """
    if isinstance(error, OSError):
        code, path = error.errno, error.filename
    else:
        message = getattr(error, "message", str(error))
        found = _REFUSED_WRITE.search(message)
        code, path = (_ERRNO_OF[found.group(2)], found.group(1)) if found else (None, None)
    if code not in STORAGE_FIXES or not isinstance(path, str):
        return None
    if model_dir is None and code == errno.EACCES:
        return None
    if model_dir is not None and not _related(path, model_dir):
        return None
    logging.error("The storage refused a write; full error: %s", error)
    # The caller's step is the last one it looked at; a checkpoint's name is newer.
    named = re.search(r"model\.ckpt-(\d+)", path)
    if named and step is not None:
        step = max(step, int(named.group(1)))
    latest = tf.train.latest_checkpoint(model_dir) if model_dir else None
    space = _free_space(path)
    if latest and code in (errno.ENOSPC, errno.EDQUOT) and "://" not in latest:
        size = sum(os.path.getsize(name) for name in tf.io.gfile.glob(f"{latest}.*"))
        space += f"; the latest checkpoint takes {_size(size)}"
    if latest:
        kept = f"The checkpoints already written are intact; training resumes from {latest}."
    else:
        kept = "No checkpoint had been written yet."
    return ModelDirUnwritableError(
        MODEL_DIR_UNWRITABLE_MESSAGE.format(
            what=_written_thing(path, model_dir),
            model_dir=model_dir or "its directory",
            at_step="" if step is None else f" at global step {step}",
            reason=os.strerror(code),
            path=path,
            space=space,
            kept=kept,
            fix=STORAGE_FIXES[code].format(uid=os.getuid()),
        )
    )


def _related(path: str, model_dir: str) -> bool:
    """Whether `path` is in `model_dir`, is it, or is one of its parents."""
    if "://" in model_dir:
        path, model_dir = path.rstrip("/"), model_dir.rstrip("/")
        return path.startswith(model_dir + "/") or (model_dir + "/").startswith(path + "/")
    path, model_dir = os.path.abspath(path), os.path.abspath(model_dir)
    return os.path.commonpath([path, model_dir]) in (path, model_dir)


def _written_thing(path: str, model_dir: Optional[str]) -> str:
    """Names what a write to `path` was: a checkpoint, an event file, an export..."""
    related = _related(path, model_dir) if model_dir else False
    relative = os.path.relpath(path, model_dir) if related else os.path.basename(path)
    name, first = os.path.basename(path), relative.split(os.sep)[0]
    step = re.search(r"model\.ckpt-(\d+)", relative)
    known = [k for k in ("graph.pbtxt", METRICS_FILE, RUN_RECORD_FILE) if name.startswith(k)]
    if relative.startswith(os.pardir) or relative == os.curdir:
        return "directory itself (creating it)"
    if step:
        return f"checkpoint of step {step.group(1)}"
    if name.startswith("checkpoint"):
        return "checkpoint list (the file `checkpoint`, which names the latest one)"
    if first == "eval":
        return "evaluation event file"
    if name.startswith("events.out.tfevents"):
        return "event file (TensorBoard summaries)"
    if first == "export":
        return "SavedModel export"
    if known:
        return f"file {known[0]}"
    return f"{'file' if '.' in name else 'directory'} {relative}"


def _free_space(path: str) -> str:
    """The free and total size of the filesystem holding `path`, as words."""
    if "://" in path:
        return "free space unknown: not a local path"
    directory = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(directory):
        directory = os.path.dirname(directory)
    stats = os.statvfs(directory)
    free, total = stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize
    return f"{_size(free)} free of {_size(total)} on its filesystem"


def _size(size: int) -> str:
    """A byte count as KiB, MiB or GiB.

    >>> _size(0), _size(102400), _size(20 * 2**20), _size(3 * 2**30)
    ('0 KiB', '100 KiB', '20.0 MiB', '3.0 GiB')
    """
    if size < 2**20:
        return f"{size // 1024} KiB"
    if size < 2**30:
        return f"{size / 2**20:.1f} MiB"
    return f"{size / 2**30:.1f} GiB"


@contextlib.contextmanager
def refused_writes(model_dir: str) -> Iterator[None]:
    """Raises `ModelDirUnwritableError` for a write to `model_dir` the storage refuses.

    A file system TensorFlow has no support for (`s3://` without
    tensorflow-io, a typo in the scheme) is a `UsageError` instead.
    """
    try:
        yield
    except tf.errors.UnimplementedError as error:
        raise UsageError(
            f"--model_dir={model_dir}: TensorFlow 2.15 cannot write there ({error.message}). "
            "Expected a path TensorFlow opens by itself: a local or mounted shared file system "
            "(NFS, EFS, FSx, a Kubernetes volume) or gs://. Mount the storage and pass its path."
        ) from None
    except (tf.errors.OpError, OSError) as error:
        unwritable = explain_storage_error(error, model_dir)
        if unwritable is None:
            raise
        raise unwritable from None


def explain_training_error(
    error: tf.errors.OpError,
    step: Optional[int],
    seconds: float,
    model_dir: Optional[str] = None,
) -> Optional[Exception]:
    """The error with an exit code of its own that `error` from training means, if any.

    Args:
      error: What `train_and_evaluate` raised.
      step: The last global step this task saw, or None; a message names the
        latest checkpoint's step instead when that is newer.
      seconds: How long training had run.
      model_dir: The job's model_dir, where a refused write means exit 9;
        None counts a full or read-only filesystem anywhere.

    Returns:
      A `bad_data.DataError` (exit 3) for a bad record, a
      `ModelDirUnwritableError` (exit 9) for a write the storage refused, a
      `CollectiveMismatchError` (exit 7) for tensors whose shapes differ
      between tasks, a `PeerFailureError` (exit 150) for a lost peer, a
      `CheckpointGoneError` (exit 159) for a checkpoint deleted while it was
      restored, a `UsageError` (exit 2) for a checkpoint that lacks a variable
      because the user made tf.keras Keras 3 on TensorFlow 2.16+, or None for
      any other error.
    """
    step = files.latest_known_step(step, model_dir)
    # A collective abort carries its cause's message, which may be a bad record.
    data_error = bad_data.data_error_from(error)
    if data_error is not None:
        return data_error
    gone = explain_checkpoint_gone(error)
    if gone is not None:
        return gone
    unwritable = explain_storage_error(error, model_dir, step)
    if unwritable is not None:
        return unwritable
    keras_3 = compat.explain_missing_variable(error)
    if keras_3 is not None:
        logging.error("Restoring failed, full TensorFlow error: %s", error.message)
        return UsageError(keras_3)
    if COLLECTIVE_SHAPE_MISMATCH in error.message:
        logging.error("Collective shape mismatch, full TensorFlow error: %s", error.message)
        return CollectiveMismatchError(
            COLLECTIVE_MISMATCH_MESSAGE.format(
                kind=type(error).__name__, step=step, summary=error_summary(error)
            )
        )
    if not is_peer_error(error):
        return None
    logging.error("Collective failure, full TensorFlow error: %s", error.message)
    at = "before the first step" if step is None else f"at global step {step}"
    return PeerFailureError(
        f"{type(error).__name__} {at} after {seconds:.1f} s "
        f"({error_summary(error)}). A peer task died or the network between tasks failed; "
        "restart the whole job from its latest checkpoint."
    )


def error_summary(error: tf.errors.OpError) -> str:
    """Returns the line of a TensorFlow error that says what happened, and the peer it names.

    For a person's console: the whole message (node, stack, raw gRPC details)
    belongs in the task log.

    >>> error_summary(tf.errors.UnavailableError(None, None, "Graph execution error:\\n\\n"
    ...     "Collective ops is aborted by: Socket closed\\nAdditional GRPC error information "
    ...     "from remote target /job:worker/replica:0/task:1 while calling RecvBuf"))
    'Collective ops is aborted by: Socket closed; peer worker-1'
    """
    lines = [line.strip() for line in error.message.splitlines() if line.strip()]
    noise = (
        "Graph execution error",
        "Detected at",
        "Additional GRPC",
        ":{",
        "File ",
        "Node:",
        "From ",
    )
    useful = [line for line in lines if not line.startswith(noise)]
    summary = (useful or lines or [type(error).__name__])[0][:300]
    peer = re.search(r"remote target /job:(\w+)/replica:\d+/task:(\d+)", error.message)
    return f"{summary}; peer {peer.group(1)}-{peer.group(2)}" if peer else summary


def explain_user_error(error: Exception, model_dir: Optional[str], step: Optional[int]) -> Error:
    """The error a non-TensorFlow exception raised while training ends the task with.

    The thread writing event files raises what the storage refused: that is
    an unwritable model_dir (exit 9). Saver's ValueError for a checkpoint
    deleted while it was restored (an evaluator's, rotated away) is exit 159.
    Anything else came from the user's model_fn, input_fn or hooks (exit 5);
    its traceback is logged here.

    Args:
      error: What training raised.
      model_dir: The job's model_dir.
      step: The last global step this task saw, or None.
    """
    unwritable = explain_storage_error(error, model_dir, step)
    if unwritable is not None:
        return unwritable
    gone = explain_checkpoint_gone(error)
    if gone is not None:
        return gone
    logging.exception("Training raised:")
    hint = DISTRIBUTED_OPTIMIZER_HINT if DISTRIBUTED_HANDLE in str(error) else ""
    return UserCodeError(
        f"training raised {type(error).__name__}: {error}. {hint}The traceback is in the "
        "log above; the model_fn or input_fn would raise it again after a restart, so the "
        "job stops. Fix the code and run again."
    )
