"""The wrappers around a legacy script's `tf.estimator.train_and_evaluate` call.

While the script runs, `ScriptTask.installed()` replaces
`tf.estimator.train_and_evaluate` (and its `tf.compat.v1.estimator` alias)
and guards `Estimator.train`/`evaluate`. The wrapper checks the call, gives
the estimator its task's strategies (`estimator_dist.script_strategy`),
meets the cluster (`estimator_dist.rendezvous`), adds the watchdog and the
preemption checkpoint, wraps the input functions as `estimator_dist.train`
does, makes the evaluator write `eval_metrics.json` and the chief
`run_record.json`, and turns failures into the package's exit codes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import sysconfig
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union

from absl import logging

from estimator_dist.base import pitfalls
from estimator_dist.base.cluster import CHIEF, WORKER, ClusterConfig
from estimator_dist.base.errors import Error, UsageError, UserCodeError
from estimator_dist.script_config import MAX_STEPS_MARKER, PROGRAM, ScriptConfig

if TYPE_CHECKING:
    from estimator_dist.preemption import Preemption
    from estimator_dist.startup import Startup
    from estimator_dist.watchdog import EvaluatorWatchdog, Watchdog

#: Why a multi-worker job needs `TrainSpec(max_steps=...)`.
NO_MAX_STEPS = (
    "{where}the script's TrainSpec has no max_steps, so training on task {role} would run "
    "until its input runs out: a worker whose input ends first leaves the others waiting "
    "forever, and the evaluator waits for a last step that never comes. Make the training "
    "input repeat (dataset.repeat()) and pass TrainSpec(input_fn, max_steps=N)."
)

#: A script that sets `model_dir` apart from the one the launcher was given.
MODEL_DIR_MISMATCH = (
    "the script's estimator writes to {actual}, but --model_dir={expected} was given to "
    "{program}, which reads checkpoints and writes logs there. Give the script the same "
    "directory (e.g. `-- --model_dir={expected}` for a script with a --model_dir argument), "
    "or pass the script's directory as --model_dir. An Estimator given no model_dir makes "
    "a temporary one of its own on every task; every task must share one."
)


def _own_dirs() -> Tuple[str, ...]:
    """The directories of this package's code."""
    here = os.path.dirname(os.path.realpath(__file__))
    return here, os.path.join(os.path.dirname(here), "run_config")


def _is_users(filename: str) -> bool:
    """Whether `filename` is user code: not Python's, not an installed package's, not ours."""
    paths = sysconfig.get_paths()
    others = tuple(os.path.realpath(p) for p in (paths["stdlib"], paths["purelib"]))
    real = os.path.realpath(filename)
    return not filename.startswith("<") and not real.startswith((*others, *_own_dirs()))


def shown(path: str) -> str:
    """`path` relative to the current directory when it is below it, else absolute."""
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative


def _where(frames: Sequence[traceback.FrameSummary]) -> str:
    """`file:line: ` of the innermost frame of user code in `frames`, or ''."""
    for frame in reversed(frames):
        if _is_users(frame.filename):
            return f"{shown(frame.filename)}:{frame.lineno}: "
    return ""


def user_code_error(error: BaseException, script: str) -> UserCodeError:
    """Explains an exception that the script, its model_fn or its input_fn raised (exit 5).

    Args:
      error: The exception, with its traceback.
      script: The script's path.
    """
    frames = traceback.extract_tb(error.__traceback__)
    users = [frame for frame in frames if _is_users(frame.filename)]
    where = f" in {users[-1].name}() at {_where(users).rstrip(': ')}" if users else ""
    return UserCodeError(
        f"the script {shown(script)} raised {type(error).__name__}: {error}{where}. "
        "The traceback is in the log above. It would raise again on every task and after "
        "every restart, so the job stops: fix the code and run again."
    )


def _swap(stack: contextlib.ExitStack, owner: Any, name: str, value: Any) -> None:
    """Sets `owner.name` to `value` until `stack` closes."""
    previous = getattr(owner, name)
    setattr(owner, name, value)
    stack.callback(setattr, owner, name, previous)


def _holders_of(function: Callable) -> List[Any]:
    """Every module object through which a script can reach `function` by its name.

    `tf.estimator` and `tf.compat.v1.estimator` are lazy loaders that copy the
    module's names into themselves when first used, so they are patched as
    well as the modules behind them.
    """
    import tensorflow as tf

    holders = [tf.estimator, tf.compat.v1.estimator, tf.compat.v2.estimator]
    name = function.__name__
    for holder in holders:
        getattr(holder, name)  # Loads a lazy module, which copies its names in.
    holders += [
        module
        for module_name, module in list(sys.modules.items())
        if module_name.startswith("tensorflow") and getattr(module, name, None) is function
    ]
    unique = {id(holder): holder for holder in holders}
    return [holder for holder in unique.values() if getattr(holder, name) is function]


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
        self.calls = 0
        #: The first failure a wrapper raised, which wins even if the script catches it.
        self.failure: Optional[BaseException] = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Installs the wrappers while the script runs; restores TensorFlow afterwards."""
        from tensorflow_estimator.python.estimator import estimator as estimator_lib
        from tensorflow_estimator.python.estimator import training

        original = training.train_and_evaluate

        @functools.wraps(original)
        def train_and_evaluate(estimator: Any, train_spec: Any, eval_spec: Any) -> Any:
            return self.train_and_evaluate(original, estimator, train_spec, eval_spec)

        with contextlib.ExitStack() as stack:
            for holder in _holders_of(original):
                _swap(stack, holder, "train_and_evaluate", train_and_evaluate)
            for method in ("train", "evaluate"):
                guarded = self._guard(method, getattr(estimator_lib.Estimator, method))
                _swap(stack, estimator_lib.Estimator, method, guarded)
            yield

    def _guard(self, method: str, call: Callable) -> Callable:
        """Wraps `Estimator.<method>` to fail at once on a cluster outside train_and_evaluate."""

        @functools.wraps(call)
        def guarded(estimator: Any, *args: Any, **kwargs: Any) -> Any:
            if self._inside or not self._cluster.is_distributed:
                return call(estimator, *args, **kwargs)
            where = _where(traceback.extract_stack()[:-1])
            error = UsageError(pitfalls.ESTIMATOR_TRAIN.format(where=where, method=method))
            self.failure = self.failure or error
            raise error

        return guarded

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

        from estimator_dist import diagnose, records
        from estimator_dist.base.errors import DataError
        from estimator_dist.guards import start_preemption, start_watchdog

        self._startup.mark("script")
        model_dir, max_steps = self._prepare(estimator, train_spec)
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
            started = time.monotonic()
            try:
                result = original(estimator, train_spec, eval_spec)
            except tf.errors.OpError as error:
                step = getattr(watchdog, "step", None)
                explained = diagnose.explain_training_error(
                    error, step, time.monotonic() - started, model_dir
                )
                if preemption.requested:
                    logging.warning("Training failed while stopping for a preemption: %s", error)
                    preemption.finished(failed=True)
                if explained is None:
                    raise
                raise explained from (error if isinstance(explained, DataError) else None)
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
        if exporter.final_metrics is None and isinstance(result, tuple) and result[0]:
            # One process that trained until its input ran out (no max_steps): its last
            # evaluation is the final one, though Estimator could not know it.
            latest = tf.train.latest_checkpoint(model_dir)
            exporter.export(estimator, "", latest, result[0], is_the_final_export=True)
        return result

    def _prepare(self, estimator: Any, train_spec: Any) -> Tuple[str, Optional[int]]:
        """Checks the call, distributes the estimator, meets the cluster, writes the record.

        Returns:
          The estimator's model_dir (absolute when local) and the TrainSpec's max_steps.
        """
        import tensorflow as tf

        from estimator_dist import records, script_strategy
        from estimator_dist.rendezvous import rendezvous

        cluster, config = self._cluster, self._config
        max_steps = train_spec.max_steps
        if cluster.is_distributed and cluster.task_type in (CHIEF, WORKER) and max_steps is None:
            where = _where(traceback.extract_stack())
            raise UsageError(NO_MAX_STEPS.format(where=where, role=cluster.role))
        model_dir = estimator.model_dir
        if "://" not in model_dir:
            model_dir = os.path.abspath(model_dir)
        if config.model_dir is not None and model_dir != config.model_dir:
            raise UsageError(
                MODEL_DIR_MISMATCH.format(
                    actual=model_dir, expected=config.model_dir, program=PROGRAM
                )
            )
        print(
            f"{MAX_STEPS_MARKER}{max_steps} in model_dir {model_dir} (task {cluster.role})",
            flush=True,
        )
        distribution = script_strategy.distribute(estimator, cluster, config)
        self._startup.mark("strategies")
        view = {
            "cluster": {name: list(addresses) for name, addresses in cluster.jobs.items()},
            "model_dir": model_dir,
            "max_steps": max_steps,
            "strategy": distribution.name,
            "communication": distribution.communication,
            "script": os.path.basename(config.path),
            "script_args": list(config.args),
            "tensorflow": tf.__version__,
        }
        self._attempt = rendezvous(cluster, view, config.startup_timeout)
        self._startup.mark("rendezvous")
        tf.io.gfile.makedirs(model_dir)
        if cluster.is_chief:
            records.write_json(
                os.path.join(model_dir, records.RUN_RECORD_FILE),
                script_strategy.run_record(distribution, cluster, config, model_dir, max_steps),
            )
        return model_dir, max_steps

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

        from estimator_dist.user_code import bind_input_fn
        from estimator_dist.watchdog import Watchdog

        config = self._config
        params = estimator.params
        train_hooks = [*train_spec.hooks, self._startup.hook(), *preemption.hooks()]
        eval_hooks = list(eval_spec.hooks)
        if watchdog is not None:
            eval_hooks.append(watchdog.eval_hook())
        if isinstance(watchdog, Watchdog):
            train_hooks.append(watchdog.hook())
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
            exporters=[*eval_spec.exporters, exporter],
            start_delay_secs=_override(config.eval_start_delay_secs, eval_spec.start_delay_secs),
            throttle_secs=_override(config.eval_throttle_secs, eval_spec.throttle_secs),
        )
        return train, evaluation


def _override(value: Optional[int], default: int) -> int:
    return default if value is None else value


def explained(error: BaseException, script: str) -> BaseException:
    """What a failure ends the task with; the traceback of user code is printed first.

    An exception raised by this package's own code (its innermost frame is
    ours) is not the user's: it stays as it is, and ends the task with exit 1.
    """
    import tensorflow as tf

    frames = traceback.extract_tb(error.__traceback__)
    ours = bool(frames) and os.path.realpath(frames[-1].filename).startswith(_own_dirs())
    if isinstance(error, (Error, tf.errors.OpError)) or ours:
        return error
    traceback.print_exception(type(error), error, error.__traceback__)
    return user_code_error(error, script)
