"""Run a cluster until it succeeds or its failure is not worth a restart.

`run_with_restarts` is the launcher's whole-job loop, kept apart from how the
tasks are started: it takes a `Launcher` (which starts, supervises and stops
the task processes) and a function that makes the cluster of each attempt
(fresh ports every time), so another engine can reuse it with its own
(`estimator_dist.launcher.ray.engine`: fresh actors and ports on the nodes alive). Each
failed attempt is stopped whole, the checkpoint step is read, and
`RestartPolicy` decides whether to restart from it (with a backoff of 1, 2,
4 ... 30 s) or give up with the failure's exit code.

Example:
  >>> settings = RestartSettings(max_restarts=3, finish_timeout=300, grace_secs=10,
  ...                            evaluator=True)
  >>> code = run_with_restarts(launcher, lambda attempt: cluster, "/tmp/run", 400,
  ...                          None, settings)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import glob
import os
import shutil
import time
from typing import Callable, Dict, List, Optional, Union

from estimator_dist.base import exit_codes
from estimator_dist.base.errors import Error
from estimator_dist.cluster.tf_config import LocalCluster
from estimator_dist.launcher.exits import RestartPolicy
from estimator_dist.launcher.supervise import Launcher
from estimator_dist.storage.job import JobResults


@dataclasses.dataclass(frozen=True)
class RestartSettings:
    """How long to wait for a job, and how often to restart it.

    Attributes:
      max_restarts: Whole-cluster restarts after retryable failures.
      finish_timeout: Seconds the other tasks may take after the first
        training task finishes.
      grace_secs: Seconds between SIGTERM and SIGKILL when stopping tasks.
      evaluator: Whether the job has an evaluator, which must write the
        final metrics.
    """

    max_restarts: int
    finish_timeout: float
    grace_secs: float
    evaluator: bool


@dataclasses.dataclass(frozen=True)
class FailedAttempt:
    """What the summary says of one failed attempt.

    Attributes:
      index: The attempt, 0 first.
      cause: Why it failed.
      step: The latest checkpoint's step once every task stopped.
      seen: The highest step a training task reported on its status channel.
      reason: Why the job was not restarted, or None when it was.
    """

    index: int
    cause: str
    step: int
    seen: int
    reason: Optional[str]

    def line(self, resumed: Optional[int]) -> str:
        """The summary's line; `resumed`: the chief's first step in the next attempt, if known.

        The next attempt's chief says where training resumed (its `FirstStep`
        event); below the checkpoint step read after the failure, the job fell
        back past a checkpoint it could not load, and the steps lost count from
        there.

        >>> FailedAttempt(0, "worker-0 was killed by SIGKILL", 300, 340, None).line(200)
        'restart after attempt 0: worker-0 was killed by SIGKILL; resumed at global step 200 \
(checkpoint step 300 was not used), 140 step(s) lost'
        """
        if self.reason is not None:
            return (
                f"attempt {self.index}: {self.cause}; not restarted ({self.reason}); latest "
                f"checkpoint step {self.step}, {max(0, self.seen - self.step)} step(s) lost"
            )
        if resumed is None or resumed >= self.step:
            where, step = f"resumed from checkpoint step {self.step}", self.step
        else:
            where = f"resumed at global step {resumed} (checkpoint step {self.step} was not used)"
            step = resumed
        return (
            f"restart after attempt {self.index}: {self.cause}; {where}, "
            f"{max(0, self.seen - step)} step(s) lost"
        )


def run_with_restarts(
    launcher: Launcher,
    new_cluster: Callable[[int], LocalCluster],
    model_dir: Union[str, JobResults],
    train_steps: Optional[int],
    deadline: Optional[float],
    settings: RestartSettings,
) -> int:
    """Starts the cluster, supervises it and restarts it until it succeeds or gives up.

    Args:
      launcher: Starts, supervises and stops the tasks; prints the summary.
      new_cluster: The cluster of attempt N (0 first). An `Error` it raises
        ends the job with the error's exit code.
      model_dir: The job's model_dir, where checkpoints and metrics are read, or
        its `JobResults` when they live at a storage URL.
      train_steps: The last step, or None when the tasks report it (`StopStep` events).
      deadline: `time.monotonic()` at which the job fails, or None.
      settings: Timeouts and the restart budget.

    Returns:
      The job's exit code: 0, or that of the failure that ended it.
    """
    started = time.monotonic()
    attempts: List[FailedAttempt] = []
    results = model_dir if isinstance(model_dir, JobResults) else JobResults(model_dir)
    try:
        try:
            failed = _run_attempts(
                launcher, new_cluster, results, train_steps, deadline, settings, attempts
            )
        except BaseException:  # A signal to the launcher: say what came before it.
            _say_attempts(launcher, attempts)
            raise
        if failed is not None:
            return failed
        return _finish(launcher, results, settings, started, attempts)
    finally:
        _upload_logs(launcher, results)


def _upload_logs(launcher: Launcher, results: JobResults) -> None:
    """Uploads the task logs under the storage URL; a failure is said, never fatal."""
    try:
        results.upload_logs()
    except Exception as error:  # The storage's errors are many; the job's result stands.
        launcher.say(f"could not upload the logs to {results.where}/logs: {error}")


def backoff_secs(attempt: int) -> float:
    """Seconds to wait before restarting after failed attempt `attempt` (0 first).

    Doubles from 1 s, capped at 30 s:

    >>> [backoff_secs(attempt) for attempt in range(7)]
    [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    """
    return min(2.0**attempt, 30.0)


def _run_attempts(
    launcher: Launcher,
    new_cluster: Callable[[int], LocalCluster],
    results: JobResults,
    train_steps: Optional[int],
    deadline: Optional[float],
    settings: RestartSettings,
    attempts: List[FailedAttempt],
) -> Optional[int]:
    """Runs attempts until one succeeds (None) or the job gives up (its exit code, summary said).

    Appends each failed attempt to `attempts`: its cause, the checkpoint step
    it left and the highest step a training task reported on its status
    channel (the steps lost past that checkpoint are a lower bound, as tasks
    report their step every `--log_step_count_steps`).
    """
    policy = RestartPolicy(settings.max_restarts)  # It ends the loop: no restarts left.
    attempt = 0
    while True:
        try:
            cluster = new_cluster(attempt)
        except Error as error:  # No cluster to run on, such as too few Ray nodes left.
            _say_attempts(launcher, attempts)
            launcher.say(f"job failed: {error}; {len(attempts)} failed attempt(s)")
            return error.exit_code
        launcher.start(cluster.tasks, attempt)
        failure = launcher.supervise(
            deadline,
            train_steps,
            settings.finish_timeout,
            evaluator_restarts=settings.max_restarts,
        )
        launcher.failed_at = time.monotonic()
        launcher.stop(settings.grace_secs)
        if failure is None:
            return None
        launcher.say(f"attempt {attempt} failed: {failure.cause}; stopped every task")
        step = launcher.checkpoint_step()
        reason = policy.give_up(failure, step)
        attempts.append(
            FailedAttempt(attempt, failure.cause, step, launcher.last_step_seen, reason)
        )
        if reason is not None:
            _say_attempts(launcher, attempts)
            launcher.say(f"job failed ({reason}); {len(attempts)} failed attempt(s)")
            return failure.exit_code
        _clear_preemption(results)
        backoff = backoff_secs(attempt)
        launcher.say(
            f"restarting the whole cluster from checkpoint step {step} in {backoff:g} s "
            f"(restart {attempt + 1} of at most {settings.max_restarts})"
        )
        time.sleep(backoff)
        attempt += 1


def _say_attempts(launcher: Launcher, attempts: List[FailedAttempt]) -> None:
    """Prints one line per failed attempt, and per restart of the evaluator alone."""
    resumed: Dict[int, int] = launcher.resumed_steps
    for attempt in attempts:
        launcher.say(attempt.line(resumed.get(attempt.index + 1)))
    for line in launcher.evaluator_restarts:
        launcher.say(f"evaluator restarted alone after: {line}")


def _finish(
    launcher: Launcher,
    results: JobResults,
    settings: RestartSettings,
    started: float,
    attempts: List[FailedAttempt],
) -> int:
    """After the attempt that succeeded: the summary and the final metrics."""
    from estimator_dist.base import files

    for path in glob.glob(os.path.join(results.local_dir, "tmp_worker_*")):
        shutil.rmtree(path, ignore_errors=True)
    launcher.say(f"job finished in {time.monotonic() - started:.1f} s")
    _say_attempts(launcher, attempts)
    metrics = results.final_metrics()
    if metrics is not None:
        launcher.say(f"final evaluation: {files.format_metrics(metrics)}")
    elif launcher.nothing_evaluated:
        launcher.say("the program evaluated nothing: the evaluator had no part in it")
    elif settings.evaluator:
        launcher.say(f"the evaluator wrote no final metrics to {results.where}")
        return exit_codes.FAILURE
    return exit_codes.OK


def _clear_preemption(results: JobResults) -> None:
    """Removes the stopped attempt's preemption requests and decision before a restart.

    A chief stopped while a peer was gone may leave a decision to stop at a
    step past the latest checkpoint, which a restarted worker reading it
    before the new chief clears the directory would obey: every task of that
    attempt is stopped now, so none of its files means anything any more.
    """
    from estimator_dist.guards.preemption import PREEMPTION_DIR

    results.remove(PREEMPTION_DIR)
