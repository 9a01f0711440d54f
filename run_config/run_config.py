"""`tf.estimator.RunConfig` from validated options.

>>> options = RunConfigOptions(model_dir="/tmp/model", save_checkpoints_steps=50)
>>> make_run_config(options).save_checkpoints_steps
50
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.base.pitfalls import CHECKPOINT_SECS

_COLLECTIVE_STRATEGIES = (
    "CollectiveAllReduceStrategy",
    "CollectiveAllReduceStrategyV1",
    "MultiWorkerMirroredStrategy",
)


@dataclasses.dataclass(frozen=True)
class RunConfigOptions:
    """Everything in a RunConfig except the strategies.

    Attributes:
      model_dir: Where checkpoints, summaries and results go; shared by every
        task of a cluster.
      save_checkpoints_steps: Save a checkpoint every this many steps.
      save_checkpoints_secs: Save every this many seconds instead; refused with
        collective strategies. Give at most one of the two.
      keep_checkpoint_max: Checkpoints kept (older ones are deleted).
      save_summary_steps: Write summaries every this many steps.
      log_step_count_steps: Log loss and steps/s every this many steps.
      intra_op_threads: Threads inside one op; 0 lets TensorFlow choose.
      inter_op_threads: Ops run in parallel; 0 lets TensorFlow choose.
      tf_random_seed: Graph-level seed, so every task initialises alike.
      num_gpus: GPUs each task's sessions create (`--num_gpus`; 0 runs on
        the CPU); None creates every visible GPU. The strategies hide the
        others from TensorFlow's runtime too (`run_config.strategies`).
    """

    model_dir: str
    save_checkpoints_steps: Optional[int] = 100
    save_checkpoints_secs: Optional[int] = None
    keep_checkpoint_max: int = 5
    save_summary_steps: int = 100
    log_step_count_steps: int = 100
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    tf_random_seed: Optional[int] = 0
    num_gpus: Optional[int] = None

    def __post_init__(self) -> None:
        if not self.model_dir:
            raise UsageError(f"model_dir must be a non-empty path, received {self.model_dir!r}.")
        if self.save_checkpoints_steps is not None and self.save_checkpoints_secs is not None:
            raise UsageError(
                f"Give save_checkpoints_steps or save_checkpoints_secs, not both; received "
                f"{self.save_checkpoints_steps} steps and {self.save_checkpoints_secs} secs."
            )
        if self.save_checkpoints_steps is None and self.save_checkpoints_secs is None:
            raise UsageError(
                "Give save_checkpoints_steps (or save_checkpoints_secs without collective "
                "strategies); with neither, no checkpoint is written and the evaluator "
                "has nothing to evaluate."
            )
        for name in ("save_checkpoints_steps", "save_checkpoints_secs"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UsageError(f"{name} must be at least 1 or None, received {value}.")
        for name in ("keep_checkpoint_max", "save_summary_steps", "log_step_count_steps"):
            if getattr(self, name) < 1:
                raise UsageError(f"{name} must be at least 1, received {getattr(self, name)}.")
        if self.num_gpus is not None and self.num_gpus < 0:
            raise UsageError(
                f"num_gpus must be 0 (CPU) or more, or None (every visible GPU), received "
                f"{self.num_gpus}."
            )
        for name in ("intra_op_threads", "inter_op_threads"):
            value = getattr(self, name)
            if value < 0:
                raise UsageError(
                    f"{name} must be 0 (TensorFlow chooses) or more, received {value}."
                )


def make_session_config(options: RunConfigOptions) -> tf.compat.v1.ConfigProto:
    """Returns the session configuration for `options`' thread and GPU settings.

    >>> make_session_config(RunConfigOptions("/tmp/m", num_gpus=0)).device_count["GPU"]
    0
    """
    return tf.compat.v1.ConfigProto(
        allow_soft_placement=True,
        intra_op_parallelism_threads=options.intra_op_threads,
        inter_op_parallelism_threads=options.inter_op_threads,
        device_count={} if options.num_gpus is None else {"GPU": options.num_gpus},
    )


def make_run_config(
    options: RunConfigOptions,
    train_distribute: Optional[tf.distribute.Strategy] = None,
    eval_distribute: Optional[tf.distribute.Strategy] = None,
) -> tf.estimator.RunConfig:
    """Builds a RunConfig.

    Reads TF_CONFIG from the environment, as `tf.estimator.RunConfig` always
    does: set it (normalised, see `estimator_dist.base.cluster`) before calling.

    Args:
      options: Checkpoint, summary and thread settings.
      train_distribute: Strategy for training, or None.
      eval_distribute: Strategy for evaluation, or None.

    Returns:
      The RunConfig.

    Raises:
      UsageError: if a time-based checkpoint interval is combined with a
        collective strategy.
    """
    strategy_class = type(train_distribute).__name__
    if options.save_checkpoints_secs is not None and strategy_class in _COLLECTIVE_STRATEGIES:
        raise UsageError(
            CHECKPOINT_SECS.format(
                where="", value=f"={options.save_checkpoints_secs}", strategy=strategy_class
            )
        )
    return tf.estimator.RunConfig(
        model_dir=options.model_dir,
        tf_random_seed=options.tf_random_seed,
        save_summary_steps=options.save_summary_steps,
        save_checkpoints_steps=options.save_checkpoints_steps,
        save_checkpoints_secs=options.save_checkpoints_secs,
        keep_checkpoint_max=options.keep_checkpoint_max,
        log_step_count_steps=options.log_step_count_steps,
        session_config=make_session_config(options),
        train_distribute=train_distribute,
        eval_distribute=eval_distribute,
    )
