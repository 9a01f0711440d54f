"""`tf.estimator.RunConfig` from validated options (`run_config.options.RunConfigOptions`).

>>> options = RunConfigOptions(model_dir="/tmp/model", save_checkpoints_steps=50)
>>> make_run_config(options).save_checkpoints_steps
50
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.hardware import precision as precision_lib
from run_config.options import RunConfigOptions

_COLLECTIVE_STRATEGIES = (
    "CollectiveAllReduceStrategy",
    "CollectiveAllReduceStrategyV1",
    "MultiWorkerMirroredStrategy",
)

#: `save_checkpoints_secs` with collective strategies.
CHECKPOINT_SECS = (
    "{where}save_checkpoints_secs{value} cannot be used with {strategy}: workers reach a "
    "time boundary at different steps, and a checkpoint save that runs collective ops on "
    "some workers but not others can deadlock the job (TensorFlow warns 'Collective ops may "
    "deadlock' and silently switches to every 1000 steps). Fix: use save_checkpoints_steps "
    "(--save_checkpoints_steps) instead."
)


def make_session_config(
    options: RunConfigOptions, num_gpus: Optional[int] = None
) -> tf.compat.v1.ConfigProto:
    """Returns the session configuration for `options`' threads, precision and `num_gpus`.

    Every training and evaluation session of the Estimator is made with it,
    so `--mixed_precision`'s grappler rewrite (`estimator_dist.hardware.precision`) is on
    in all of them; TF_CONFIG, which the RunConfig reads too, says whether they
    are a cluster's.

    Args:
      options: The thread and precision settings.
      num_gpus: GPUs the sessions create (`StrategyConfig.num_gpus`; 0 runs
        on the CPU), or None for every visible GPU.

    Raises:
      UsageError: for a `--mixed_precision` this machine cannot compute in.

    >>> make_session_config(RunConfigOptions("/tmp/m"), num_gpus=0).device_count["GPU"]
    0
    """
    config = tf.compat.v1.ConfigProto(
        allow_soft_placement=True,
        intra_op_parallelism_threads=options.intra_op_threads,
        inter_op_parallelism_threads=options.inter_op_threads,
        device_count={} if num_gpus is None else {"GPU": num_gpus},
    )
    precision = precision_lib.resolve(options.precision.mixed_precision, num_gpus)
    cluster = tf.distribute.cluster_resolver.TFConfigClusterResolver().cluster_spec()
    return precision_lib.rewrite_session_config(precision, config, bool(cluster.as_dict()))


def make_run_config(
    options: RunConfigOptions,
    train_distribute: Optional[tf.distribute.Strategy] = None,
    eval_distribute: Optional[tf.distribute.Strategy] = None,
    num_gpus: Optional[int] = None,
) -> tf.estimator.RunConfig:
    """Builds a RunConfig.

    Reads TF_CONFIG from the environment, as `tf.estimator.RunConfig` always
    does: set it (normalised, see `estimator_dist.cluster.tf_config`) before calling.

    Args:
      options: Checkpoint, summary and thread settings.
      train_distribute: Strategy for training, or None.
      eval_distribute: Strategy for evaluation, or None.
      num_gpus: GPUs the sessions create (`StrategyConfig.num_gpus`), or None
        for every visible GPU.

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
        session_config=make_session_config(options, num_gpus),
        train_distribute=train_distribute,
        eval_distribute=eval_distribute,
    )
