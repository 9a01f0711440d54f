"""The files a job keeps in model_dir besides checkpoints: names, JSON, a lock, steps.

Every task and the launcher read and write them through here: `run_record.json`
(the chief, before training), `eval_metrics.json` (after each evaluation),
`last_step.json` (the step a script trains to, decided from its inputs). Files are
written atomically, so a reader never sees half of one; remote model_dirs go
through `tf.io.gfile`, imported when a file is first read or written, so that
the launcher and `manifest` start without TensorFlow.

>>> format_metrics({"global_step": 400, "accuracy": 0.9625, "loss": 0.12})
'global_step=400, accuracy=0.9625, loss=0.1200'
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from typing import Any, Iterator, Mapping, Optional

#: Written by the evaluator (or a single process) after each evaluation.
METRICS_FILE = "eval_metrics.json"

#: Written by the chief (or a single process) before training starts.
RUN_RECORD_FILE = "run_record.json"

#: Written by the training tasks once a script's last step is decided from its inputs.
LAST_STEP_FILE = "last_step.json"

#: Directory of model_dir where, after the rendezvous, each task leaves what the others must
#: read (a later call's input count; a program's loop its results), under the attempt's id.
EXCHANGE_DIR = "loop"


def json_numbers(metrics: Mapping[str, Any]) -> dict:
    """An evaluation's dict with numpy numbers as Python numbers, for JSON."""
    return {key: _to_json_number(value) for key, value in metrics.items()}


def _to_json_number(value: Any) -> Any:
    try:
        return value.item()
    except AttributeError:
        return value


def write_json(path: str, data: Mapping[str, Any]) -> None:
    """Writes `data` as JSON to `path` atomically (a temporary file, then a rename)."""
    import tensorflow as tf

    temporary = f"{path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(temporary, "w") as stream:
        stream.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tf.io.gfile.rename(temporary, path, overwrite=True)


@contextlib.contextmanager
def model_dir_lock(model_dir: str, name: str) -> Iterator[None]:
    """Serialises one step across the tasks sharing a local model_dir.

    Args:
      model_dir: The shared directory; a remote one (`gs://...`) is not locked.
      name: Names the lock file, `model_dir/.<name>.lock`.
    """
    if "://" in model_dir:
        yield
        return
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, f".{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def read_json(path: str) -> Optional[dict]:
    """The JSON object at `path`, or None when there is none (yet) or it is not JSON."""
    import tensorflow as tf

    try:
        with tf.io.gfile.GFile(path) as stream:
            return json.loads(stream.read())
    except (tf.errors.NotFoundError, ValueError):
        return None


def checkpoint_step(model_dir: str) -> int:
    """Returns the global step of the latest checkpoint in `model_dir`, or 0 if none."""
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(model_dir)
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def latest_known_step(step: Optional[int], model_dir: Optional[str]) -> Optional[int]:
    """The latest global step known: `step` (the last this task saw) or the latest checkpoint's.

    A failure message names the step the job is at, never one older than its
    checkpoint: a task that restored step 300 and then saw no step must not
    say "step 0". Reading model_dir is one small file (`checkpoint`); when it
    cannot be read, `step` stands.

    >>> latest_known_step(40, None), latest_known_step(None, None)
    (40, None)
    """
    if model_dir is None:
        return step
    import tensorflow as tf

    try:
        saved = checkpoint_step(model_dir)
    except (tf.errors.OpError, OSError, ValueError):  # A failure's message must not fail.
        return step
    return max(step or 0, saved) if (step is not None or saved) else step


def mark_final_metrics(model_dir: str) -> Optional[dict]:
    """Marks the latest evaluation in `model_dir/eval_metrics.json` final; returns its metrics.

    For a job whose last step was decided after TensorFlow's evaluator could
    know it (early stopping, a train()/evaluate() program). None when there is none.
    """
    path = os.path.join(model_dir, METRICS_FILE)
    record = read_json(path)
    if record is None:
        return None
    write_json(path, {**record, "final": True})
    return record["metrics"]


def read_final_metrics(model_dir: str) -> Optional[dict]:
    """Returns the final evaluation metrics written to `model_dir`, or None."""
    import tensorflow as tf

    path = os.path.join(model_dir, METRICS_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as stream:
        record = json.load(stream)
    return record["metrics"] if record.get("final") else None


def format_metrics(metrics: Mapping[str, Any]) -> str:
    """Returns `metrics` as one line, global step first."""
    step = metrics.get("global_step")
    rest = ", ".join(
        f"{key}={value:.4f}" if isinstance(value, float) else f"{key}={value}"
        for key, value in sorted(metrics.items())
        if key != "global_step"
    )
    return f"global_step={step}, {rest}"
