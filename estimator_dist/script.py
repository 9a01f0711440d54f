"""Run a whole legacy Estimator training script, unchanged, as one task of a job.

  python -m estimator_dist.script [--communication=RING] train.py --model_dir=/shared/run1

The script is one that builds its own Estimator and calls
`tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)` itself.
`python -m estimator_dist.launch --script=train.py` runs this module on every
task of a local cluster; a platform that writes TF_CONFIG itself (Kubeflow
TFJob, Vertex AI, SageMaker) runs it as each task's command; with no
TF_CONFIG it runs the script in this one process. The flags before the script's
path are this module's; everything after it is the script's own arguments.

Before the script runs, TF_CONFIG is validated and normalised
(`estimator_dist.base.cluster`: `master` becomes `chief`, an `evaluator` listed in
`cluster` is taken out, a worker-only cluster gets a chief) and written back,
eager execution is turned off (the evaluator crashes in eager mode), and the
script gets the `sys.argv` and `sys.path` that `python train.py ...` gives it.
While it runs, `tf.estimator.train_and_evaluate` (and its
`tf.compat.v1.estimator` alias) is wrapped. The wrapper

* gives the estimator the distribution strategy its task needs when the
  script's RunConfig sets no `train_distribute`: MultiWorkerMirroredStrategy
  with --communication on the chief and workers (and in a single process), a
  local MirroredStrategy on the evaluator, which is outside the cluster; a
  strategy the script built itself is kept (a MultiWorkerMirroredStrategy
  then all-reduces sparse gradients as dense tensors, `run_config.sparse`);
* checks that the cluster agrees before TensorFlow starts its servers
  (`estimator_dist.rendezvous`), adds the fail-fast watchdogs of
  `estimator_dist.watchdog` and the preemption checkpoint of
  `estimator_dist.preemption`, wraps the script's input functions as
  `estimator_dist.train` does (`user_code.bind_input_fn`), makes the
  evaluator write `model_dir/eval_metrics.json`, and the chief
  `model_dir/run_record.json`;
* turns failures into the package's exit codes (`estimator_dist.base.exit_codes`).

On a task of a cluster, `estimator.train(...)` and `estimator.evaluate(...)`
called outside `train_and_evaluate` fail at once with exit code 2, and a
script that ends without calling `train_and_evaluate` exits 5. See
docs/scripts.md for what this cannot change in a script.

Exit codes: 0 when the script finished (or the script's own `sys.exit` code);
2 for a bad flag, TF_CONFIG, script path or a call that cannot run on a
cluster; 5 when the script (or its model_fn or input_fn) raised; 3, 4, 6, 7, 8
and 150 to 155 as with `estimator_dist.train`; 1 for any other TensorFlow error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import runpy
import sys
import sysconfig
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Iterator, List, Optional, Sequence, Tuple, Union

from absl import app, flags, logging

from estimator_dist import train
from estimator_dist.base import exit_codes, pitfalls
from estimator_dist.base.cluster import CHIEF, EVALUATOR, WORKER, ClusterConfig, parse_tf_config
from estimator_dist.base.errors import Error, UsageError, UserCodeError
from run_config.names import COMMUNICATIONS, MULTI_WORKER_MIRRORED, OFF, PARAMETER_SERVER

if TYPE_CHECKING:
    import tensorflow as tf

    from estimator_dist.preemption import Preemption
    from estimator_dist.startup import Startup
    from estimator_dist.watchdog import EvaluatorWatchdog, Watchdog
    from run_config.strategies import Strategies

PROGRAM = "estimator_dist.script"
#: Starts the line each task prints when the script calls train_and_evaluate;
#: the launcher reads the last step from it.
MAX_STEPS_MARKER = "estimator_dist.script: training to max_steps="
#: Names of the flags `define_flags` defines, in the order they are passed on.
FLAG_NAMES = (
    "model_dir",
    "communication",
    "collective_timeout",
    "startup_timeout",
    "stall_timeout",
    "eval_start_delay_secs",
    "eval_throttle_secs",
    "preemption_checkpoint",
    "preemption_grace_secs",
)

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
#: A single-process strategy in a script run on several workers.
LOCAL_STRATEGY = (
    "the script's RunConfig sets train_distribute={strategy}, which trains in one "
    "process, but TF_CONFIG has {workers} workers, which would wait for each other "
    "forever. Remove train_distribute (then {program} gives every task the strategy it "
    "needs) or build tf.distribute.MultiWorkerMirroredStrategy()."
)
#: Parameter servers for a script that brings no strategy.
PS_WITHOUT_STRATEGY = (
    "TF_CONFIG lists {ps} ps task(s), but the script's RunConfig sets no train_distribute, and "
    "the MultiWorkerMirroredStrategy {program} would give it uses no parameter servers. Build "
    "train_distribute=tf.compat.v1.distribute.experimental.ParameterServerStrategy() in the "
    "script, or run the job without ps tasks."
)
#: A script that ends on a task of a cluster without training.
NO_TRAIN_AND_EVALUATE = (
    "the script {script} ended without calling tf.estimator.train_and_evaluate(estimator, "
    "train_spec, eval_spec). Every task of a cluster ({role} here) must call it: it is the "
    "call {program} distributes. Replace estimator.train(...)/evaluate(...) by it, and make "
    "sure no argument or condition skips it on this task."
)


def define_flags(flag_values: flags.FlagValues) -> None:
    """Defines this module's flags on `flag_values` (the launcher defines them too).

    They live on their own `FlagValues` in this module, not on `flags.FLAGS`:
    a script that uses absl defines and parses its own flags there.
    """
    f = flag_values
    flags.DEFINE_string(
        "model_dir",
        None,
        "The directory the script's estimator writes to (its RunConfig or Estimator "
        "model_dir). When given, a task whose estimator uses another one fails at once "
        "(exit 2). The launcher writes logs/ there and reads the checkpoint step from it.",
        flag_values=f,
    )
    flags.DEFINE_enum(
        "communication",
        "AUTO",
        COMMUNICATIONS,
        "Collective implementation of the MultiWorkerMirroredStrategy given to a script "
        "whose RunConfig sets no train_distribute; NCCL needs GPUs, RING runs anywhere.",
        case_sensitive=False,
        flag_values=f,
    )
    flags.DEFINE_float(
        "collective_timeout",
        0,
        "Seconds a collective of the given strategy may wait for its peers; 0 waits forever "
        "(see estimator_dist.train --helpfull).",
        lower_bound=0.0,
        flag_values=f,
    )
    flags.DEFINE_float(
        "startup_timeout",
        600,
        "Seconds for the cluster to assemble and run the first step before a training "
        "task fails (exit 151).",
        lower_bound=1.0,
        flag_values=f,
    )
    flags.DEFINE_float(
        "stall_timeout",
        120,
        "Seconds the global step may stay the same before a training task fails (exit 152); "
        "on the evaluator, seconds without a new checkpoint while the chief is unreachable.",
        lower_bound=1.0,
        flag_values=f,
    )
    flags.DEFINE_integer(
        "eval_start_delay_secs",
        None,
        "Replaces the script's EvalSpec start_delay_secs (TensorFlow's default: 120 s).",
        lower_bound=0,
        flag_values=f,
    )
    flags.DEFINE_integer(
        "eval_throttle_secs",
        None,
        "Replaces the script's EvalSpec throttle_secs (TensorFlow's default: 600 s). The "
        "evaluator may wait this long after training ends before its final evaluation.",
        lower_bound=0,
        flag_values=f,
    )
    flags.DEFINE_boolean(
        "preemption_checkpoint",
        True,
        "On SIGTERM or SIGINT, stop every task at one global step and checkpoint it (exit "
        "155), as estimator_dist.train does; --nopreemption_checkpoint leaves the signals to "
        "the script.",
        flag_values=f,
    )
    flags.DEFINE_float(
        "preemption_grace_secs",
        25,
        "Seconds after SIGTERM or SIGINT at which a task exits 155 even if the job could not "
        "stop at one step. Keep it below the platform's grace period.",
        lower_bound=1.0,
        flag_values=f,
    )


def check_script(path: str) -> str:
    """Checks that `path` is a readable Python file; returns its absolute path.

    Raises:
      UsageError: naming the path, what is wrong and the fix.
    """
    absolute = os.path.abspath(path)
    if not os.path.exists(absolute):
        raise UsageError(
            f"--script={path} does not exist (looked for {absolute}). Give the path of the "
            "training script, relative to the current directory or absolute."
        )
    if not os.path.isfile(absolute):
        raise UsageError(f"--script={path} is not a file; give the training script's .py file.")
    try:
        with open(absolute, "rb") as stream:
            compile(stream.read(), absolute, "exec")
    except OSError as error:
        raise UsageError(f"--script={path} cannot be read: {error.strerror}.") from None
    except (SyntaxError, ValueError) as error:
        line = getattr(error, "lineno", None)
        raise UsageError(
            f"--script={path} is not a Python script"
            f"{f' (line {line}: {error.msg})' if line else f' ({error})'}; give the "
            "training script's .py file."
        ) from None
    return absolute


@dataclasses.dataclass(frozen=True)
class ScriptConfig:
    """A legacy script to run on a task, and what the task adds to it.

    Attributes:
      path: The script; made absolute and checked to be Python.
      args: The script's own command-line arguments.
      communication: RING, NCCL or AUTO (any case), for the strategy given to
        a script whose RunConfig has none.
      collective_timeout: Seconds a collective may wait, or None for ever.
      startup_timeout: Seconds to the first training step.
      stall_timeout: Seconds the global step may stay the same.
      model_dir: The directory the script's estimator must write to, or None
        to take the script's.
      eval_start_delay_secs: Replaces the EvalSpec's start_delay_secs, or None.
      eval_throttle_secs: Replaces the EvalSpec's throttle_secs, or None.
      preemption_checkpoint: Stop every task at one checkpointed step on
        SIGTERM/SIGINT (`estimator_dist.preemption`).
      preemption_grace_secs: Seconds from the signal to a forced exit 155.

    >>> config = ScriptConfig(__file__, ["--max_steps=10"], communication="ring")
    >>> config.communication, config.args
    ('RING', ('--max_steps=10',))
    """

    path: str
    args: Tuple[str, ...] = ()
    communication: str = "AUTO"
    collective_timeout: Optional[float] = None
    startup_timeout: float = 600.0
    stall_timeout: float = 120.0
    model_dir: Optional[str] = None
    eval_start_delay_secs: Optional[int] = None
    eval_throttle_secs: Optional[int] = None
    preemption_checkpoint: bool = True
    preemption_grace_secs: float = 25.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", check_script(self.path))
        object.__setattr__(self, "args", tuple(self.args))
        communication = str(self.communication).upper()
        if communication not in COMMUNICATIONS:
            raise UsageError(
                f"--communication={self.communication} is not a collective implementation; "
                f"valid values are {', '.join(COMMUNICATIONS)}."
            )
        object.__setattr__(self, "communication", communication)
        if self.collective_timeout is not None and self.collective_timeout <= 0:
            raise UsageError(
                f"collective_timeout must be positive or None, received {self.collective_timeout}."
            )
        for name in ("startup_timeout", "stall_timeout", "preemption_grace_secs"):
            if getattr(self, name) <= 0:
                raise UsageError(f"--{name} must be positive, received {getattr(self, name)}.")
        for name in ("eval_start_delay_secs", "eval_throttle_secs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise UsageError(f"--{name} must be 0 or more, received {value}.")
        if self.model_dir is not None:
            if not self.model_dir:
                raise UsageError("--model_dir is empty; give the directory the script writes to.")
            if "://" not in self.model_dir:
                object.__setattr__(self, "model_dir", os.path.abspath(self.model_dir))

    def to_args(self) -> List[str]:
        """The command line of `python -m estimator_dist.script` that runs this config."""
        values = {
            "model_dir": self.model_dir,
            "communication": self.communication,
            "collective_timeout": self.collective_timeout,
            "startup_timeout": self.startup_timeout,
            "stall_timeout": self.stall_timeout,
            "eval_start_delay_secs": self.eval_start_delay_secs,
            "eval_throttle_secs": self.eval_throttle_secs,
            "preemption_checkpoint": str(self.preemption_checkpoint).lower(),
            "preemption_grace_secs": self.preemption_grace_secs,
        }
        given = [f"--{name}={values[name]}" for name in FLAG_NAMES if values[name] is not None]
        return [*given, "--", self.path, *self.args]


def config_from_flags(
    flag_values: flags.FlagValues, path: str, args: Sequence[str]
) -> ScriptConfig:
    """Turns parsed `define_flags` flags, the script and its arguments into a `ScriptConfig`.

    Raises:
      UsageError: for a bad value or script.
    """
    f = flag_values
    return ScriptConfig(
        path=path,
        args=tuple(args),
        communication=f.communication,
        collective_timeout=f.collective_timeout or None,
        startup_timeout=f.startup_timeout,
        stall_timeout=f.stall_timeout,
        model_dir=f.model_dir,
        eval_start_delay_secs=f.eval_start_delay_secs,
        eval_throttle_secs=f.eval_throttle_secs,
        preemption_checkpoint=f.preemption_checkpoint,
        preemption_grace_secs=f.preemption_grace_secs,
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


def _shown(path: str) -> str:
    """`path` relative to the current directory when it is below it, else absolute."""
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative


def _where(frames: Sequence[traceback.FrameSummary]) -> str:
    """`file:line: ` of the innermost frame of user code in `frames`, or ''."""
    for frame in reversed(frames):
        if _is_users(frame.filename):
            return f"{_shown(frame.filename)}:{frame.lineno}: "
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
        f"the script {_shown(script)} raised {type(error).__name__}: {error}{where}. "
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


def _is_collective(strategy: Optional[tf.distribute.Strategy]) -> bool:
    from tensorflow.python.distribute.collective_all_reduce_strategy import (
        CollectiveAllReduceExtended,
    )

    return strategy is not None and isinstance(strategy.extended, CollectiveAllReduceExtended)


def with_distribution(
    config: tf.estimator.RunConfig,
    train_distribute: Optional[tf.distribute.Strategy],
    eval_distribute: Optional[tf.distribute.Strategy],
) -> tf.estimator.RunConfig:
    """A copy of `config` with other strategies, as if they had been given to its constructor.

    `RunConfig.replace` only swaps the fields: the distribute coordinator mode
    and the cluster settings that RunConfig derives from TF_CONFIG and the
    strategy when it is built would stay those of the old strategy. So after
    the replacement this runs what `RunConfig.__init__` runs for a config with
    a strategy (`estimator_training.init_run_config`). A config built without a
    strategy on a task of a cluster was also given a default session config
    with device filters for between-graph replication; that one is dropped, as
    the constructor would not have made it.

    Args:
      config: The script's RunConfig.
      train_distribute: The training strategy.
      eval_distribute: The evaluation strategy, or None.

    Returns:
      A new RunConfig; `config` is unchanged.
    """
    from tensorflow.python.distribute import estimator_training

    session_config = config.session_config
    if session_config is not None and session_config == (
        config._get_default_session_config_distributed()
    ):
        session_config = None
    replaced = config.replace(
        train_distribute=train_distribute,
        eval_distribute=eval_distribute,
        session_config=session_config,
    )
    estimator_training.init_run_config(replaced, json.loads(os.environ.get("TF_CONFIG") or "{}"))
    return replaced


def set_run_config(estimator: tf.estimator.Estimator, config: tf.estimator.RunConfig) -> None:
    """Makes `estimator` use `config`, with everything `Estimator.__init__` derives from it.

    The estimator's model_dir stays: `config` must have the same one.
    """
    from tensorflow_estimator.python.estimator import estimator as estimator_lib

    estimator._config = config
    estimator._train_distribution = config.train_distribute
    estimator._eval_distribution = config.eval_distribute
    estimator._session_config = config.session_config
    estimator._device_fn = config.device_fn or estimator_lib._get_replica_device_setter(config)


def _communication_of(strategy: tf.distribute.Strategy) -> Optional[str]:
    """The collective implementation a script's own MultiWorkerMirroredStrategy asked for."""
    options = getattr(strategy.extended, "_communication_options", None)
    implementation = getattr(options, "implementation", None)
    return getattr(implementation, "name", None)


@dataclasses.dataclass(frozen=True)
class _Distribution:
    """The strategies a call of train_and_evaluate runs with, and where they came from."""

    train: Optional[tf.distribute.Strategy]
    eval: Optional[tf.distribute.Strategy]
    name: str
    injected: bool
    communication: Optional[str]
    effective_communication: Optional[str]


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
        self.calls = 0
        #: The first failure a wrapper raised, which wins even if the script catches it.
        self.failure: Optional[BaseException] = None

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Installs the wrappers while the script runs; restores TensorFlow afterwards."""
        from tensorflow.python.distribute import collective_all_reduce_strategy
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
            if self._cluster.task_type == EVALUATOR:
                extended = collective_all_reduce_strategy.CollectiveAllReduceExtended
                _swap(stack, extended, "_initialize_strategy", _local_on_evaluator(extended))
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
                self.failure = _explained(error, self._config.path)
            raise
        finally:
            self._inside -= 1

    def _run(self, original: Callable, estimator: Any, train_spec: Any, eval_spec: Any) -> Any:
        import tensorflow as tf

        from estimator_dist import driver
        from estimator_dist.base.errors import DataError
        from estimator_dist.guards import start_preemption, start_watchdog

        self._startup.mark("script")
        model_dir, max_steps = self._prepare(estimator, train_spec)
        cluster, config = self._cluster, self._config
        preemption = start_preemption(
            cluster, model_dir, config.preemption_checkpoint, config.preemption_grace_secs
        )
        try:
            watchdog = start_watchdog(
                cluster,
                model_dir,
                max_steps,
                config.startup_timeout,
                config.stall_timeout,
                preemption,
            )
            exporter = driver.MetricsExporter(model_dir)
            train_spec, eval_spec = self._specs(
                estimator, train_spec, eval_spec, exporter, watchdog, preemption
            )
            started = time.monotonic()
            try:
                result = original(estimator, train_spec, eval_spec)
            except tf.errors.OpError as error:
                step = getattr(watchdog, "step", None)
                explained = driver.explain_training_error(
                    error, step, time.monotonic() - started, model_dir
                )
                if preemption.requested:
                    logging.warning("Training failed while stopping for a preemption: %s", error)
                    preemption.finished()
                if explained is None:
                    raise
                raise explained from (error if isinstance(explained, DataError) else None)
            except RuntimeError as error:
                # The thread that writes event files raises a refused write as RuntimeError.
                storage = driver.explain_storage_error(
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

        from estimator_dist import driver
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
        distribution = self._distribute(estimator)
        driver.model_fn_as_written(estimator)
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
        rendezvous(cluster, view, config.startup_timeout)
        self._startup.mark("rendezvous")
        tf.io.gfile.makedirs(model_dir)
        if cluster.is_chief:
            driver.write_json(
                os.path.join(model_dir, driver.RUN_RECORD_FILE),
                self._run_record(distribution, model_dir, max_steps),
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

    def _distribute(self, estimator: Any) -> _Distribution:
        """Gives the estimator the strategies this task needs; returns what it runs with."""
        from run_config.sparse import reduce_sparse_as_dense
        from run_config.strategies import (
            StrategyConfig,
            count_gpus,
            effective_communication,
            make_strategies,
        )
        from run_config.teardown import build_device_datasets_without_autotune

        cluster, config = self._cluster, self._config
        run_config = estimator._config
        own = run_config.train_distribute
        evaluation = run_config.eval_distribute
        if own is None and cluster.num_ps and cluster.task_type != EVALUATOR:
            raise UsageError(PS_WITHOUT_STRATEGY.format(ps=cluster.num_ps, program=PROGRAM))
        if own is None or cluster.task_type == EVALUATOR:
            # The evaluator gets a local strategy of either kind; the name only has
            # to fit the cluster.
            name = PARAMETER_SERVER if cluster.num_ps else MULTI_WORKER_MIRRORED
            wanted = StrategyConfig(name, config.communication, config.collective_timeout)
            strategies: Strategies = make_strategies(wanted, OFF, cluster)
            if cluster.task_type == EVALUATOR and _is_collective(evaluation):
                # Built by the script on the evaluator, where it is a local strategy
                # (`_local_on_evaluator`); evaluation needs none.
                evaluation = None
            set_run_config(
                estimator, with_distribution(run_config, strategies.train_distribute, evaluation)
            )
            return _Distribution(
                strategies.train_distribute,
                evaluation,
                strategies.train_name,
                True,
                strategies.communication if strategies.effective_communication else None,
                strategies.effective_communication,
            )
        collective = _is_collective(own)
        separate = type(own).__name__.startswith("ParameterServerStrategy")
        if cluster.num_workers > 1 and not (collective or separate):
            raise UsageError(
                LOCAL_STRATEGY.format(
                    strategy=type(own).__name__, workers=cluster.num_workers, program=PROGRAM
                )
            )
        communication = effective = None
        if collective:
            build_device_datasets_without_autotune()
            reduce_sparse_as_dense(own)
            communication = _communication_of(own)
            effective = effective_communication(communication or "AUTO", count_gpus())
        return _Distribution(own, evaluation, type(own).__name__, False, communication, effective)

    def _run_record(
        self, distribution: _Distribution, model_dir: str, max_steps: Optional[int]
    ) -> dict:
        from estimator_dist import driver

        cluster, config = self._cluster, self._config
        train = distribution.train
        return {
            "role": cluster.role,
            "task_type": cluster.task_type,
            "task_index": cluster.task_index,
            "cluster": {name: list(addresses) for name, addresses in cluster.jobs.items()},
            "tf_config_normalisations": list(cluster.notes),
            "num_workers": cluster.num_workers,
            "num_ps": cluster.num_ps,
            "num_replicas": train.num_replicas_in_sync if train is not None else 1,
            "strategy": distribution.name,
            "strategy_class": type(train).__name__ if train is not None else None,
            "strategy_injected": distribution.injected,
            "eval_strategy_class": (
                type(distribution.eval).__name__ if distribution.eval is not None else None
            ),
            "communication_requested": distribution.communication,
            "communication_used": distribution.effective_communication,
            "script": config.path,
            "script_args": list(config.args),
            "model_dir": model_dir,
            "max_steps": max_steps,
            "versions": driver.library_versions(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }


def _override(value: Optional[int], default: int) -> int:
    return default if value is None else value


def _explained(error: BaseException, script: str) -> BaseException:
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


def _local_on_evaluator(extended: type) -> Callable:
    """`CollectiveAllReduceExtended._initialize_strategy` that stays local on the evaluator.

    A MultiWorkerMirroredStrategy built on the evaluator, which is outside the
    cluster, raises `KeyError: 'evaluator'` in TensorFlow 2.15. The evaluator
    trains nothing and is given a local strategy anyway, so the script's own
    strategy is built there as with no TF_CONFIG.
    """
    initialize = extended._initialize_strategy

    def initialize_strategy(self: Any, cluster_resolver: Any, devices: Any) -> None:
        if cluster_resolver.task_type == EVALUATOR and not devices:
            self._initialize_local(cluster_resolver, devices=None)
        else:
            initialize(self, cluster_resolver, devices)

    return initialize_strategy


def run_script(config: ScriptConfig, cluster: ClusterConfig) -> int:
    """Runs the script as this task of the job, with the wrappers installed.

    Args:
      config: The script and the task's settings.
      cluster: This task's validated, normalised cluster configuration.

    Returns:
      The script's exit status: 0 when it finished, or the code it passed to
      `sys.exit`.

    Raises:
      UsageError: for a call that cannot run on this task (exit 2).
      UserCodeError: when the script raised, or on a cluster ended without
        calling train_and_evaluate (exit 5).
      Error: another failure with an exit code of its own.
      tf.errors.OpError: a TensorFlow error that none of these explains.
    """
    from estimator_dist.startup import Startup

    startup = Startup(cluster.role)
    from estimator_dist.guards import enter_task

    startup.mark("imports")
    enter_task(cluster)
    task = ScriptTask(config, cluster, startup)
    sys.argv = [config.path, *config.args]
    sys.path.insert(0, os.path.dirname(config.path))
    status = 0
    raised: Optional[BaseException] = None
    try:
        with task.installed():
            runpy.run_path(config.path, run_name="__main__")
    except SystemExit as exit_:
        status = _exit_status(exit_)
    except KeyboardInterrupt:
        raise
    except BaseException as error:
        raised = error
    # What a wrapper raised decides, even when the script caught it and went on.
    failure = task.failure or (raised and _explained(raised, config.path))
    if failure is not None:
        raise failure
    if status == 0 and cluster.is_distributed and not task.calls:
        raise UserCodeError(
            NO_TRAIN_AND_EVALUATE.format(
                script=_shown(config.path), role=cluster.role, program=PROGRAM
            )
        )
    return status


def _exit_status(exit_: SystemExit) -> int:
    """The status `sys.exit(code)` asks for, as Python computes it."""
    code = exit_.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1


_FLAGS = flags.FlagValues()


def _parse_flags(argv: Sequence[str]) -> List[str]:
    """Parses this module's flags up to the script's path; the rest is the script's."""
    if any(arg in ("-h", "--help", "--helpfull") for arg in argv[1:2]):
        sys.stdout.write(f"{__doc__}\nflags:\n{_FLAGS.get_help()}\n")
        sys.exit(0)
    try:
        rest = _FLAGS(argv)
    except flags.Error as error:
        train.usage_exit(PROGRAM, f"{str(error).rstrip('.')}. Fix the flag and run again.")
    # app.run reads its own settings from the global flags, which the script may
    # define and parse for itself later.
    flags.FLAGS.mark_as_parsed()
    return rest


def main(argv: Sequence[str]) -> int:
    """Entry point: flags, the script and its arguments in; the script's exit status out."""
    if len(argv) < 2:
        train.usage_exit(
            PROGRAM,
            "no script given. Run `python -m estimator_dist.script [flags] train.py "
            "[the script's arguments]`.",
        )
    try:
        cluster = parse_tf_config(os.environ.get("TF_CONFIG"))
        config = config_from_flags(_FLAGS, argv[1], argv[2:])
    except UsageError as error:
        train.usage_exit(PROGRAM, str(error))
    try:
        return run_script(config, cluster)
    except UsageError as error:
        train.usage_exit(PROGRAM, str(error))
    except Error as error:
        from estimator_dist.watchdog import fail

        fail(cluster.role, error.exit_code, str(error))
    return exit_codes.FAILURE


def run() -> None:
    """Console-script entry point."""
    define_flags(_FLAGS)
    # Parsing stops at the script's path: the arguments after it are the script's.
    _FLAGS.set_gnu_getopt(False)
    app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
