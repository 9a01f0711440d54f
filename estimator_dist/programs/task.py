"""The wrappers around a legacy script's `tf.estimator.train_and_evaluate` call.

While the script runs, `ScriptTask.installed()` replaces
`tf.estimator.train_and_evaluate` (and its `tf.compat.v1.estimator` alias)
and guards `Estimator.train`/`evaluate`. The wrapper checks the call, gives
the estimator its task's strategies (`estimator_dist.programs.strategy`),
meets the cluster (`estimator_dist.guards.rendezvous`), adds the watchdog, the
preemption checkpoint and, on a training task, a hook sending the launcher
`Progress` events (`progress_reporter`; Estimator's own `loss = ..., step = ...`
lines stay the script's progress lines for people), wraps the input
functions as `estimator_dist.train` does, makes the evaluator write
`eval_metrics.json` and the chief `run_record.json`, and turns failures into
the package's exit codes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import tempfile
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, Optional, Set, Tuple, Union

from absl import logging

from estimator_dist.base import status
from estimator_dist.base.cluster import CHIEF, WORKER, ClusterConfig
from estimator_dist.base.errors import Error, UsageError
from estimator_dist.programs.config import PROGRAM, ScriptConfig
from estimator_dist.programs.loop import LoopTask
from estimator_dist.programs.user import (
    explained,
    given_model_dir,
    holders_of,
    keras_bridge,
    keras_estimator_modules,
    recording,
    rmtrees,
    routed,
    swap,
    user_frame,
)

if TYPE_CHECKING:
    from estimator_dist.guards.evaluator_watchdog import EvaluatorWatchdog
    from estimator_dist.guards.heartbeat import Heartbeat
    from estimator_dist.guards.preemption import Preemption
    from estimator_dist.guards.startup import Startup
    from estimator_dist.guards.watchdog import Watchdog

#: Why a multi-worker job needs `TrainSpec(max_steps=...)`.
NO_MAX_STEPS = (
    "{where}the script's TrainSpec has no max_steps, so training on task {role} would run "
    "until its input runs out: with parameter servers each worker steps alone, so no task "
    "can know the last step before training, and the evaluator would wait for one that never "
    "comes. Make the training input repeat (dataset.repeat()) and pass "
    "TrainSpec(input_fn, max_steps=N)."
)

#: A script that sets `model_dir` apart from the one the launcher was given.
MODEL_DIR_MISMATCH = (
    "the script's estimator writes to {actual}, but --model_dir={expected} was given to "
    "{program}, which reads checkpoints and writes logs there. Give the script the same "
    "directory (e.g. `-- --model_dir={expected}` for a script with a --model_dir argument), "
    "or pass the script's directory as --model_dir. Every task must share one: a directory "
    "made per task (tempfile.mkdtemp()) shares no checkpoint; an Estimator given no "
    "model_dir at all gets --model_dir."
)


class ScriptTask:
    """One task running a legacy script: the wrappers installed around it and what they saw.

    Args:
      config: The script and the task's settings.
      cluster: This task's normalised cluster configuration.
      startup: Records the task's start-up phases.
    """

    def __init__(self, config: ScriptConfig, cluster: ClusterConfig, startup: Startup) -> None:
        self._config = config
        self._cluster = cluster
        self._startup = startup
        self._inside = 0
        # The id the chief gave this attempt at the rendezvous, for the preemption decisions.
        self._attempt: Optional[str] = None
        self._joined = False
        self._values: Dict[str, Any] = {}
        # The strategies this task gave estimators, by id of the training strategy.
        self._distributions: Dict[int, Any] = {}
        self.calls = 0
        #: The first failure a wrapper raised, which wins even if the script catches it.
        self.failure: Optional[BaseException] = None
        #: The step the last training call stopped at when a decision ended it early.
        self.last_step_reached: Optional[int] = None
        self.loop = LoopTask(self, cluster, config.stall_timeout)
        #: The last step a train() segment agreed on, while it trains.
        self.segment_target: Optional[int] = None
        #: TensorFlow's own train_and_evaluate, while `installed()` replaces it.
        self.original_train_and_evaluate: Optional[Callable] = None
        #: The heartbeat the first training call started; later calls go on with it.
        self._heartbeat: Optional[Heartbeat] = None
        # --- storage (issue 35): --model_dir as every task names it (a URL for object storage).
        self._named_model_dir = config.model_dir
        # --- end storage

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Installs the wrappers while the script runs; restores TensorFlow afterwards."""
        from tensorflow_estimator.python.estimator import estimator as estimator_lib
        from tensorflow_estimator.python.estimator import training

        original = training.train_and_evaluate
        self.original_train_and_evaluate = original
        init = estimator_lib.Estimator.__init__

        @functools.wraps(original)
        def train_and_evaluate(estimator: Any, train_spec: Any, eval_spec: Any) -> Any:
            return self.train_and_evaluate(original, estimator, train_spec, eval_spec)

        with contextlib.ExitStack() as stack:
            # --- storage (issue 35): a job whose results live at a URL trains in a local
            # model_dir kept in step with it; estimators the program gives the URL get it.
            local = stack.enter_context(self._storage())
            if local != self._named_model_dir:
                init = _routed(init, self._named_model_dir, local)
            # --- end storage
            for holder in holders_of(original):
                swap(stack, holder, "train_and_evaluate", train_and_evaluate)
            for method, looped in (
                ("train", self.loop.train),
                ("evaluate", self.loop.evaluate),
                ("export_saved_model", self.loop.export),
            ):
                guarded = self._guard(getattr(estimator_lib.Estimator, method), looped)
                swap(stack, estimator_lib.Estimator, method, guarded)
            temporary: Set[str] = set()
            swap(stack, tempfile, "mkdtemp", recording(tempfile.mkdtemp, temporary))
            shared = self._config.model_dir
            swap(
                stack, estimator_lib.Estimator, "__init__", given_model_dir(init, shared, temporary)
            )
            for holder in keras_estimator_modules() if self._cluster.is_distributed else ():
                bridge = keras_bridge(holder.model_to_estimator, shared, temporary)
                swap(stack, holder, "model_to_estimator", bridge)
            for owner, name in rmtrees():
                swap(stack, owner, name, routed(getattr(owner, name), self.loop.rmtree))
            yield

    # --- storage (issue 35)
    @contextlib.contextmanager
    def _storage(self) -> Iterator[Optional[str]]:
        """The local model_dir for this task (`estimator_dist.storage.task.task_storage`)."""
        from estimator_dist.base import files
        from estimator_dist.guards.preemption import PREEMPTION_DIR
        from estimator_dist.programs.loop import LOOP_DIR
        from estimator_dist.storage.task import task_storage

        named, config, cluster = self._named_model_dir, self._config, self._cluster
        if named is None:
            yield None
            return
        shared = (PREEMPTION_DIR, files.LAST_STEP_FILE, LOOP_DIR)
        with task_storage(named, config.storage, cluster.role, cluster.task_type, shared) as local:
            if local != named:
                self._config = dataclasses.replace(config, model_dir=local)
            try:
                yield local
            finally:
                self._config = config

    # --- end storage

    def _guard(self, call: Callable, looped: Callable) -> Callable:
        """An `Estimator` method that `looped` runs on a cluster, outside train_and_evaluate."""

        @functools.wraps(call)
        def guarded(estimator: Any, *args: Any, **kwargs: Any) -> Any:
            if self._inside or not self._cluster.is_distributed:
                return call(estimator, *args, **kwargs)
            try:
                return looped(call, estimator, *args, **kwargs)
            except Error as error:
                self.failure = self.failure or error
                raise

        return guarded

    @property
    def config(self) -> ScriptConfig:
        """The program and the task's settings."""
        return self._config

    @property
    def attempt(self) -> Optional[str]:
        """The id the chief gave this attempt at the rendezvous (None before, or alone)."""
        return self._attempt

    def where_in_program(self) -> str:
        """`file:line: ` of the program's innermost frame on the current stack, or ''."""
        return user_frame(traceback.extract_stack())

    def model_dir_of(self, estimator: Any) -> str:
        """The estimator's model_dir (absolute when local), checked against --model_dir."""
        model_dir = estimator.model_dir
        if "://" not in model_dir:
            model_dir = os.path.abspath(model_dir)
        if self._config.model_dir is not None and model_dir != self._config.model_dir:
            raise UsageError(
                MODEL_DIR_MISMATCH.format(
                    actual=model_dir, expected=self._config.model_dir, program=PROGRAM
                )
            )
        return model_dir

    def join(
        self, estimator: Any, model_dir: str, view: Dict[str, Any], value: Any = None
    ) -> Dict[str, Any]:
        """Meets the other tasks once per process, before TensorFlow starts its servers.

        Later calls do nothing: the first call's servers hold the ports.

        Returns:
          Every training task's `value` by role (`estimator_dist.guards.rendezvous.exchange`).
        """
        import tensorflow as tf

        from estimator_dist.guards.checkpoints import settle_for_task
        from estimator_dist.guards.rendezvous import exchange

        if self._joined:
            return {}  # Only the first call's values were exchanged.
        config = self._config
        # The chief settles the checkpoints before it answers; the others restore after it.
        settle_for_task(self._cluster, model_dir, config.startup_timeout)
        full = {
            "cluster": {name: list(ports) for name, ports in self._cluster.jobs.items()},
            "model_dir": self._named_model_dir or model_dir,  # The same on every task.
            "script": os.path.basename(config.path),
            "script_args": list(config.args),
            "tensorflow": tf.__version__,
            **view,
        }
        self._attempt, self._values = exchange(self._cluster, full, config.startup_timeout, value)
        self._joined = True
        self._startup.mark("rendezvous")
        return self._values

    def train_and_evaluate(
        self, original: Callable, estimator: Any, train_spec: Any, eval_spec: Any
    ) -> Any:
        """Runs TensorFlow's `train_and_evaluate` the way this task needs it."""
        from tensorflow_estimator.python.estimator import estimator as estimator_lib

        if not isinstance(estimator, estimator_lib.Estimator):
            return original(estimator, train_spec, eval_spec)  # Raises TensorFlow's TypeError.
        self.calls += 1
        self._inside += 1
        try:
            return self._run(original, estimator, train_spec, eval_spec)
        except (KeyboardInterrupt, SystemExit):
            raise
        except Error as error:
            self.failure = self.failure or error
            raise
        except BaseException as error:
            if self.failure is None:
                self.failure = explained(error, self._config.path)
            raise
        finally:
            self._inside -= 1

    def _run(self, original: Callable, estimator: Any, train_spec: Any, eval_spec: Any) -> Any:
        import tensorflow as tf

        from estimator_dist.base.errors import DataError
        from estimator_dist.guards.heartbeat import start_heartbeat
        from estimator_dist.guards.roles import start_preemption, start_watchdog
        from estimator_dist.task import diagnose, early_stopping, last_step, records
        from estimator_dist.tf_runtime import patches

        self._startup.mark("script")
        model_dir, max_steps = self._prepare(estimator, train_spec)
        if max_steps != train_spec.max_steps:  # Decided from the training inputs.
            train_spec = train_spec._replace(max_steps=max_steps)
        cluster, config = self._cluster, self._config
        preemption = start_preemption(
            cluster, model_dir, config.preemption_checkpoint, config.preemption_grace_secs
        )
        preemption.joined(self._attempt)
        try:
            watchdog = start_watchdog(
                cluster,
                model_dir,
                max_steps,
                config.startup_timeout,
                config.stall_timeout,
                preemption,
            )
            exporter = records.MetricsExporter(model_dir)
            train_spec, eval_spec = self._specs(
                estimator, train_spec, eval_spec, exporter, watchdog, preemption
            )
            self._heartbeat = start_heartbeat(
                cluster,
                self._named_model_dir or model_dir,  # Storage (issue 35): the job's own name.
                self._attempt,
                config.heartbeat_timeout,
                preemption,
                self._heartbeat,
            )
            if self._heartbeat is not None:
                hooks = (*train_spec.hooks, self._heartbeat.hook())
                train_spec = train_spec._replace(hooks=hooks)
            started = time.monotonic()
            try:
                strategy = estimator._config.train_distribute
                if strategy is not None and self._cluster.is_distributed:
                    patches.fresh_collective_keys(strategy, self.calls - 1)
                result = original(estimator, train_spec, eval_spec)
            except early_stopping.StoppedEarly as stopped:
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
            except ValueError as error:
                # Saver's, for a checkpoint deleted while it was restored (rotated away).
                gone = diagnose.explain_checkpoint_gone(error)
                if gone is None:
                    raise
                raise gone from None
            except RuntimeError as error:
                # The thread that writes event files raises a refused write as RuntimeError.
                storage = diagnose.explain_storage_error(
                    error, model_dir, getattr(watchdog, "step", None)
                )
                if storage is None:
                    raise
                raise storage from None
            finally:
                if watchdog is not None:
                    watchdog.stop()
            preemption.finished()
        finally:
            preemption.uninstall()
        if not cluster.is_distributed:
            last_step.finish_alone(estimator, exporter, result, model_dir, max_steps)
        self.last_step_reached = None
        if early_stopping.stopped_early(preemption):  # Recorded last: it says why training ended.
            self.last_step_reached = early_stopping.record_stop(model_dir, preemption, cluster)
        return result

    def _prepare(self, estimator: Any, train_spec: Any) -> Tuple[str, Optional[int]]:
        """Checks the call, distributes the estimator, meets the cluster, writes the record.

        Returns:
          The estimator's model_dir (absolute when local) and the last step: the
          TrainSpec's max_steps, or on a cluster the one `estimator_dist.task.last_step`
          decided from the training inputs.
        """
        import tensorflow as tf

        from estimator_dist.base import files
        from estimator_dist.programs import strategy as script_strategy
        from estimator_dist.task import last_step

        cluster, config = self._cluster, self._config
        max_steps = train_spec.max_steps
        training = cluster.is_distributed and cluster.task_type in (CHIEF, WORKER)
        if training and max_steps is None and cluster.num_ps:
            where = user_frame(traceback.extract_stack())
            raise UsageError(NO_MAX_STEPS.format(where=where, role=cluster.role))
        model_dir = self.model_dir_of(estimator)
        # A later call with the same estimator (a train() loop) keeps the strategy it was given.
        distribution = self._distributions.get(id(estimator._config.train_distribute))
        if distribution is None:
            earlier = next(iter(self._distributions.values()), None)
            distribution = script_strategy.distribute(estimator, cluster, config, earlier)
            self._distributions[id(distribution.train)] = distribution
        self._startup.mark("strategies")
        view = {
            "max_steps": max_steps,
            "strategy": distribution.name,
            "communication": distribution.communication,
        }
        # The first call's counts travel with the rendezvous; a later call's through files. A
        # train() segment's last step is agreed already.
        counts: Dict[str, Any] = {}
        if not self._joined:
            count = last_step.count_for_task(
                cluster, estimator, train_spec.input_fn, max_steps, config.startup_timeout
            )
            counts = self.join(estimator, model_dir, view, count)
        elif training and not cluster.num_ps and self.segment_target is None:
            counts = self.loop.exchange_counts(estimator, train_spec.input_fn, max_steps)
        tf.io.gfile.makedirs(model_dir)
        last, decision = last_step.decide_for_task(
            cluster, model_dir, counts, max_steps, config.startup_timeout, self._attempt
        )
        if last is not None:
            known = decision or last_step.read_decision(model_dir) or {}
            status.emit(status.StopStep(step=last, how=last_step.stop_how(known.get("how"))))
        if cluster.is_chief:
            record = script_strategy.run_record(distribution, cluster, config, model_dir, max_steps)
            record["last_step"] = decision  # How the last step was found, on a cluster.
            files.write_json(os.path.join(model_dir, files.RUN_RECORD_FILE), record)
        return model_dir, last

    def _specs(
        self,
        estimator: Any,
        train_spec: Any,
        eval_spec: Any,
        exporter: Any,
        watchdog: Optional[Union[Watchdog, EvaluatorWatchdog]],
        preemption: Preemption,
    ) -> Tuple[Any, Any]:
        """The script's TrainSpec and EvalSpec with this task's hooks, input wrappers, exporter."""
        import tensorflow as tf

        from estimator_dist.guards.watchdog import Watchdog
        from estimator_dist.task import early_stopping
        from estimator_dist.task.user_code import bind_input_fn

        config = self._config
        params = estimator.params
        own_hooks = early_stopping.agreed(
            list(train_spec.hooks), preemption, self._cluster, config.preemption_checkpoint
        )
        train_hooks = [*own_hooks, self._startup.hook(), *preemption.hooks()]
        eval_hooks = list(eval_spec.hooks)
        if watchdog is not None:
            eval_hooks.append(watchdog.eval_hook())
        if isinstance(watchdog, Watchdog):
            train_hooks.append(watchdog.hook())
        if not self._cluster.is_distributed or self._cluster.task_type in (CHIEF, WORKER):
            every = estimator.config.log_step_count_steps or DEFAULT_PROGRESS_STEPS
            train_hooks.append(progress_reporter(train_spec.max_steps, every))
        train = tf.estimator.TrainSpec(
            bind_input_fn(train_spec.input_fn, params),
            max_steps=train_spec.max_steps,
            hooks=train_hooks,
            saving_listeners=train_spec.saving_listeners,
        )
        evaluation = tf.estimator.EvalSpec(
            bind_input_fn(eval_spec.input_fn, params),
            steps=eval_spec.steps,
            name=eval_spec.name,
            hooks=eval_hooks,
            exporters=[
                *eval_spec.exporters,
                exporter,
                early_stopping.FinalEvaluationExporter(self.model_dir_of(estimator)),
            ],
            start_delay_secs=_override(config.eval_start_delay_secs, eval_spec.start_delay_secs),
            throttle_secs=_override(config.eval_throttle_secs, eval_spec.throttle_secs),
        )
        return train, evaluation


#: Steps between two `Progress` events of a script whose RunConfig logs no step count.
DEFAULT_PROGRESS_STEPS = 100


# --- storage (issue 35)
def _routed(init: Callable, named: Optional[str], local: str) -> Callable:
    """Wraps `Estimator.__init__`: a model_dir of `named` (the job's URL) becomes `local`."""
    import inspect

    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(estimator: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(estimator, *args, **kwargs)
        config = bound.arguments.get("config")
        if bound.arguments.get("model_dir") == named:
            bound.arguments["model_dir"] = local
        if config is not None and getattr(config, "model_dir", None) == named:
            bound.arguments["config"] = config.replace(model_dir=local)
        init(*bound.args, **bound.kwargs)

    return __init__


# --- end storage


def progress_reporter(last_step: Optional[int], every_n_steps: int) -> Any:
    """A hook that sends a `status.Progress` event every `every_n_steps` global steps, silently.

    `guards.roles.ProgressHook`, quiet: a script's Estimator logs `loss = ...,
    step = ...` for people already. The event carries the step, the loss of the
    step that reached it and the interval's length; no examples/s, the script's
    batch being unknown.

    Args:
      last_step: The step training ends at, or None when the script names none
        (the events then say 0).
      every_n_steps: Global steps between two events (the RunConfig's
        `log_step_count_steps`).
    """
    from estimator_dist.guards.roles import ProgressHook

    return ProgressHook(last_step, None, max(1, every_n_steps), quiet=True)


def _override(value: Optional[int], default: int) -> int:
    return default if value is None else value
