"""One task's storage: the local model_dir it trains in, kept in step with the storage URL.

`task_storage` is the one call a task's run makes. For a job whose results
TensorFlow writes itself (a local or shared path, `gs://`) it gives back
model_dir unchanged and does nothing else. For one whose results live at a
URL it (1) checks that the task may write there (exit 2 for refused
credentials or a missing bucket, before any training), (2) makes the task's
local directory hold the checkpoint the storage names latest (every
training task restores it itself; the evaluator starts from it), (3) starts
the threads of `estimator_dist.storage.sync`, and (4) at the end waits until
the last checkpoint and the results are uploaded (exit 160 if the storage
stays away longer than `flush_secs`). A task that ends through a fail-fast
exit (a preemption's 155, a stall) flushes first too, for at most
`EXIT_FLUSH_SECS` (`flush_before_exit`).

Example:

  >>> with task_storage("s3://b/run1", None, "chief-0", "chief") as model_dir:  # doctest: +SKIP
  ...     run_the_task(model_dir)
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Iterator, List, Optional, Sequence

from absl import logging

from estimator_dist.base.errors import StorageUnreachableError
from estimator_dist.storage import sync
from estimator_dist.storage.location import place
from estimator_dist.storage.remote import Remote, check_access

#: Longest wait for uploads when a task ends through a fail-fast exit.
EXIT_FLUSH_SECS = 20.0
#: The uploads did not finish before the task's end.
NOT_FLUSHED = (
    "{url}: the last uploads did not finish within {secs:g} s ({why}); the storage keeps the "
    "checkpoint before them, from which a restart resumes."
)

#: Seconds of training by which a stop decision leads its step when the tasks coordinate
#: through the storage: the mirror's two polls (1 s each), a listing, an upload and a
#: download each way, and a loaded machine's delays (0.39 s end to end with 0.25 s polls on a
#: loaded 2-core machine, moto on loopback, where a worker missed a 1 s lead at 300 steps/s).
COORDINATION_SECS = 5.0

#: The loops of this process's `task_storage`, flushed by `flush_before_exit`.
_ACTIVE: List[sync._Loop] = []


def coordination_secs() -> float:
    """How late a file one task writes for the others may reach them: 0 with a shared model_dir.

    >>> coordination_secs()  # No `task_storage` synchronises this process.
    0.0
    """
    return COORDINATION_SECS if _ACTIVE else 0.0


def task_kind(task_type: Optional[str]) -> str:
    """What a task of `task_type` does with the storage: `chief` (also a single process), ...

    >>> task_kind(None), task_kind("chief"), task_kind("master"), task_kind("evaluator")
    ('chief', 'chief', 'chief', 'evaluator')
    """
    if task_type in (None, "chief", "master"):
        return "chief"
    return task_type if task_type in ("evaluator", "ps") else "worker"


@contextlib.contextmanager
def task_storage(
    model_dir: str,
    storage: Optional[str],
    role: str,
    task_type: Optional[str],
    shared: Sequence[str] = (),
    flush_secs: float = 600.0,
) -> Iterator[str]:
    """Gives a task the local model_dir to train in, synchronised with the job's storage.

    Args:
      model_dir: The job's `--model_dir` (a path, or a URL).
      storage: The job's `--storage` URL, or None.
      role: This task's name, e.g. `worker-1`.
      task_type: `chief`, `worker`, `ps`, `evaluator`, or None for one process.
      shared: Relative paths the tasks coordinate through (preemption
        requests, the agreed last step): kept the same on every task.
      flush_secs: Longest wait for the last uploads at the end.

    Yields:
      The directory to give TensorFlow as model_dir.

    Raises:
      UsageError: for refused credentials, a missing bucket, a missing
        storage library, or bad `--model_dir`/`--storage` (exit 2).
      StorageUnreachableError: when the storage does not answer at the start,
        or the last uploads do not finish within `flush_secs` (exit 160).
    """
    placement = place(model_dir, storage)
    if not placement.synced:
        yield model_dir
        return
    url, local, kind = placement.url or model_dir, placement.local_dir(role), task_kind(task_type)
    os.makedirs(local, exist_ok=True)
    check_access(url, role)
    restored = None
    if kind != "ps":
        restored = sync.restore_latest(Remote(url), local)
    loops: List[sync._Loop] = [
        sync.Mirror(url, local, shared),
        sync.Publisher(url, local, kind, restored, shared),
    ]
    if kind == "evaluator":
        loops.append(sync.Fetcher(url, local, restored))
    logging.info("estimator_dist: %s works in %s; results go to %s.", role, local, url)
    for loop in loops:
        loop.start()
    _ACTIVE[:] = loops
    failed = True
    try:
        yield local
        failed = False
    finally:
        _ACTIVE[:] = []
        _finish(loops, url, EXIT_FLUSH_SECS if failed else flush_secs, raise_late=not failed)


def _finish(loops: Sequence[sync._Loop], url: str, secs: float, raise_late: bool) -> None:
    """Stops fetching, flushes the mirror and the uploads within `secs`, stops the threads."""
    for loop in loops:
        if isinstance(loop, sync.Fetcher):
            loop.stop()
    deadline = time.monotonic() + secs
    late = [
        loop
        for loop in loops
        if loop.is_alive() and not loop.flush(max(0.0, deadline - time.monotonic()))
    ]
    for loop in loops:
        loop.stop()
    if late:
        message = NOT_FLUSHED.format(url=url, secs=secs, why=late[0].failing or "still busy")
        if raise_late:
            raise StorageUnreachableError(message)
        logging.warning("estimator_dist: %s", message)


def flush_before_exit(secs: float = EXIT_FLUSH_SECS) -> None:
    """Uploads what this task has not uploaded yet, before a fail-fast exit; at most `secs`."""
    loops, _ACTIVE[:] = list(_ACTIVE), []
    if loops:
        _finish(loops, loops[0].remote.url, secs, raise_late=False)
