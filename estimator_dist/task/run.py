"""One task's run: what every kind of job does around TensorFlow's `train_and_evaluate`.

A task is started in several ways: `estimator_dist.train` with named functions
(`estimator_dist.task.driver`), a whole program whose `train_and_evaluate`
call is intercepted (`estimator_dist.programs`), a program's `train()`
segments, a Ray actor, a pod. Each obtains an estimator and its specs its own
way; `TaskRun.train_and_evaluate` does the rest, the same for all:

1. the preemption channel (SIGTERM/SIGINT stop every task at one step);
2. once per process, the chief settles the checkpoints and every task meets the
   others at the rendezvous, where the training tasks exchange how many
   batches their inputs yield;
3. the last step: `max_steps` as TensorFlow reads it (a float rounds up), or
   where the shortest training input ends (`estimator_dist.task.last_step`);
4. the chief's run record;
5. the guards: the watchdog, the program's early stopping and stop requests
   turned into one agreed stop, the progress line, the heartbeat;
6. TensorFlow's `train_and_evaluate`, each failure turned into its exit code;
7. where training ended, and in one process the final evaluation printed.

Nothing the program set is replaced: its input functions reach TensorFlow
looking as its own (`user_code.present_input_fn`), its hooks and exporters
stay, the package's are added after them, and on a single process its
`max_steps` is handed to TensorFlow as it was given.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import time
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import tensorflow as tf
from absl import logging

from estimator_dist.base import files
from estimator_dist.base.errors import DataError, Error
from estimator_dist.cluster.tf_config import CHIEF, EVALUATOR, WORKER, ClusterConfig
from estimator_dist.config.guards import GuardConfig
from estimator_dist.guards.checkpoints import settle_for_task
from estimator_dist.guards.evaluator_watchdog import EvaluatorWatchdog
from estimator_dist.guards.heartbeat import Heartbeat, start_heartbeat
from estimator_dist.guards.preemption import EARLY_STOP, Preemption, StoppedEarly
from estimator_dist.guards.rendezvous import exchange
from estimator_dist.guards.roles import ProgressHook, start_preemption, start_watchdog
from estimator_dist.guards.startup import Startup
from estimator_dist.guards.stop_requests import ShortestInputHook, StopRouter
from estimator_dist.guards.watchdog import LastStep, Watchdog
from estimator_dist.report import console, status
from estimator_dist.task import diagnose, early_stopping, last_step, records
from estimator_dist.task.user_code import present_input_fn
from estimator_dist.tf_runtime import estimators, patches
from input_fns import bad_data

#: Steps between two progress events of an estimator whose RunConfig logs no step count.
DEFAULT_PROGRESS_STEPS = 100
#: Seconds between two looks for the other tasks' counts.
_POLL_SECS = 0.2

_AnyWatchdog = Optional[Union[Watchdog, EvaluatorWatchdog]]


def steps_of(max_steps: Optional[float]) -> Optional[int]:
    """The last global step TensorFlow trains to for `TrainSpec.max_steps`.

    TensorFlow accepts any positive number: its `StopAtStepHook` stops at the
    first global step at or past it, so a float rounds up.

    >>> steps_of(1578.125), steps_of(400), steps_of(None)
    (1579, 400, None)
    """
    return None if max_steps is None else int(math.ceil(max_steps))


@dataclasses.dataclass(frozen=True)
class Call:
    """What a kind of job says about one of its `train_and_evaluate` calls.

    Attributes:
      view: What every task of the cluster must agree on, for the rendezvous.
      record: Makes the chief's `run_record.json` from the last-step decision
        (None when none was made); None writes no record.
      name_last_step: How messages name the last step to the user who set it:
        given the step and how it was found (`last_step.MAX_STEPS`, ...).
      fix: How to make a training input that ran out last.
      examples_per_step: Examples a global step trains on, for the progress
        line; None when unknown: progress events only, the program logging
        its own lines.
      count_inputs: Whether the training tasks count their inputs to find
        where the shortest ends (False: the last step is `max_steps`).
      explain: Turns an exception the user's code raised while training into
        the one the task raises, given the last step seen.
      hooks: More training hooks of the job (a trace).
      batches: On a cluster, the steps of its own loop each training task runs at
        most: a `train()` segment that ends where the shortest input ends
        (`stop_requests.ShortestInputHook`); None: the last step alone ends it.
      named_model_dir: The model_dir as every task names it, where it differs from
        the estimator's (a task working in a local directory synchronised with a
        storage URL): the heartbeat identifies the job by it.
    """

    view: Mapping[str, Any]
    record: Optional[Callable[[Optional[dict]], dict]]
    name_last_step: Callable[[int, str], str]
    fix: str
    examples_per_step: Optional[int] = None
    count_inputs: bool = True
    explain: Callable[[BaseException, Optional[int]], BaseException] = lambda error, step: error
    hooks: Sequence[tf.compat.v1.train.SessionRunHook] = ()
    batches: Optional[int] = None
    named_model_dir: Optional[str] = None


class TaskRun:
    """One task of a job: the guards and records around each `train_and_evaluate` call.

    Args:
      cluster: This task's normalised cluster configuration.
      guards: Its time bounds and preemption settings.
      startup: Records the task's start-up phases.
      train_and_evaluate: TensorFlow's own function (a program's task passes
        the one it saved before intercepting it); by default
        `tf.estimator.train_and_evaluate` as it is when the run is made.

    Attributes:
      calls: The `train_and_evaluate` calls this task ran.
      final_metrics: The final evaluation's metrics, in one process and on the
        evaluator, once known.
      stopped_at: The step the last call stopped at before its last step on
        purpose (early stopping, a hook of the program), or None.
    """

    def __init__(
        self,
        cluster: ClusterConfig,
        guards: GuardConfig,
        startup: Startup,
        train_and_evaluate: Optional[Callable] = None,
    ) -> None:
        self._cluster = cluster
        self._guards = guards
        self._startup = startup
        self._train_and_evaluate = train_and_evaluate or tf.estimator.train_and_evaluate
        self._joined = False
        self._attempt: Optional[str] = None
        self._heartbeat: Optional[Heartbeat] = None
        self._exchanges = 0
        self.calls = 0
        self.final_metrics: Optional[dict] = None
        self.stopped_at: Optional[int] = None

    @property
    def cluster(self) -> ClusterConfig:
        return self._cluster

    @property
    def guards(self) -> GuardConfig:
        return self._guards

    @property
    def tensorflow_train_and_evaluate(self) -> Callable:
        """TensorFlow's own `train_and_evaluate`, which the run calls."""
        return self._train_and_evaluate

    @property
    def attempt(self) -> Optional[str]:
        """The id the chief gave this attempt at the rendezvous (None before, or alone)."""
        return self._attempt

    @property
    def joined(self) -> bool:
        """Whether this task met the others (once per process)."""
        return self._joined

    def join(self, model_dir: str, view: Mapping[str, Any], count: Any = None) -> Dict[str, Any]:
        """Meets the other tasks once per process, before TensorFlow starts its servers.

        The chief settles the checkpoints before it answers; the evaluator waits
        for a usable one. Later calls do nothing: the first call's servers hold
        the ports.

        Returns:
          Every training task's `count` by role (`guards.rendezvous.exchange`);
          empty after the first call.
        """
        if self._joined:
            return {}
        with diagnose.refused_writes(model_dir):
            settle_for_task(self._cluster, model_dir, self._guards.startup_timeout)
        full = {**view, "tensorflow": tf.__version__}
        self._attempt, values = exchange(self._cluster, full, self._guards.startup_timeout, count)
        self._joined = True
        self._startup.mark("rendezvous")
        return values

    def train_and_evaluate(
        self,
        estimator: tf.estimator.Estimator,
        train_spec: tf.estimator.TrainSpec,
        eval_spec: tf.estimator.EvalSpec,
        call: Call,
    ) -> Any:
        """Runs TensorFlow's `train_and_evaluate` as this task of the job.

        Returns:
          What TensorFlow returned: `(metrics, exports)` in one process, None on
          a task of a cluster.

        Raises:
          Error: a failure with an exit code of its own (a usage error, a lost
            peer, bad data, an unwritable model_dir, ...).
          tf.errors.OpError: a TensorFlow error nothing explains.
          Exception: what `call.explain` makes of an error of the user's code.
        """
        self.calls += 1
        self.stopped_at = None
        cluster, guards = self._cluster, self._guards
        model_dir = estimator.model_dir
        with diagnose.refused_writes(model_dir):
            tf.io.gfile.makedirs(model_dir)
            if self.calls == 1:
                console.keep_log(model_dir, cluster.role)
            preemption = start_preemption(
                cluster, model_dir, guards.preemption_checkpoint, guards.preemption_grace_secs
            )
        try:
            last, how = self._last_step(estimator, train_spec, model_dir, call)
            preemption.joined(self._attempt)
            result = self._run(estimator, train_spec, eval_spec, call, last, how, preemption)
        finally:
            preemption.uninstall()
        return result

    def _last_step(
        self,
        estimator: tf.estimator.Estimator,
        train_spec: tf.estimator.TrainSpec,
        model_dir: str,
        call: Call,
    ) -> Tuple[Optional[int], str]:
        """Meets the cluster, decides the last step, tells the launcher, writes the record."""
        cluster = self._cluster
        max_steps = steps_of(train_spec.max_steps)
        if cluster.is_distributed and cluster.is_chief:
            last_step.remove_decision(model_dir)  # An earlier attempt's.
        count = None
        if call.count_inputs:
            count = last_step.count_for_task(
                cluster, estimator, train_spec.input_fn, max_steps, self._guards.startup_timeout
            )
        if self._joined:
            counts = self._exchange_later(model_dir, count) if count is not None else {}
        else:
            counts = self.join(model_dir, call.view, count)
        last, decision = last_step.decide_for_task(
            cluster, model_dir, counts, max_steps, self._guards.startup_timeout, self._attempt
        )
        known = decision or last_step.read_decision(model_dir) or {}
        how = known.get("how") or last_step.MAX_STEPS
        if last is not None:
            # As the launcher reads it: the URL of a job on storage, not this task's copy; else
            # the estimator's own directory (a program's may be below the job's).
            named = call.named_model_dir
            where = named if named is not None and "://" in named else model_dir
            stop = status.StopStep(step=last, how=last_step.stop_how(how), model_dir=where)
            status.emit(stop)
        if cluster.is_chief and call.record is not None:
            with diagnose.refused_writes(model_dir):
                record = {**call.record(decision), "last_step": decision}
                files.write_json(os.path.join(model_dir, files.RUN_RECORD_FILE), record)
        return last, how

    def exchange_counts(
        self, estimator: tf.estimator.Estimator, input_fn: Callable, max_steps: Optional[int]
    ) -> Dict[str, Any]:
        """Counts this task's training input and reads every training task's count, by role.

        After the rendezvous (a program's `train()` segment whose end the
        inputs decide); `last_step.count_for_task`'s dict, with `start`.
        """
        count = last_step.count_for_task(
            self._cluster, estimator, input_fn, max_steps, self._guards.startup_timeout
        )
        return self._exchange_later(estimator.model_dir, count)

    def _exchange_later(self, model_dir: str, count: Mapping[str, Any]) -> Dict[str, Any]:
        """Every training task's count for a call after the first, through model_dir.

        The rendezvous carried the first call's counts; a program that trains
        again (another estimator, a `train_and_evaluate` after a loop) leaves
        each task's count beside the others', and every task reads them all,
        within the start-up timeout.
        """
        cluster = self._cluster
        self._exchanges += 1
        directory = os.path.join(model_dir, files.EXCHANGE_DIR, str(self._attempt))
        tf.io.gfile.makedirs(directory)
        name = f"count-{self._exchanges}-{{role}}.json"
        files.write_json(os.path.join(directory, name.format(role=cluster.role)), count)
        roles = [f"{CHIEF}-0"] + [f"{WORKER}-{i}" for i in range(cluster.num_workers - 1)]
        deadline = time.monotonic() + self._guards.startup_timeout
        counts: Dict[str, Any] = {}
        while len(counts) < len(roles):
            for role in roles:
                if role not in counts:
                    found = files.read_json(os.path.join(directory, name.format(role=role)))
                    if found is not None:
                        counts[role] = found
            if len(counts) < len(roles):
                if time.monotonic() > deadline:
                    from estimator_dist.base.errors import ClusterTimeoutError

                    missing = ", ".join(sorted(set(roles) - set(counts)))
                    raise ClusterTimeoutError(
                        f"task {cluster.role} waited for the input counts of {missing} "
                        f"({directory}) until the --startup_timeout of "
                        f"{self._guards.startup_timeout:g} s ran out: they are stuck or gone. "
                        "The job restarts from the latest checkpoint."
                    )
                time.sleep(_POLL_SECS)
        return counts

    def _run(
        self,
        estimator: tf.estimator.Estimator,
        train_spec: tf.estimator.TrainSpec,
        eval_spec: tf.estimator.EvalSpec,
        call: Call,
        last: Optional[int],
        how: str,
        preemption: Preemption,
    ) -> Any:
        cluster, guards = self._cluster, self._guards
        model_dir = estimator.model_dir
        router = StopRouter(cluster.is_distributed, preemption)
        shortest = None
        if call.batches is not None and cluster.is_distributed:
            shortest = ShortestInputHook(call.batches)
            call = dataclasses.replace(call, hooks=(*call.hooks, shortest))

        def stopped_on_purpose() -> bool:
            return (
                preemption.requested
                or preemption.stop_at is not None
                or router.stopped_by is not None
                or (shortest is not None and shortest.reached)
            )

        named = None if last is None else LastStep(last, call.name_last_step(last, how), call.fix)
        watchdog = start_watchdog(
            cluster,
            model_dir,
            named,
            guards.startup_timeout,
            guards.stall_timeout,
            stopped_on_purpose,
        )
        exporter = records.MetricsExporter(model_dir)
        train_spec, eval_spec = self._specs(
            estimator, train_spec, eval_spec, call, last, exporter, watchdog, preemption, router
        )
        self._heartbeat = start_heartbeat(
            cluster,
            call.named_model_dir or model_dir,
            self._attempt,
            guards.heartbeat_timeout,
            preemption,
            self._heartbeat,
        )
        if self._heartbeat is not None:
            train_spec = train_spec._replace(hooks=(*train_spec.hooks, self._heartbeat.hook()))
        strategy = estimators.run_config(estimator).train_distribute
        if strategy is not None and cluster.is_distributed:
            patches.fresh_collective_keys(strategy, self.calls - 1)
        started = time.monotonic()
        patches.route_stop_requests(router)
        try:
            # A program running eagerly (TensorFlow 2's default) keeps doing so; Estimator
            # trains in graphs of its own, and its distribute coordinator, which configures
            # the strategy and starts the task's server, needs graph mode around it.
            with tf.Graph().as_default() if tf.executing_eagerly() else contextlib.nullcontext():
                result = self._train_and_evaluate(estimator, train_spec, eval_spec)
        except StoppedEarly as stopped:
            logging.info("estimator_dist: the evaluator ends: it %s.", stopped)
            result = None
        except tf.errors.OpError as error:
            step = getattr(watchdog, "step", None)
            explained = diagnose.explain_training_error(
                error, step, time.monotonic() - started, model_dir
            )
            if preemption.requested:
                logging.warning(
                    "Training failed while stopping for a preemption: %s",
                    diagnose.error_summary(error),
                )
                preemption.finished(failed=True)
            if explained is None:
                raise
            raise explained from (error if isinstance(explained, DataError) else None)
        except (Error, KeyboardInterrupt, SystemExit):
            raise
        except Exception as error:  # The user's model_fn, input_fn or hooks raised.
            step = getattr(watchdog, "step", None)
            known = diagnose.explain_storage_error(error, model_dir, step)
            known = known or diagnose.explain_checkpoint_gone(error)
            if known is not None:
                raise known from None
            raise call.explain(error, step) from None
        finally:
            patches.route_stop_requests(None)
            if watchdog is not None:
                watchdog.stop()
            skipped = bad_data.summary()
            if skipped:
                logging.warning("%s", skipped)
        preemption.finished()
        self._finish(estimator, exporter, result, preemption, router, last, shortest)
        logging.info("Training finished in %.1f s.", time.monotonic() - started)
        return result

    def _specs(
        self,
        estimator: tf.estimator.Estimator,
        train_spec: tf.estimator.TrainSpec,
        eval_spec: tf.estimator.EvalSpec,
        call: Call,
        last: Optional[int],
        exporter: records.MetricsExporter,
        watchdog: _AnyWatchdog,
        preemption: Preemption,
        router: StopRouter,
    ) -> Tuple[tf.estimator.TrainSpec, tf.estimator.EvalSpec]:
        """The specs with this task's hooks and exporters after the program's own."""
        cluster = self._cluster
        own = early_stopping.agreed(
            list(train_spec.hooks), preemption, cluster, self._guards.preemption_checkpoint
        )
        hooks = [*own, *call.hooks, router.hook(), self._startup.hook(), *preemption.hooks()]
        if isinstance(watchdog, Watchdog):
            hooks.append(watchdog.hook())
        if cluster.task_type in (None, CHIEF, WORKER):
            every = estimators.run_config(estimator).log_step_count_steps or DEFAULT_PROGRESS_STEPS
            quiet = call.examples_per_step is None
            hooks.append(ProgressHook(last, call.examples_per_step, max(1, every), quiet=quiet))
        eval_hooks = list(eval_spec.hooks)
        if watchdog is not None:
            eval_hooks.append(watchdog.eval_hook())
        # One process keeps the program's max_steps as it gave it; a cluster trains to the
        # step every task agreed on.
        max_steps = train_spec.max_steps if not cluster.is_distributed else last
        train = tf.estimator.TrainSpec(
            present_input_fn(train_spec.input_fn),
            max_steps=max_steps,
            hooks=hooks,
            saving_listeners=train_spec.saving_listeners,
        )
        evaluation = tf.estimator.EvalSpec(
            present_input_fn(eval_spec.input_fn),
            steps=eval_spec.steps,
            name=eval_spec.name,
            hooks=eval_hooks,
            exporters=[
                *eval_spec.exporters,
                exporter,
                early_stopping.FinalEvaluationExporter(estimator.model_dir),
            ],
            start_delay_secs=eval_spec.start_delay_secs,
            throttle_secs=eval_spec.throttle_secs,
        )
        return train, evaluation

    def _finish(
        self,
        estimator: tf.estimator.Estimator,
        exporter: records.MetricsExporter,
        result: Any,
        preemption: Preemption,
        router: StopRouter,
        last: Optional[int],
        shortest: Optional[ShortestInputHook],
    ) -> None:
        """Where training ended and why; in one process the final evaluation, printed."""
        cluster, model_dir = self._cluster, estimator.model_dir
        if not cluster.is_distributed:
            last_step.finish_alone(estimator, exporter, result, model_dir, last)
        if early_stopping.stopped_early(preemption):
            self.stopped_at = early_stopping.record_stop(model_dir, preemption, cluster)
        elif router.stopped_by is not None and cluster.task_type != EVALUATOR:
            ended = preemption.ended_at
            if ended is None:
                ended = files.checkpoint_step(model_dir)
            if last is None or ended < last:
                reason = f"{EARLY_STOP}: the program's {router.stopped_by} stopped training"
                self.stopped_at = early_stopping.record_stop_at(model_dir, ended, reason, cluster)
        elif shortest is not None and shortest.ended_at is not None:
            # The tasks ran the shortest input's batches; a train_op that never steps the
            # global step leaves it short of the segment's last step, as in one process.
            if last is None or shortest.ended_at < last:
                self.stopped_at = last_step.record_input_end(
                    model_dir, shortest.ended_at, shortest.batches, cluster
                )
        if cluster.task_type in (None, EVALUATOR):
            self.final_metrics = exporter.final_metrics or files.read_final_metrics(model_dir)
            if self.final_metrics is not None:
                print(f"Final evaluation: {files.format_metrics(self.final_metrics)}", flush=True)
