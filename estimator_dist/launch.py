"""Start a local multi-worker cluster on this machine, supervise it, restart it.

  python -m estimator_dist.launch --num_workers=2 --evaluator -- \\
      --model_dir=/tmp/run1 --train_steps=500 --communication=RING

Everything after `--` is passed to `estimator_dist.train` on every task; it
is validated once here first, so a bad flag fails before any process starts.

With `--script`, every task runs a whole legacy training script instead, one
that builds its own Estimator and calls `tf.estimator.train_and_evaluate`
(see docs/scripts.md); everything after `--` is then the script's own
arguments:

  python -m estimator_dist.launch --num_workers=2 --evaluator --script=train.py \\
      --communication=RING -- --model_dir=/tmp/run1 --max_steps=500

`--module=trainer.task [--package_path=DIR]` runs a module of a package
instead, as `python -m trainer.task` runs it (relative imports work).

Each task runs `python -m estimator_dist.script` on it, which gives the
estimator the strategy its role needs. The launcher's `--model_dir` is the
directory the script's estimator writes to (where `logs/` goes and the
checkpoint step is read); by default it is the value of the script's own
`--model_dir` (or `--model-dir`, `--job-dir`) argument, and every task fails
at once (exit 2) if its estimator writes elsewhere. The last step is the
`max_steps` of the script's TrainSpec, which each task prints.

The launcher runs the cluster inside a private network namespace when the
system allows it (no port reachable from outside), picks free loopback
ports, starts one process per task with its own TF_CONFIG, prefixes every
output line with the task (`[worker-0]`) and appends it to
`model_dir/logs/<task>.log`.

When any task ends before the job is done, with any exit code, even 0, it
stops every task (SIGTERM, then SIGKILL after --grace_secs). The cause it
reports is that task's, except that a task which only lost a peer (exit
150) makes it wait up to `ROOT_CAUSE_SECS` for the exit of the peer. For a
retryable cause (a signal, or an exit code of 128 or more, see
`estimator_dist.base.exit_codes`) it restarts the whole cluster, which resumes from
the latest checkpoint in the shared model_dir, up to --max_restarts times with
exponential backoff. It gives up at once when the same cause (pids, ports,
timings and steps aside) ends two attempts at the same checkpoint step: a
restart would fail the same way. A training task that exits 0 before the last
step ran out of input (exit 6, not retried). It prints every failed attempt
with its cause, its checkpoint step and the steps it lost, and on success the
final metrics. A failed evaluator is restarted alone while training goes on.

SIGTERM or SIGINT (Ctrl-C) to the launcher stops the job without losing a
step: every task receives SIGTERM, they stop at one global step which the
chief checkpoints (`estimator_dist.guards.preemption`), and the launcher exits 128 +
the signal's number (143, 130); it waits the tasks' `--preemption_grace_secs`
+ 5 s (or --grace_secs, if longer) before it kills them. A SIGKILL of the
launcher ends every task at once: they hold the kernel's parent death signal.

With `--engine=ray --ray_address=HOST:PORT`, the same job runs on an existing
Ray cluster, one Ray actor per task, on distinct nodes by default, supervised
and restarted the same way; it needs a `--model_dir` every node shares (see
`estimator_dist.launcher.ray.engine` and docs/ray.md).
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import tempfile
import time
from typing import Callable, Optional, Sequence, Tuple, TypeVar

import portpicker
from absl import flags

from estimator_dist.base import cli, console, pitfalls
from estimator_dist.base.cluster import LocalCluster, make_local_cluster
from estimator_dist.base.errors import Error, UsageError
from estimator_dist.config import train_flags
from estimator_dist.config.train_args import job_from_args
from estimator_dist.launcher import launch_flags, netns
from estimator_dist.launcher.ray.engine import RayEngine
from estimator_dist.launcher.ray.settings import JobShape
from estimator_dist.launcher.restarts import RestartSettings, run_with_restarts
from estimator_dist.launcher.supervise import Launcher
from estimator_dist.launcher.task_start import start_local_task
from estimator_dist.programs import config as script_lib
from estimator_dist.programs.config import model_dir_of
from estimator_dist.programs.locate import program_report

PROGRAM = "estimator_dist.launch"
_T = TypeVar("_T")

_NUM_WORKERS = flags.DEFINE_integer(
    "num_workers", 2, "Training tasks, the chief included.", lower_bound=1
)
_NUM_PS = flags.DEFINE_integer(
    "num_ps",
    0,
    "Parameter server tasks (with --distribution_strategy=parameter_server).",
    lower_bound=0,
)
_EVALUATOR = flags.DEFINE_boolean(
    "evaluator",
    True,
    "Run an evaluator task, which evaluates each checkpoint and writes the final metrics.",
)
_HOST = flags.DEFINE_string("host", "localhost", "Address the tasks use to reach each other.")
_NETWORK_ISOLATION = flags.DEFINE_boolean(
    "network_isolation",
    True,
    "Run the cluster in a private network namespace, so that no task port is reachable "
    "from outside; if the system refuses, warn and run in the host's network. Turn off "
    "when the tasks must reach the network (remote data or model_dir).",
)
_MAX_RESTARTS = flags.DEFINE_integer(
    "max_restarts",
    3,
    "Whole-cluster restarts from the latest checkpoint after a retryable failure.",
    lower_bound=0,
)
_FINISH_TIMEOUT = flags.DEFINE_float(
    "finish_timeout_secs",
    300,
    "After the first training task finishes, seconds the others (and the evaluator's "
    "final evaluation) may take before the job fails.",
    lower_bound=1,
)
_TIMEOUT = flags.DEFINE_float(
    "timeout_secs",
    0,
    "Stop the job and fail after this many seconds; 0 means no limit.",
    lower_bound=0,
)
_GRACE = flags.DEFINE_float(
    "grace_secs",
    10,
    "Seconds between SIGTERM and SIGKILL when stopping tasks after a failure; after a signal "
    "to the launcher, at least the tasks' --preemption_grace_secs + 5 (their checkpoint).",
    lower_bound=0,
)
_PIN_CORES = flags.DEFINE_boolean(
    "pin_cores",
    True,
    "Give each training task its own share of the cores this launcher may use (round-robin "
    "when tasks outnumber cores), so tasks do not fight over cores and TensorFlow sizes each "
    "task's thread pools to its share; the evaluator and ps tasks use every core. Run the "
    "launcher under `taskset -c ...` to give the job fewer cores.",
)
_VERBOSE = flags.DEFINE_boolean(
    "verbose",
    False,
    "Echo every line every task prints (TensorFlow's deprecation warnings, C++ start-up lines, "
    "Estimator's INFO lines) and the launcher's own log. By default the console shows each "
    "training task's progress line every --log_step_count_steps steps, each evaluation's "
    "metrics, warnings, failures and the launcher's summary; every task's full output is in "
    "model_dir/logs/<task>.log either way, the launcher's own in model_dir/logs/launcher.log.",
)

_SCRIPT = flags.DEFINE_string(
    "script",
    None,
    "A whole training script that builds its own Estimator and calls "
    "tf.estimator.train_and_evaluate; every task runs it (via estimator_dist.script) with "
    "the arguments after `--`, which are then the script's own. See docs/scripts.md.",
)
# The flags of estimator_dist.script, which the launcher passes on to every task.
script_lib.define_flags(flags.FLAGS)
_MODULE, _PACKAGE_PATH = flags.FLAGS["module"], flags.FLAGS["package_path"]

#: First line of a launcher whose tasks run on a Ray cluster.
RAY_NETWORK_MESSAGE = (
    "WARNING: network: the Ray cluster's; TensorFlow's gRPC servers listen on all interfaces "
    "of their nodes without authentication while the job runs: run it only on a network "
    "nobody else can reach"
)


class _Signalled(Exception):
    """The launcher received SIGTERM or SIGINT."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_signalled(signum: int, frame: object) -> None:
    raise _Signalled(signum)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What every task runs, and what the launcher needs to supervise it.

    Attributes:
      module: The module each task runs with `python -m`.
      args: Its arguments, the same on every task.
      model_dir: The job's model_dir: logs, checkpoints, final metrics.
      train_steps: The last step, or None when the tasks print it (a script).
      steps_name: How messages name the setting of the last step.
      report: Pre-flight lines to print before the cluster starts.
      stop_secs: Seconds the tasks may take to stop after the launcher's signal
        (their `--preemption_grace_secs`, plus 5 s to save and exit).
    """

    module: str
    args: Tuple[str, ...]
    model_dir: str
    train_steps: Optional[int]
    steps_name: str
    report: Tuple[str, ...]
    stop_secs: float


def _train_plan(train_args: Sequence[str], shared_model_dir: bool) -> Plan:
    """Validates the flags of `estimator_dist.train` and runs its pre-flight once.

    Args:
      train_args: The flags after `--`.
      shared_model_dir: Whether `--model_dir` must be given (with Ray); without
        it, a temporary directory is used.

    Raises:
      UsageError: for a bad flag, a job that does not fit the cluster, or a
        fatal pitfall.
      Error: when the user's model_fn or input_fn raises in the pre-flight.
    """
    from estimator_dist.config.job import check_batch
    from estimator_dist.task import preflight

    given = [name for name in script_lib.FLAG_NAMES if flags.FLAGS[name].present]
    if given:
        raise UsageError(
            f"--{given[0]} is a flag of --script jobs; for an estimator_dist.train job give "
            f"it after '--' (e.g. `-- --{given[0]}=...`), or pass --script=PATH."
        )

    args = list(train_args)
    if not any(arg.startswith("--model_dir") for arg in args):
        if shared_model_dir:
            raise UsageError(
                "--engine=ray needs --model_dir after '--': a directory every Ray node reads "
                "and writes (a shared file system, gs://...), for the checkpoints, the final "
                "metrics and logs/. Pass e.g. `-- --model_dir=/shared/run1`."
            )
        args.append(f"--model_dir={tempfile.mkdtemp(prefix='estimator_dist-')}")
    job = job_from_args(args)
    # One replica per worker here; each task checks again with its own replicas.
    workers = f"--num_workers={_NUM_WORKERS.value}"
    check_batch(job.batch_size, job.micro_batches, _NUM_WORKERS.value, workers)
    checked = preflight.preflight(job, _NUM_WORKERS.value)
    return Plan(
        train_flags.PROGRAM,
        tuple(args),
        job.run.model_dir,
        job.train_steps,
        "--train_steps",
        tuple(pitfalls.format_report(list(checked.pitfalls)).splitlines()),
        job.preemption_grace_secs + 5,
    )


def _script_plan(script_args: Sequence[str]) -> Plan:
    """Checks the script (or --module) and the flags passed on to `estimator_dist.script`.

    Raises:
      UsageError: for a missing or non-Python script or module, a bad flag, or
        no way to know the program's model_dir.
    """
    config = script_lib.config_from_flags(flags.FLAGS, _SCRIPT.value, script_args)
    model_dir = config.model_dir or model_dir_of(script_args)
    program = f"--module={config.module}" if config.module else f"--script={_SCRIPT.value}"
    if not model_dir:
        raise UsageError(
            f"{program} needs the directory its estimator writes to, for the "
            "job's logs/ and checkpoint step, and none of its arguments names it "
            f"({', '.join(script_lib.MODEL_DIR_ARGS)}). Pass it as --model_dir=DIR before "
            "'--', and give the program the same directory."
        )
    config = dataclasses.replace(config, model_dir=model_dir)
    verdict, _, found = program_report(_SCRIPT.value, config.module, config.package_path)
    return Plan(
        script_lib.PROGRAM,
        tuple(config.to_args()),
        config.model_dir,
        None,
        "max_steps",
        (
            f"{config.module or _SCRIPT.value} (read, not run; every task checks it again "
            f"when it runs): {verdict}",
            *pitfalls.format_report(found).splitlines(),
        ),
        config.preemption_grace_secs + 5,
    )


def _new_cluster(attempt: int) -> LocalCluster:
    """The local cluster of one attempt, on fresh ports."""
    ports = [portpicker.pick_unused_port() for _ in range(_NUM_WORKERS.value + _NUM_PS.value)]
    return make_local_cluster(
        _NUM_WORKERS.value, ports, _NUM_PS.value, _EVALUATOR.value, _HOST.value
    )


def _plan(argv: Sequence[str], shared_model_dir: bool) -> Plan:
    """The job's plan, validated once."""
    if _SCRIPT.value or _MODULE.value or _PACKAGE_PATH.value is not None:
        return _script_plan(argv[1:])
    return _train_plan(argv[1:], shared_model_dir)


def _or_exit(call: Callable[..., _T], *args: object) -> _T:
    """Returns `call(*args)`; a usage error exits 2, another error its code."""
    try:
        return call(*args)
    except UsageError as error:
        cli.usage_exit(PROGRAM, str(error))
    except Error as error:
        sys.stderr.write(f"{PROGRAM}: {error}\n")
        sys.exit(error.exit_code)


def _stop_on_signal(launcher: Launcher, signalled: _Signalled, plan: Plan) -> int:
    """Stops every task at one checkpointed step after SIGTERM/SIGINT; returns 128 + signal."""
    from estimator_dist.base import files

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    grace = max(_GRACE.value, plan.stop_secs)
    launcher.say(
        f"received {signalled}; stopping every task, which stop at one step the chief "
        f"checkpoints (killed if still running in {grace:g} s)"
    )
    launcher.stop(grace)
    launcher.say(
        f"stopped; the latest checkpoint is at step {files.checkpoint_step(plan.model_dir)}"
        "; run the same command to resume from it"
    )
    return 128 + signalled.signum


def main(argv: Sequence[str]) -> int:
    """Validates the job once, runs the cluster, prints the final metrics."""
    console.start_launcher(_VERBOSE.value)  # Before TensorFlow is imported.
    from estimator_dist.base import files
    from estimator_dist.guards.startup import process_started

    ray = _or_exit(launch_flags.ray_settings)  # Before the pre-flight: a missing Ray fails at once.
    isolation = (
        netns.isolate(_HOST.value, _NETWORK_ISOLATION.value) if ray is None else RAY_NETWORK_MESSAGE
    )
    plan = _or_exit(_plan, argv, ray is not None)
    shape = JobShape(_NUM_WORKERS.value, _NUM_PS.value, _EVALUATOR.value)
    engine = None if ray is None else RayEngine(ray, shape)
    launcher = Launcher(
        plan.args,
        plan.model_dir,
        lambda: files.checkpoint_step(plan.model_dir),
        _PIN_CORES.value and engine is None,
        process_started(),
        module=plan.module,
        steps_name=plan.steps_name,
        verbose=_VERBOSE.value,
        start_task=start_local_task if engine is None else engine.start_task,
    )
    for line in (isolation, *plan.report):
        launcher.say(line)
    if engine is not None:
        _or_exit(engine.connect, launcher.say)  # Before the signal handlers: Ray sets its own.
    launcher.say(
        f"{'local cluster' if engine is None else 'Ray cluster'}: {_NUM_WORKERS.value} "
        f"worker(s), {_NUM_PS.value} ps, evaluator: {_EVALUATOR.value}; model_dir {plan.model_dir}"
    )
    settings = RestartSettings(
        _MAX_RESTARTS.value, _FINISH_TIMEOUT.value, _GRACE.value, _EVALUATOR.value
    )
    deadline = time.monotonic() + _TIMEOUT.value if _TIMEOUT.value else None
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, _raise_signalled)
    new_cluster = _new_cluster if engine is None else engine.new_cluster
    try:
        return run_with_restarts(
            launcher, new_cluster, plan.model_dir, plan.train_steps, deadline, settings
        )
    except _Signalled as signalled:
        return _stop_on_signal(launcher, signalled, plan)
    finally:
        if engine is not None:
            engine.close()


def run() -> None:
    """Console-script entry point."""
    cli.run_program(main, PROGRAM)


if __name__ == "__main__":
    run()
