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

import sys
from typing import Callable, Sequence, TypeVar

from absl import flags

from estimator_dist.base.errors import Error, UsageError
from estimator_dist.launcher import launch_flags
from estimator_dist.launcher.launch_flags import define_flags
from estimator_dist.launcher.plan import Plan, script_plan, train_plan
from estimator_dist.launcher.run import run_job
from estimator_dist.programs import config as script_lib
from estimator_dist.report import cli, console
from estimator_dist.storage.location import is_url

PROGRAM = "estimator_dist.launch"
_T = TypeVar("_T")


def _plan(argv: Sequence[str], settings: launch_flags.LaunchSettings, shared: bool) -> Plan:
    """The job's plan, validated once: a whole program's, or `estimator_dist.train`'s."""
    if settings.program:
        config = script_lib.config_from_flags(flags.FLAGS, settings.script, argv[1:])
        return script_plan(config, settings.script, argv[1:])
    return train_plan(argv[1:], settings.shape.num_workers, shared)


def _or_exit(call: Callable[..., _T], *args: object) -> _T:
    """Returns `call(*args)`; a usage error exits 2, another error its code."""
    try:
        return call(*args)
    except UsageError as error:
        cli.usage_exit(PROGRAM, str(error))
    except Error as error:
        sys.stderr.write(f"{PROGRAM}: {error}\n")
        sys.exit(error.exit_code)


def main(argv: Sequence[str]) -> int:
    """Plans the job once, then runs it on its engine and prints the final metrics."""
    console.start_launcher(flags.FLAGS.verbose)  # Before TensorFlow is imported.
    # The engine's flags first: a missing Ray fails before the pre-flight.
    settings = _or_exit(launch_flags.settings_from_flags, flags.FLAGS)
    engine = launch_flags.make_engine(settings)
    # Before the pre-flight starts TensorFlow's threads; a job naming a URL reaches out.
    remote = any(is_url(arg) or is_url(arg.partition("=")[2]) for arg in argv[1:])
    network = engine.prepare(reach_out=remote)
    plan = _or_exit(_plan, argv, settings, engine.needs_shared_model_dir)
    return _or_exit(run_job, plan, engine, settings, [network])


def run() -> None:
    """Console-script entry point."""
    define_flags()
    cli.run_program(main, PROGRAM)


if __name__ == "__main__":
    run()
