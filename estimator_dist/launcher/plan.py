"""The job's plan: what every task runs, validated once before any task starts.

An `estimator_dist.train` job's flags are parsed as every task will parse
them and its pre-flight runs here once (names resolved, the input read, the
model built), so a bad flag or a broken model_fn fails before a process
starts. A `--script`/`--module` job's program is found and read (not run) and
its model_dir decided.

Example:
  >>> plan = train_plan(["--train_steps=10", "--model_dir=/tmp/run"], 2)  # doctest: +SKIP
  >>> plan.module, plan.train_steps  # doctest: +SKIP
  ('estimator_dist.train', 10)
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from typing import Optional, Sequence, Tuple

from estimator_dist.base.errors import UsageError
from estimator_dist.config import train_flags
from estimator_dist.config.job import check_batch
from estimator_dist.config.train_args import job_from_args
from estimator_dist.programs import config as script_lib
from estimator_dist.programs.config import ScriptConfig, model_dir_of
from estimator_dist.programs.locate import program_report
from estimator_dist.storage.job import JobResults
from estimator_dist.task import pitfalls


@dataclasses.dataclass(frozen=True)
class Plan:
    """What every task runs, and what the launcher needs to supervise it.

    Attributes:
      module: The module each task runs with `python -m`.
      args: Its arguments, the same on every task.
      model_dir: The job's model_dir: logs, checkpoints, final metrics.
      storage: The job's `--storage` URL, where its results live while
        model_dir is local on each machine; None otherwise.
      train_steps: The last step, or None when the tasks report it (a script).
      steps_name: How messages name the setting of the last step.
      report: Pre-flight lines to print before the cluster starts.
      stop_secs: Seconds the tasks may take to stop after the launcher's signal
        (their `--preemption_grace_secs`, plus 5 s to save and exit).
    """

    module: str
    args: Tuple[str, ...]
    model_dir: str
    train_steps: Optional[int] = None
    steps_name: str = "--train_steps"
    report: Tuple[str, ...] = ()
    stop_secs: float = 5.0
    storage: Optional[str] = None

    @functools.cached_property
    def results(self) -> JobResults:
        """The job's results, where they live: model_dir, or the storage URL."""
        return JobResults(self.model_dir, self.storage)

    def checkpoint_step(self) -> int:
        """The global step of the latest checkpoint of the job, 0 if none."""
        return self.results.checkpoint_step()


def train_plan(train_args: Sequence[str], num_workers: int, shared_model_dir: bool) -> Plan:
    """Validates the flags of `estimator_dist.train` and runs its pre-flight once.

    Args:
      train_args: The flags after `--`.
      num_workers: Training tasks, the chief included.
      shared_model_dir: Whether `--model_dir` must be given (tasks on other
        machines); without it, a temporary directory is used.

    Raises:
      UsageError: for a bad flag, a job that does not fit the cluster, or a
        fatal pitfall.
      Error: when the user's model_fn or input_fn raises in the pre-flight.
    """
    from estimator_dist.task import preflight

    args = list(train_args)
    if not any(arg.startswith("--model_dir") for arg in args):
        if shared_model_dir:
            raise UsageError(
                "--engine=ray needs --model_dir after '--': a directory every Ray node reads "
                "and writes (a shared file system, gs://...), or object storage (s3://...), "
                "for the checkpoints, the final metrics and logs/. Pass e.g. "
                "`-- --model_dir=/shared/run1` or `-- --model_dir=s3://bucket/run1`."
            )
        args.append(f"--model_dir={tempfile.mkdtemp(prefix='estimator_dist-')}")
    job = job_from_args(args)
    # One replica per worker here; each task checks again with its own replicas.
    check_batch(job.batch_size, job.micro_batches, num_workers, f"--num_workers={num_workers}")
    JobResults(job.run.model_dir, job.storage).check()  # Credentials and bucket, before any task.
    checked = preflight.preflight(job, num_workers)
    return Plan(
        train_flags.PROGRAM,
        tuple(args),
        job.run.model_dir,
        job.train_steps,
        "--train_steps",
        tuple(pitfalls.format_report(list(checked.pitfalls)).splitlines()),
        job.guards.preemption_grace_secs + 5,
        job.storage,
    )


def script_plan(config: ScriptConfig, script: Optional[str], script_args: Sequence[str]) -> Plan:
    """Checks the script (or --module) and decides the job's model_dir.

    Args:
      config: The flags of `estimator_dist.script` the tasks receive.
      script: `--script`, or None for `--module`.
      script_args: The program's own arguments (after `--`).

    Raises:
      UsageError: for a missing or non-Python script or module, or no way to
        know the program's model_dir.
    """
    model_dir = config.model_dir or model_dir_of(script_args)
    program = f"--module={config.module}" if config.module else f"--script={script}"
    if not model_dir:
        raise UsageError(
            f"{program} needs the directory its estimator writes to, for the "
            "job's logs/ and checkpoint step, and none of its arguments names it "
            f"({', '.join(script_lib.MODEL_DIR_ARGS)}). Pass it as --model_dir=DIR before "
            "'--', and give the program the same directory."
        )
    config = config.working_in(model_dir)
    JobResults(model_dir, config.storage).check()  # Credentials and bucket, before any task.
    verdict, _, found = program_report(script, config.module, config.package_path)
    return Plan(
        script_lib.PROGRAM,
        tuple(config.to_args()),
        config.model_dir,
        None,
        "max_steps",
        (
            f"{config.module or script} (read, not run; every task checks it again "
            f"when it runs): {verdict}",
            *pitfalls.format_report(found).splitlines(),
        ),
        config.guards.preemption_grace_secs + 5,
        config.storage,
    )
