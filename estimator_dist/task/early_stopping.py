"""Early stopping that stops every task at one checkpointed step.

`tf.estimator.experimental.stop_if_no_decrease_hook` and its siblings build,
through `make_early_stopping_hook`, a hook that only fits one process: on
the chief `_StopOnPredicateHook` ends the chief's own session when its
predicate (a metric in the evaluator's event files) says so, and the workers'
`_CheckForStoppingHook` reads a variable the chief sets on its own replica
only. Under MultiWorkerMirroredStrategy the chief leaves and the workers wait
in their collectives forever. (With a strategy already in the RunConfig,
TensorFlow 2.15 builds `_MultiWorkerEarlyStoppingHook` instead, and refuses
its default `run_every_secs`.)

`agreed` replaces these hooks: on the chief an `AgreedStopHook` asks the same
predicate at the same interval, and when it says stop, asks for a stop through
the preemption channel (`estimator_dist.guards.preemption`): the chief picks a step
a little ahead, every task stops after it, the chief checkpoints it, and all
go on with exit 0. The other tasks' early-stopping hooks are dropped: the
preemption hook stops them.

>>> from estimator_dist.cluster.tf_config import ClusterConfig
>>> hooks = [tf.estimator.StopAtStepHook(last_step=10)]
>>> agreed(hooks, None, ClusterConfig(), channel=True) == hooks  # no early stopping: as given
True
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable, List, Optional

import tensorflow as tf
from absl import logging

from estimator_dist.base.errors import UsageError
from estimator_dist.guards import preemption
from estimator_dist.guards.preemption import EARLY_STOP, Preemption, StoppedEarly
from estimator_dist.tf_runtime.hooks import (
    decides_early_stop,
    early_stop_predicate,
    is_early_stopping,
)


def describe(should_stop: Callable[[], bool]) -> str:
    """What an early-stopping predicate waits for, in words, for logs and the run record.

    TensorFlow's own predicates say it in their closures; any other is named.
    """
    try:
        seen = inspect.getclosurevars(should_stop).nonlocals
    except TypeError:  # Not a Python function.
        seen = {}
    if "threshold" in seen:
        return f"{seen['metric_name']} {seen['greater_or_lesser']} {seen['threshold']:g}"
    if "max_steps_without_improvement" in seen:
        return (
            f"no {seen['increase_or_decrease']} of {seen['metric_name']} in "
            f"{seen['max_steps_without_improvement']} steps"
        )
    return getattr(should_stop, "__qualname__", repr(should_stop)).replace(".<locals>", "")


class AgreedStopHook(tf.compat.v1.train.SessionRunHook):
    """Asks `should_stop` at the early-stopping hook's interval; stops the job through `preemption`.

    Args:
      should_stop: The predicate of the replaced hook.
      timer: Its `SecondOrStepTimer`.
      preemption: The task's preemption channel, whose chief decides the stop step.
      alone: One process: stop after this step, as Estimator's hook does, and
        only record the reason on `preemption`.
    """

    def __init__(
        self,
        should_stop: Callable[[], bool],
        timer: Any,
        preemption: Preemption,
        alone: bool = False,
    ) -> None:
        self._should_stop = should_stop
        self._timer = timer
        self._preemption = preemption
        self._alone = alone
        self._global_step: Optional[tf.Tensor] = None
        self.requested_at: Optional[int] = None

    def begin(self) -> None:
        self._global_step = tf.compat.v1.train.get_global_step()

    def before_run(self, run_context: Any) -> Any:
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        step = int(run_values.results)
        if self.requested_at is not None or not self._timer.should_trigger_for_step(step):
            return
        self._timer.update_last_triggered_step(step)
        if self._should_stop():
            self.requested_at = step
            reason = describe(self._should_stop)
            if self._alone:  # One process stops where Estimator's own hook would.
                self._preemption.reason = f"{EARLY_STOP}: {reason}"
                run_context.request_stop()
                return
            logging.info(
                "estimator_dist: %s asks to stop at global step %d; every task stops at one "
                "step a little ahead, which the chief checkpoints.",
                reason,
                step,
            )
            self._preemption.request_stop(step, reason)


def agreed(hooks: List[Any], preemption: Preemption, cluster: Any, channel: bool) -> List[Any]:
    """`hooks` with TensorFlow's early-stopping hooks replaced by ones every task follows.

    Args:
      hooks: A TrainSpec's hooks.
      preemption: The task's preemption channel.
      cluster: The task's `ClusterConfig`: on a cluster the chief decides and
        the other tasks drop the hooks; one process stops where Estimator would.
      channel: Whether the preemption channel runs (not `--nopreemption_checkpoint`).

    Returns:
      The hooks to train with.

    Raises:
      UsageError: early stopping on a cluster with the channel off: the chief
        alone would stop, and the other tasks would wait for it forever.
    """
    if not any(is_early_stopping(hook) for hook in hooks):
        return list(hooks)
    if cluster.is_distributed and not channel:
        raise UsageError(
            "the training hooks include an early-stopping hook, which on a cluster needs the "
            "channel that stops every task at one step, and --nopreemption_checkpoint turned it "
            "off: the chief alone would stop and the other tasks would wait forever. Drop "
            "--nopreemption_checkpoint."
        )
    replaced = []
    for hook in hooks:
        if not is_early_stopping(hook):
            replaced.append(hook)
        elif cluster.is_chief and decides_early_stop(hook):
            alone = not cluster.is_distributed
            should_stop, timer = early_stop_predicate(hook)
            replaced.append(AgreedStopHook(should_stop, timer, preemption, alone))
    return replaced


def stopped_early(preemption: Preemption) -> bool:
    """Whether early stopping (not a signal) ended this task's training."""
    reason = preemption.reason or ""
    return reason.startswith(EARLY_STOP) and not preemption.requested


class FinalEvaluationExporter(tf.estimator.Exporter):
    """On the evaluator: ends its loop once it evaluated the step early stopping chose.

    TensorFlow's evaluator waits for a checkpoint at `max_steps`, which never
    comes after an early stop. The chief writes the step it stopped at to
    `model_dir/last_step.json`; after each evaluation this exporter (the last
    of the EvalSpec's) marks `eval_metrics.json` final and raises
    `StoppedEarly` once the evaluated step reaches it.
    """

    def __init__(self, model_dir: str) -> None:
        self._model_dir = model_dir

    @property
    def name(self) -> str:
        return "final_after_early_stop"

    def export(
        self,
        estimator: Any,
        export_path: str,
        checkpoint_path: str,
        eval_result: Any,
        is_the_final_export: bool,
    ) -> str:
        """Ends the evaluator's loop (`StoppedEarly`) once it evaluated the step stopped at."""
        from estimator_dist.base import files

        stop = None if is_the_final_export else preemption.decided_stop(self._model_dir)
        if stop is None or int(eval_result["global_step"]) < stop:
            return ""
        files.mark_final_metrics(self._model_dir)
        raise StoppedEarly(
            f"evaluated global step {eval_result['global_step']}, where early stopping ended "
            "training"
        )


def record_stop(model_dir: str, preemption: Preemption, cluster: Any) -> int:
    """After an early stop, says where training ended; the chief records it.

    Each task tells the launcher the step (`status.StopStep`, which it takes
    as the last step); the chief writes it, with the reason, into `model_dir/last_step.json`
    (which the evaluator takes as the last step) and `run_record.json`
    (`"stopped_early"`).

    Returns:
      The global step training ended at.
    """
    from estimator_dist.base import files

    # Training may have reached its last step before the step early stopping chose.
    ended = preemption.ended_at
    if ended is None:  # One process without the preemption hook: the chief's own checkpoint.
        ended = files.checkpoint_step(model_dir)
    step = min(ended, preemption.stop_at or ended)
    return record_stop_at(model_dir, step, preemption.reason, cluster)


def record_stop_at(model_dir: str, step: int, reason: str, cluster: Any) -> int:
    """Says that training ended at `step` before its last step, for `reason`; the chief records it.

    `reason` starts with `EARLY_STOP`, which the evaluator reads as "the last
    step is this one" (`preemption.decided_stop`).

    Returns:
      `step`.
    """
    from estimator_dist.base import files
    from estimator_dist.report import status
    from estimator_dist.task import last_step

    logging.info("estimator_dist: training ended at global step %d: %s.", step, reason)
    status.emit(status.StopStep(step=step, how=status.EARLY_STOPPING))
    if not cluster.is_chief:
        return step
    decision = last_step.read_decision(model_dir) or {}
    last_step.write_decision(model_dir, {**decision, "last_step": step, "how": reason})
    path = os.path.join(model_dir, files.RUN_RECORD_FILE)
    record = files.read_json(path) or {}
    files.write_json(path, {**record, "stopped_early": {"step": step, "reason": reason}})
    return step
