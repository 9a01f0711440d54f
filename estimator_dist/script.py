"""Run a whole legacy Estimator training script, unchanged, as one task of a job.

  python -m estimator_dist.script [--communication=RING] train.py --model_dir=/shared/run1
  python -m estimator_dist.script --module=trainer.task [--package_path=DIR] -- --job-dir=DIR

The script is one that builds its own Estimator and calls
`tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)` itself.
`python -m estimator_dist.launch --script=train.py` runs this module on every
task of a local cluster; a platform that writes TF_CONFIG itself (Kubeflow
TFJob, Vertex AI, SageMaker) runs it as each task's command; with no
TF_CONFIG it runs the script in this one process. The flags before the script's
path are this module's; everything after it is the script's own arguments.
With `--module`, the program is a module of a package, run as `python -m`
runs it (`runpy.run_module`, `--package_path` first on `sys.path`, so
relative imports work), and everything after `--` is its arguments.

Before the script runs, TF_CONFIG is validated and normalised
(`estimator_dist.cluster.tf_config`: `master` becomes `chief`, an `evaluator` listed in
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
  then all-reduces sparse gradients as dense tensors, `estimator_dist.tf_runtime.patches`);
* checks that the cluster agrees before TensorFlow starts its servers
  (`estimator_dist.guards.rendezvous`), adds the fail-fast watchdogs of
  `estimator_dist.guards.watchdog` and the preemption checkpoint of
  `estimator_dist.guards.preemption`, wraps the script's input functions as
  `estimator_dist.train` does (`user_code.present_input_fn`), makes the
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

import os
import runpy
import sys
from typing import List, Optional, Sequence, Tuple

from absl import app, flags

from estimator_dist.base import exit_codes
from estimator_dist.base.errors import Error, UsageError, UserCodeError
from estimator_dist.cluster.platform_env import cluster_from_environment
from estimator_dist.cluster.tf_config import ClusterConfig
from estimator_dist.programs.config import PROGRAM, ScriptConfig, config_from_flags, define_flags
from estimator_dist.report import cli
from estimator_dist.report.status import Exiting, connect, emit

#: A script that ends on a task of a cluster without training.
NO_TRAIN_AND_EVALUATE = (
    "the script {script} ended without calling tf.estimator.train_and_evaluate(estimator, "
    "train_spec, eval_spec) nor an Estimator's train(), evaluate() or export_saved_model(): "
    "task {role} had nothing to run, the calls {program} distributes. Make sure no argument "
    "or condition skips them on this task."
)


def run_script(config: ScriptConfig, cluster: ClusterConfig) -> Tuple[int, Optional[str]]:
    """Runs the script as this task of the job, with the wrappers installed.

    Args:
      config: The script and the task's settings.
      cluster: This task's validated, normalised cluster configuration.

    Returns:
      The script's exit status (0 when it finished, or the code it passed to
      `sys.exit`), and `status.NO_EVALUATION` for an evaluator that had no part
      in the program, else None.

    Raises:
      UsageError: for a call that cannot run on this task (exit 2).
      UserCodeError: when the script raised, or on a cluster ended without
        calling train_and_evaluate (exit 5).
      Error: another failure with an exit code of its own.
      tf.errors.OpError: a TensorFlow error that none of these explains.
    """
    from estimator_dist.guards.roles import enter_task
    from estimator_dist.guards.startup import Startup
    from estimator_dist.programs.task import ScriptTask
    from estimator_dist.programs.user import explained, shown
    from estimator_dist.tf_runtime import patches

    startup = Startup(cluster.role)
    startup.mark("imports")
    # A program runs as plain TensorFlow runs it, eagerly unless it says otherwise; its
    # strategies are set up for Estimator's graphs (`tf_runtime.patches`, patch 5).
    enter_task(cluster, graph_mode=False)
    patches.install()
    task = ScriptTask(config, cluster, startup)
    # What `python train.py` or `python -m trainer.task` gives the program.
    sys.argv = [config.path, *config.args]
    sys.path.insert(0, config.package_path or os.path.dirname(config.path))
    if config.module:
        _check_not_shadowed(config.module, config.package_path)
    status = 0
    raised: Optional[BaseException] = None
    try:
        with task.installed():
            if config.module:
                runpy.run_module(config.module, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(config.path, run_name="__main__")
    except SystemExit as exit_:
        status = _exit_status(exit_)
    except KeyboardInterrupt:
        raise
    except BaseException as error:
        raised = error
    # What a wrapper raised decides, even when the script caught it and went on.
    failure = task.failure or (raised and explained(raised, config.path))
    if failure is not None:
        raise failure
    if status == 0:
        task.loop.finish()
    if status == 0 and cluster.is_distributed and not task.took_part:
        raise UserCodeError(
            NO_TRAIN_AND_EVALUATE.format(
                script=shown(config.path), role=cluster.role, program=PROGRAM
            )
        )
    return status, task.exit_reason


def _check_not_shadowed(module: str, package_path: Optional[str]) -> None:
    """Refuses a module whose top-level package this process already imported from elsewhere.

    Raises:
      UsageError: naming both places; runpy would run the other package's module.
    """
    top = module.split(".")[0]
    loaded = sys.modules.get(top)
    if loaded is None:
        return
    where = list(getattr(loaded, "__path__", [])) or [getattr(loaded, "__file__", None) or top]
    if not any(os.path.abspath(str(p)).startswith(str(package_path) + os.sep) for p in where):
        raise UsageError(
            f"--module={module}: the package {top} is already imported from {where[0]} by "
            f"{PROGRAM} itself, so the one under --package_path={package_path} cannot be run; "
            "expected a top-level package name of your own: rename the package."
        )


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
        cli.usage_exit(PROGRAM, f"{str(error).rstrip('.')}. Fix the flag and run again.")
    # app.run reads its own settings from the global flags, which the script may
    # define and parse for itself later.
    flags.FLAGS.mark_as_parsed()
    return rest


def main(argv: Sequence[str]) -> int:
    """Entry point: flags, the script and its arguments in; the script's exit status out."""
    connect()  # Under a launcher, its heartbeat starts before the imports, which take seconds.
    if len(argv) < 2 and not _FLAGS.module:
        cli.usage_exit(
            PROGRAM,
            "no script given. Run `python -m estimator_dist.script [flags] train.py "
            "[the script's arguments]`, or `python -m estimator_dist.script [flags] "
            "--module=trainer.task -- [the module's arguments]`.",
        )
    try:
        cluster = cluster_from_environment(os.environ)
        # With --module, every argument left is the module's own.
        path, args = (None, argv[1:]) if _FLAGS.module else (argv[1], argv[2:])
        config = config_from_flags(_FLAGS, path, args)
    except UsageError as error:
        cli.usage_exit(PROGRAM, str(error))
    try:
        code, reason = run_script(config, cluster)
    except UsageError as error:
        cli.usage_exit(PROGRAM, str(error))
    except Error as error:
        from estimator_dist.guards.watchdog import fail

        fail(cluster.role, error.exit_code, str(error), type(error).__name__)
        return exit_codes.FAILURE
    emit(Exiting(exit_code=code, reason=reason))
    return code


def run() -> None:
    """Console-script entry point."""
    define_flags(_FLAGS)
    # Parsing stops at the script's path: the arguments after it are the script's.
    _FLAGS.set_gnu_getopt(False)
    app.run(main, flags_parser=_parse_flags)


if __name__ == "__main__":
    run()
