"""Checkpoints that are always usable: every task restores the newest one that loads whole.

TensorFlow restores the checkpoint the `checkpoint` state file names, without
looking: a `.data` file cut short (a disk that filled, a copy that stopped, a
bad block) fails every task with `OutOfRangeError: Read less bytes than
requested`, and an older checkpoint that loads fine is never tried.

Before any task restores, the chief (or a single process) settles the
checkpoints (`settle`): it reads every tensor of the newest listed checkpoint
(each read checks the tensor's size and CRC32C against its `.index` entry), and
while one fails, moves its files aside into `model_dir/corrupt/model.ckpt-N.<why>/`
(kept, never deleted) and tries the previous one. The `checkpoint` state file is
rewritten to name the newest good one, and one line says which were skipped and
why. Leftover `model.ckpt-N_temp/` directories of a chief killed mid-save are
removed. The chief does this before the rendezvous, where every other training
task waits for it, so no task restores before the decision and nothing writes a
checkpoint while it runs; the evaluator, outside the rendezvous, waits until the
latest checkpoint loads (`wait_until_usable`).

Example, in a model_dir whose newest checkpoint lost half of its `.data` file::

    estimator_dist: skipped checkpoint model.ckpt-300 (its .data is cut short:
    model.ckpt-300.data-00000-of-00001 has 116,804 bytes, too few for 'dense/kernel');
    moved to /runs/1/corrupt/; resuming from model.ckpt-200.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import time
from typing import List, Optional, Tuple

from absl import logging

from estimator_dist.cluster.tf_config import EVALUATOR, ClusterConfig
from estimator_dist.tf_runtime import native

#: Where checkpoints that cannot be restored are moved, inside model_dir.
CORRUPT_DIR = "corrupt"
#: A directory a save writes into before it publishes the checkpoint with a rename.
_TEMP = re.compile(r"^.+-\d+_temp(_[0-9a-f]+)?$")
#: Seconds between the evaluator's looks at the latest checkpoint.
_POLL_SECS = 0.5


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A checkpoint that cannot be restored: its prefix, a short tag and why, for people."""

    prefix: str
    tag: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Settled:
    """What `settle` found: the checkpoint restored next (None: none), what it skipped."""

    latest: Optional[str]
    skipped: Tuple[Skipped, ...] = ()
    removed_temps: Tuple[str, ...] = ()

    @property
    def step(self) -> int:
        """The global step training resumes from; 0 without a checkpoint."""
        return step_of(self.latest) if self.latest else 0


def step_of(prefix: str) -> int:
    """The global step in a checkpoint's prefix.

    >>> step_of("/runs/1/model.ckpt-300")
    300
    """
    return int(prefix.rsplit("-", 1)[1])


def problem(prefix: str) -> Optional[Tuple[str, str]]:
    """Why the checkpoint at `prefix` cannot be restored, or None when every tensor reads whole.

    Returns:
      `(tag, reason)`: a short tag for a file name (`no-index`, `no-data`,
      `unreadable-index`, `cut-short`, `corrupt-data`) and a phrase for people.
    """
    import tensorflow as tf

    if not tf.io.gfile.exists(f"{prefix}.index"):
        return "no-index", "its .index file is missing"
    shards = tf.io.gfile.glob(f"{glob.escape(prefix)}.data-?????-of-?????")
    expected = int(shards[0].rsplit("-of-", 1)[1]) if shards else 1
    if len(shards) < expected:
        return "no-data", f"{expected - len(shards)} of its {expected} .data file(s) missing"
    try:
        reader = tf.compat.v1.train.NewCheckpointReader(prefix)
    except (tf.errors.OpError, ValueError) as error:
        return "unreadable-index", f"its .index cannot be read: {_first_line(error)}"
    for name in sorted(reader.get_variable_to_dtype_map()):
        try:
            reader.get_tensor(name)
        except Exception as error:  # The reader raises IndexError, ValueError or OpError.
            if "less bytes" not in str(error):
                return "corrupt-data", f"tensor {name!r} does not read back: {_first_line(error)}"
            sizes = ", ".join(
                f"{os.path.basename(shard)} has {tf.io.gfile.stat(shard).length:,} bytes"
                for shard in shards
            )
            return "cut-short", f"its .data is cut short: {sizes}, too few for {name!r}"
    return None


def _first_line(error: BaseException) -> str:
    message = getattr(error, "message", None) or str(error)
    return message.strip().splitlines()[0] if message.strip() else type(error).__name__


def _listed(model_dir: str) -> Tuple[List[str], List[float], bool]:
    """The checkpoints the state file lists, oldest first, their timestamps if any, and
    whether the state file must be written again (it exists but does not parse)."""
    import tensorflow as tf

    state = tf.train.get_checkpoint_state(model_dir)  # None also when it does not parse.
    if state is None and tf.io.gfile.exists(os.path.join(model_dir, "checkpoint")):
        logging.warning(
            "estimator_dist: %s cannot be read; looking for checkpoints by file name.",
            os.path.join(model_dir, "checkpoint"),
        )
        indexes = tf.io.gfile.glob(os.path.join(glob.escape(model_dir), "*-*.index"))
        found = [path[: -len(".index")] for path in indexes]
        return sorted((p for p in found if p.rsplit("-", 1)[1].isdigit()), key=step_of), [], True
    if state is None or not state.model_checkpoint_path:
        return [], [], False
    # Checkpoints live in model_dir, though the state file may hold another mount's paths.
    paths = [os.path.join(model_dir, os.path.basename(p)) for p in state.all_model_checkpoint_paths]
    latest = os.path.join(model_dir, os.path.basename(state.model_checkpoint_path))
    if latest not in paths:
        paths.append(latest)
    stamps = list(state.all_model_checkpoint_timestamps)
    return paths, stamps if len(stamps) == len(paths) else [], False


def remove_temps(model_dir: str) -> Tuple[str, ...]:
    """Removes the `model.ckpt-N_temp/` directories of saves that never finished.

    Call only while no task saves (the chief before the rendezvous). Returns
    the names removed.
    """
    import tensorflow as tf

    if not tf.io.gfile.isdir(model_dir):
        return ()
    removed = []
    for name in sorted(tf.io.gfile.listdir(model_dir)):
        name = name.rstrip("/")
        path = os.path.join(model_dir, name)
        if _TEMP.match(name) and tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
            removed.append(name)
    return tuple(removed)


def _move_aside(model_dir: str, prefix: str, tag: str) -> None:
    """Moves every file of the checkpoint at `prefix` into `model_dir/corrupt/<name>.<tag>/`."""
    import tensorflow as tf

    base = os.path.join(model_dir, CORRUPT_DIR, f"{os.path.basename(prefix)}.{tag}")
    target, copy = base, 1
    while tf.io.gfile.exists(target):
        copy += 1
        target = f"{base}.{copy}"
    tf.io.gfile.makedirs(target)
    for path in tf.io.gfile.glob(glob.escape(prefix) + ".*"):
        tf.io.gfile.rename(path, os.path.join(target, os.path.basename(path)))


def settle(model_dir: str) -> Settled:
    """Makes the newest checkpoint that loads whole the one `checkpoint` names.

    Checks the listed checkpoints newest first; each that fails `problem` is
    moved aside into `model_dir/corrupt/`, and the state file is rewritten to
    the first that passes (removed when none does: training starts afresh).
    Also removes leftover `_temp` directories. Call only while no task
    writes checkpoints. Logs one line when it skipped or removed anything.

    Args:
      model_dir: The job's model_dir; one that does not exist yet is left alone.

    Returns:
      The checkpoint training resumes from and what was skipped.
    """
    import tensorflow as tf

    removed = remove_temps(model_dir)
    paths, stamps, unreadable = _listed(model_dir)
    skipped: List[Skipped] = []
    latest = None
    for path in sorted(paths, key=step_of, reverse=True):
        found = problem(path)
        if found is None:
            latest = path
            break
        skipped.append(Skipped(path, *found))
        _move_aside(model_dir, path, found[0])
    if skipped or unreadable:
        # Every listed checkpoint newer than `latest` was moved aside; the older ones stay.
        kept = [
            (path, stamp)
            for path, stamp in zip(paths, stamps or [None] * len(paths))
            if latest and step_of(path) <= step_of(latest)
        ]
        state = os.path.join(model_dir, "checkpoint")
        if latest is None:
            tf.io.gfile.remove(state)
        else:
            native.write_checkpoint_state(
                model_dir,
                os.path.basename(latest),
                [os.path.basename(p) for p, _ in kept],
                [s for _, s in kept] if stamps else None,
            )
    settled = Settled(latest, tuple(skipped), removed)
    line = describe(settled, model_dir)
    if line:
        logging.warning("%s", line)
    return settled


def describe(settled: Settled, model_dir: str) -> Optional[str]:
    """The one line that says what `settle` skipped and removed, or None when nothing.

    >>> describe(Settled("/r/model.ckpt-200", (Skipped("/r/model.ckpt-300", "no-index",
    ...          "its .index file is missing"),)), "/r")
    'estimator_dist: skipped checkpoint model.ckpt-300 (its .index file is missing); moved to \
/r/corrupt/; resuming from model.ckpt-200.'
    """
    parts = []
    if settled.skipped:
        names = "; ".join(f"{os.path.basename(s.prefix)} ({s.reason})" for s in settled.skipped)
        plural = "s" if len(settled.skipped) > 1 else ""
        resume = os.path.basename(settled.latest) if settled.latest else "step 0 (none is left)"
        where = os.path.join(model_dir, CORRUPT_DIR, "")
        parts.append(
            f"skipped checkpoint{plural} {names}; moved to {where}; resuming from {resume}"
        )
    if settled.removed_temps:
        parts.append(
            f"removed {', '.join(settled.removed_temps)} (left by a save that never finished)"
        )
    return f"estimator_dist: {'; '.join(parts)}." if parts else None


def wait_until_usable(model_dir: str, timeout: float) -> Optional[str]:
    """Waits until the latest checkpoint loads whole (or there is none); returns it.

    For a task that restores without taking part in the rendezvous (the
    evaluator) while the chief may still be moving a corrupt one aside. After
    `timeout` seconds it logs what is wrong and returns the latest anyway.
    """
    import tensorflow as tf

    deadline = time.monotonic() + timeout
    while True:
        latest = tf.train.latest_checkpoint(model_dir)
        found = problem(latest) if latest else None
        if found is None:
            return latest
        if time.monotonic() >= deadline:
            logging.warning(
                "estimator_dist: the latest checkpoint %s cannot be restored (%s) and the chief "
                "has not replaced it within %g s; start the chief, which moves it aside.",
                latest,
                found[1],
                timeout,
            )
            return latest
        time.sleep(_POLL_SECS)


def settle_for_task(cluster: ClusterConfig, model_dir: str, timeout: float) -> None:
    """This task's part before it restores: the chief settles, the evaluator waits.

    Other training tasks need nothing: they wait for the chief at the
    rendezvous, which the chief enters only once it has settled.

    Args:
      cluster: This task's cluster configuration.
      model_dir: The job's shared model_dir.
      timeout: Seconds the evaluator waits for a usable latest checkpoint.
    """
    if cluster.is_chief:
        settle(model_dir)
    elif cluster.task_type == EVALUATOR:
        wait_until_usable(model_dir, timeout)
