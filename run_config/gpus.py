"""The GPUs of each task (`--num_gpus`), and the local devices its strategy mirrors over.

`--num_gpus` counts GPUs per worker, as in TF Model Garden. Every task uses
that many of the GPUs it sees, the first ones, and TensorFlow's runtime is
made to see only those (`use_gpus`): 0 hides them all and trains on the CPU.
What follows for the strategy (`run_config.options.plan_strategy`):

* `multi_worker_mirrored` on a cluster: each worker mirrors the model over
  its own GPUs and all-reduces across workers (NCCL between the GPUs of a
  host with NCCL or AUTO collectives, RING otherwise);
* `multi_worker_mirrored` in one process without TF_CONFIG with 2 or more
  GPUs: `mirrored`, MirroredStrategy over those GPUs, what Model Garden
  builds for one machine;
* `mirrored`: over `/gpu:0` to `/gpu:N-1`, or `/cpu:0` with 0;
* `one_device`: `/gpu:0`, or `/cpu:0` with 0; `off` and `one_device` train
  on one device and refuse 2 or more, as Model Garden does.

Without `--num_gpus` nothing is hidden and every strategy uses what it sees.

>>> check_gpus(None, visible=2), check_gpus(1, visible=2)
(2, 1)
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from estimator_dist.base.errors import UsageError

#: Why hiding GPUs failed: TensorFlow's runtime already started with them.
TOO_LATE_MESSAGE = (
    "--num_gpus={count} could not hide the other GPUs: TensorFlow's runtime was already "
    "started in this process ({error}). Set CUDA_VISIBLE_DEVICES to the first {count} GPU(s) "
    "in the task's environment instead."
)


def check_gpus(requested: Optional[int], visible: int) -> int:
    """The GPUs this task trains on: `requested`, or every visible one when None.

    Raises:
      UsageError: if more GPUs are requested than this task sees, naming both.

    >>> check_gpus(None, 2), check_gpus(0, 2)
    (2, 0)
    """
    if requested is None:
        return visible
    if requested > visible:
        raise UsageError(
            f"--num_gpus={requested} asks for {requested} GPU(s) on each worker, but this task "
            f"sees {visible} (CUDA_VISIBLE_DEVICES and the installed CUDA libraries decide "
            f"which). Pass --num_gpus={visible} (0 trains on the CPU), or run each task on a "
            f"machine with {requested} GPUs."
        )
    return requested


def use_gpus(count: int) -> None:
    """Makes TensorFlow's runtime see only the first `count` GPUs; call it before any strategy.

    Raises:
      UsageError: if the runtime has already started with other GPUs.
    """
    physical = tf.config.list_physical_devices("GPU")
    try:
        tf.config.set_visible_devices(physical[:count], "GPU")
    except RuntimeError as error:
        raise UsageError(TOO_LATE_MESSAGE.format(count=count, error=error)) from None
