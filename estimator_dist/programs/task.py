"""A program's task: its `train_and_evaluate` calls, given to the task's run.

While the program runs, `ScriptTask.installed()` puts the package's functions
in place of TensorFlow's entry points (`estimator_dist.tf_runtime.intercept`):

* `tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)`: the
  call is checked, the estimator gets the strategies its task needs where the
  program set none (`estimator_dist.programs.strategy`; the program's own are
  kept), and the task's run (`estimator_dist.task.run`, the same as for every
  kind of job) does the rest with the program's specs as they are;
* `Estimator.train`/`evaluate`/`export_saved_model` outside it: on a cluster,
  synchronised segments and the chief's results (`estimator_dist.programs.loop`);
* every estimator built, and `model_to_estimator`: the model_dir every task
  shares (`user.shared_model_dir`), and the Keras bridge as a cluster needs it;
* `shutil.rmtree` of the model_dir: the chief's alone.

Failures become the package's exit codes; an error of the program's own code
stays the program's (it may catch it) and ends the task with exit 5.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
import traceback
from typing import Any, Callable, Dict, Iterator, Optional, Set

from absl import logging

from estimator_dist.base.errors import Error, UsageError
from estimator_dist.cluster.pod_env import job_has_evaluator
from estimator_dist.cluster.tf_config import CHIEF, EVALUATOR, WORKER, ClusterConfig
from estimator_dist.guards.startup import Startup
from estimator_dist.programs.config import PROGRAM, ScriptConfig
from estimator_dist.programs.loop import LoopTask
from estimator_dist.programs.user import explained, shared_model_dir, user_frame
from estimator_dist.task.last_step import CHIEF_WAITS_FILE, EVALUATIONS_DIR

#: The evaluator's mark, in place of a call's number, when it left the program (`leave`).
LEFT = "left"
#: Seconds between two looks for the evaluator's mark.
_POLL_SECS = 0.5
#: Why a multi-worker job with parameter servers needs `TrainSpec(max_steps=...)`.
NO_MAX_STEPS = (
    "{where}the script's TrainSpec has no max_steps, so training on task {role} would run "
    "until its input runs out: with parameter servers each worker steps alone, so no task "
    "can know the last step before training, and the evaluator would wait for one that never "
    "comes. Make the training input repeat (dataset.repeat()) and pass "
    "TrainSpec(input_fn, max_steps=N)."
)

#: A program whose estimator writes outside the directory the launcher was given.
MODEL_DIR_MISMATCH = (
    "the script's estimator writes to {actual}, but --model_dir={expected} was given to "
    "{program}, which reads checkpoints and writes logs there. Give the script the same "
    "directory, or one below it (e.g. `-- --model_dir={expected}` for a script with a "
    "--model_dir argument), or pass the script's directory as --model_dir. Every task must "
    "share one: a directory made per task (tempfile.mkdtemp()) shares no checkpoint; the "
    "first Estimator given no model_dir gets --model_dir, each later one a directory below it."
)

#: How to make a program's training input that ran out before its last step last.
FIX_INPUT = (
    "Make the training input repeat (dataset.repeat(), or num_epochs=None for "
    "numpy_input_fn) and let TrainSpec's max_steps end training, or give no max_steps to "
    "train until the shortest input ends."
)


class ScriptTask:
    """One task running a program: the interceptions around it and what they saw.

    Args:
      config: The program and the task's settings.
      cluster: This task's normalised cluster configuration.
      startup: Records the task's start-up phases.
    """

    def __init__(self, config: ScriptConfig, cluster: ClusterConfig, startup: Startup) -> None:
        from estimator_dist.task.run import TaskRun

        self._config = config
        self._cluster = cluster
        self._startup = startup
        self._inside = 0
        # The strategies this task gave estimators, by id of the training strategy.
        self._distributions: Dict[int, Any] = {}
        #: The first failure an interception raised, which wins even if the program catches it.
        self.failure: Optional[BaseException] = None
        #: Whether this task took its part in the job: trained, or left it on purpose.
        self.took_part = False
        # `status.NO_EVALUATION` once the evaluator left a program it has no part in.
        self._left: Optional[str] = None
        self.run = TaskRun(cluster, config.guards, startup)
        self.loop = LoopTask(self, cluster, config.guards)
        # --model_dir as every task names it (a URL, for a job whose results live there).
        self._named_model_dir = config.model_dir
        # The program's train_and_evaluate calls so far, on this task, and the last one's
        # model_dir.
        self._calls = 0
        self._last_model_dir: Optional[str] = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Intercepts TensorFlow's entry points while the program runs; restores them after."""
        from estimator_dist.base import files
        from estimator_dist.task.run import TaskRun
        from estimator_dist.tf_runtime.intercept import intercepted

        temporary: Set[str] = set()
        handed_out: Dict[str, str] = {}
        named = self._named_model_dir

        def policy(arguments: dict, what: str) -> Optional[str]:
            local = self._config.model_dir  # The local directory of a job on storage.
            if named is not None and local != named:
                _route(arguments, named, local)
            return shared_model_dir(arguments, local, temporary, what, handed_out)

        def keras_lock(model_dir: str) -> Any:
            return files.model_dir_lock(model_dir, "keras_bridge")

        with (
            self._storage(),
            intercepted(
                self.train_and_evaluate,
                {
                    "train": functools.partial(self._guard, looped=self.loop.train),
                    "evaluate": functools.partial(self._guard, looped=self.loop.evaluate),
                    "export_saved_model": functools.partial(self._guard, looped=self.loop.export),
                    "predict": functools.partial(self._guard, looped=self.loop.predict),
                },
                policy,
                temporary,
                self.loop.rmtree,
                keras_lock if self._cluster.is_distributed else None,
            ) as original,
        ):
            self.run = TaskRun(self._cluster, self._config.guards, self._startup, original)
            if self._cluster.is_distributed and self._cluster.task_type == CHIEF:
                self._forget_evaluations()
            yield

    @contextlib.contextmanager
    def _storage(self) -> Iterator[None]:
        """Works in a local model_dir synchronised with a storage URL, where the job names one.

        `estimator_dist.storage.task.task_storage`; meanwhile the task's config
        names the local directory, and estimators the program gives the URL get
        it (`_route`).
        """
        from estimator_dist.base import files
        from estimator_dist.guards.preemption import PREEMPTION_DIR
        from estimator_dist.storage.task import task_storage

        named, config, cluster = self._named_model_dir, self._config, self._cluster
        if named is None:
            yield
            return
        shared = (PREEMPTION_DIR, files.LAST_STEP_FILE, files.EXCHANGE_DIR)
        with task_storage(named, config.storage, cluster.role, cluster.task_type, shared) as local:
            self._config = config.working_in(local)
            try:
                yield
            finally:
                self._config = config

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
        return self.run.attempt

    def where_in_program(self) -> str:
        """`file:line: ` of the program's innermost frame on the current stack, or ''."""
        return user_frame(traceback.extract_stack())

    def model_dir_of(self, estimator: Any) -> str:
        """The estimator's model_dir (absolute when local), checked against --model_dir.

        It is --model_dir or a directory below it (a program with several
        estimators gives each one of its own).
        """
        model_dir = estimator.model_dir
        if "://" not in model_dir:
            model_dir = os.path.abspath(model_dir)
        expected = self._config.model_dir
        if expected is not None and not _at_or_below(model_dir, expected):
            raise UsageError(
                MODEL_DIR_MISMATCH.format(actual=model_dir, expected=expected, program=PROGRAM)
            )
        return model_dir

    def join(self, model_dir: str) -> None:
        """Meets the other tasks for a program's first `train()`/`evaluate()` call."""
        self.took_part = True
        self.run.join(model_dir, self._view(model_dir, {"loop": True}))

    def _view(self, model_dir: str, extra: Dict[str, Any]) -> Dict[str, Any]:
        """What every task of the cluster must agree on, for the rendezvous."""
        return {
            "cluster": {name: list(ports) for name, ports in self._cluster.jobs.items()},
            "model_dir": self._named_model_dir or model_dir,  # The same on every task.
            "script": os.path.basename(str(self._config.path)),
            "script_args": list(self._config.args),
            **extra,
        }

    def train_and_evaluate(
        self,
        original: Callable,
        estimator: Any,
        train_spec: Any,
        eval_spec: Any,
        count_inputs: bool = True,
        batches: Optional[int] = None,
    ) -> Any:
        """Runs the program's `train_and_evaluate` call as this task needs it.

        `count_inputs` and `batches` are a `train()` segment's (`Call`'s attributes).
        """
        import tensorflow as tf

        # Every estimator, v2 ones included, is an instance of the v1 class.
        if not isinstance(estimator, tf.compat.v1.estimator.Estimator):
            return original(estimator, train_spec, eval_spec)  # Raises TensorFlow's TypeError.
        self.took_part = True
        self._inside += 1
        self._calls += 1
        try:
            result = self._train_and_evaluate(
                estimator, train_spec, eval_spec, count_inputs, batches
            )
            if self._cluster.task_type == EVALUATOR and self._config.model_dir is not None:
                self._done_evaluating()
            return result
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

    def _evaluated(self, call: Any) -> str:
        """The evaluator's mark for the program's `call`-th train_and_evaluate, or `LEFT`.

        It is under `loop/`, which a program's clearing of its model_dir keeps.
        """
        return os.path.join(self._config.model_dir, EVALUATIONS_DIR, f"{call}.json")

    def _forget_evaluations(self) -> None:
        """Removes an earlier attempt's marks (the chief, before the evaluator starts)."""
        import tensorflow as tf

        directory = os.path.dirname(self._evaluated(0)) if self._config.model_dir else None
        if directory is not None and tf.io.gfile.exists(directory):
            tf.io.gfile.rmtree(directory)

    def _chief_waits(self) -> str:
        """The file that says the chief waits for the evaluator, beside the last call's decision."""
        return os.path.join(self._last_model_dir or self._config.model_dir, CHIEF_WAITS_FILE)

    def _done_evaluating(self) -> None:
        """On the evaluator, after a call's final evaluation: says so, and lets the chief go on.

        When the chief waits for it, the evaluator returns once the chief has
        stopped waiting: its next call then never takes this call's decision,
        which the chief's waiting made current, for the next one's.
        """
        from estimator_dist.base import files

        _write(self._evaluated(self._calls), {"call": self._calls})
        waits = self._chief_waits()
        deadline = time.monotonic() + self._config.guards.stall_timeout
        while files.read_json(waits) == {"call": self._calls} and time.monotonic() < deadline:
            time.sleep(_POLL_SECS)

    def wait_for_evaluation(self) -> None:
        """On the chief: waits until the evaluator is done with the last train_and_evaluate call.

        A program that trains several models in one model_dir, clearing it
        between them, would otherwise delete the checkpoints the evaluator has
        yet to evaluate, and have it evaluate the next model's: in plain
        TensorFlow each call evaluates its own model before the program goes
        on. Only where the job is known to have an evaluator
        (`pod_env.job_has_evaluator`: TF_CONFIG does not list it); at most the
        start-up and stall timeouts, after which the chief goes on with a warning.
        """
        if (
            self._cluster.task_type != CHIEF
            or not self._calls
            or self._config.model_dir is None
            or not job_has_evaluator(os.environ)
        ):
            return
        from estimator_dist.base import files

        path = self._evaluated(self._calls)
        if files.read_json(path) is not None:
            return
        logging.info(
            "estimator_dist: waiting for the evaluator to finish evaluating the model of "
            "train_and_evaluate call %d before clearing %s.",
            self._calls,
            self._config.model_dir,
        )
        # Its training is over: the evaluator takes the decision beside it as the current one.
        waits = self._chief_waits()
        _write(waits, {"call": self._calls})
        bound = self._config.guards.startup_timeout + self._config.guards.stall_timeout
        deadline = time.monotonic() + bound
        left = self._evaluated(LEFT)
        try:
            while files.read_json(path) is None and files.read_json(left) is None:
                if time.monotonic() > deadline:
                    logging.warning(
                        "estimator_dist: the evaluator did not finish evaluating "
                        "train_and_evaluate call %d within %g s (--startup_timeout + "
                        "--stall_timeout); the chief goes on, and that evaluation may see the "
                        "next model's checkpoints.",
                        self._calls,
                        bound,
                    )
                    return
                time.sleep(_POLL_SECS)
        finally:
            import tensorflow as tf

            if tf.io.gfile.exists(waits):
                tf.io.gfile.remove(waits)

    def _train_and_evaluate(
        self,
        estimator: Any,
        train_spec: Any,
        eval_spec: Any,
        count_inputs: bool,
        batches: Optional[int],
    ) -> Any:
        from estimator_dist.programs import strategy as script_strategy
        from estimator_dist.task import last_step
        from estimator_dist.task.run import Call, steps_of

        cluster, config = self._cluster, self._config
        training = cluster.is_distributed and cluster.task_type in (CHIEF, WORKER)
        if training and train_spec.max_steps is None and cluster.num_ps:
            raise UsageError(NO_MAX_STEPS.format(where=self.where_in_program(), role=cluster.role))
        model_dir = self.model_dir_of(estimator)
        self._last_model_dir = model_dir
        distribution = self._distribution(estimator)
        self._startup.mark("strategies")
        start_delay_secs, throttle_secs = config.evaluation.or_else(
            eval_spec.start_delay_secs, eval_spec.throttle_secs
        )
        eval_spec = eval_spec._replace(
            start_delay_secs=start_delay_secs, throttle_secs=throttle_secs
        )
        max_steps = train_spec.max_steps

        def record(decision: Optional[dict]) -> dict:
            return script_strategy.run_record(
                distribution, cluster, config, model_dir, steps_of(max_steps)
            )

        def name_last_step(step: int, how: str) -> str:
            if how == last_step.MAX_STEPS and max_steps is not None:
                return f"TrainSpec's max_steps={max_steps:g}"
            return f"global step {step}, where the shortest training input ends"

        call = Call(
            view=self._view(
                model_dir,
                # Not max_steps: a program may compute it from data each task reads; the
                # tasks train to the chief's (`last_step.decide_for_task`).
                {"strategy": distribution.name, "communication": distribution.communication},
            ),
            record=record,
            name_last_step=name_last_step,
            fix=FIX_INPUT,
            count_inputs=count_inputs,
            batches=batches,
            explain=lambda error, step: error,  # The program's own: it may catch it.
            named_model_dir=self._named_model_dir,
        )
        self._startup.mark("script")
        return self.run.train_and_evaluate(estimator, train_spec, eval_spec, call)

    def _distribution(self, estimator: Any) -> Any:
        """The strategies this call trains with; a later call with the same estimator keeps them."""
        from estimator_dist.programs import strategy as script_strategy
        from estimator_dist.tf_runtime import estimators

        strategy = estimators.run_config(estimator).train_distribute
        distribution = self._distributions.get(id(strategy))
        if distribution is None:
            earlier = next(iter(self._distributions.values()), None)
            distribution = script_strategy.distribute(
                estimator, self._cluster, self._config, earlier
            )
            self._distributions[id(distribution.train)] = distribution
        return distribution

    def leave(self) -> None:
        """The evaluator has no part in a `train()`/`evaluate()` program: it ends (exit 0)."""
        from estimator_dist.report import status

        self.took_part = True
        self._left = status.NO_EVALUATION
        if self._config.model_dir is not None:  # A chief waiting for its evaluations goes on.
            _write(self._evaluated(LEFT), {"left": True})

    @property
    def exit_reason(self) -> Optional[str]:
        """What the launcher is told with a normal exit (`status.Exiting.reason`), or None.

        `status.NO_EVALUATION` for an evaluator that left a program it has no
        part in; `status.NO_TRAINING` for a training task of a cluster whose
        program only evaluated, exported or predicted.
        """
        from estimator_dist.report import status

        training = self._cluster.task_type in (CHIEF, WORKER)
        if self._left is None and training and self.took_part and not self.run.calls:
            return status.NO_TRAINING
        return self._left

    def train_segment(
        self, estimator: Any, train_spec: Any, eval_spec: Any, batches: Optional[int]
    ) -> Optional[int]:
        """One training segment of a `train()` call, to a last step every task agreed on.

        Args:
          estimator, train_spec, eval_spec: The segment's estimator and specs.
          batches: The steps each task runs at most, where the shortest input
            ends; None when the input does not end the segment.

        Returns:
          The step it stopped at before its last step (a hook of the program,
          early stopping, a train_op that does not step the global step), or None.
        """
        original = self.run.tensorflow_train_and_evaluate
        self.train_and_evaluate(
            original, estimator, train_spec, eval_spec, count_inputs=False, batches=batches
        )
        return self.run.stopped_at


def _write(path: str, data: Dict[str, Any]) -> None:
    """Writes `data` as JSON to `path`, making its directory first."""
    import tensorflow as tf

    from estimator_dist.base import files

    tf.io.gfile.makedirs(os.path.dirname(path))
    files.write_json(path, data)


def _route(arguments: dict, named: str, local: str) -> None:
    """Gives an estimator's `model_dir` (or its config's) `local` where it is `named`."""
    config = arguments.get("config")
    if arguments.get("model_dir") == named:
        arguments["model_dir"] = local
    if config is not None and getattr(config, "model_dir", None) == named:
        arguments["config"] = config.replace(model_dir=local)


def _at_or_below(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or inside it."""
    path, directory = path.rstrip("/"), directory.rstrip("/")
    return path == directory or path.startswith(directory + "/")
