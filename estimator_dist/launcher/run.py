"""Run a planned job on an engine: supervise it, restart it, stop it on a signal.

`run_job` is the launcher's one call once the job is planned and its engine
chosen: it joins the engine, runs attempts until the job succeeds or gives up
(`restarts.run_with_restarts`), and on SIGTERM or SIGINT stops every task at
one step the chief checkpoints, exiting 128 + the signal's number.

Example:
  >>> code = run_job(plan, LocalEngine(JobShape(2, 0, True)), settings, [])  # doctest: +SKIP
"""

from __future__ import annotations

import signal
import time
from typing import Sequence

from estimator_dist.launcher.engine import Engine
from estimator_dist.launcher.launch_flags import LaunchSettings
from estimator_dist.launcher.plan import Plan
from estimator_dist.launcher.restarts import run_with_restarts
from estimator_dist.launcher.supervise import Launcher


class _Signalled(Exception):
    """The launcher received SIGTERM or SIGINT."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_signalled(signum: int, frame: object) -> None:
    raise _Signalled(signum)


def run_job(plan: Plan, engine: Engine, settings: LaunchSettings, first: Sequence[str]) -> int:
    """Runs the job until it succeeds, gives up, or the launcher is signalled.

    Args:
      plan: What every task runs.
      engine: Where the tasks run; closed at the end.
      settings: The launcher's settings.
      first: Lines to print before the plan's report (the engine's network line).

    Returns:
      The job's exit code: 0, a failure's, or 128 + the signal that stopped it.

    Raises:
      Error: when the engine cannot be joined.
    """
    from estimator_dist.guards.startup import process_started  # It imports TensorFlow.

    launcher = Launcher(plan, engine, started=process_started(), verbose=settings.verbose)
    for line in (*first, *plan.report):
        launcher.say(line)
    try:
        engine.connect(launcher.say)  # Before the signal handlers: Ray sets its own.
        shape = settings.shape
        launcher.say(
            f"{engine.kind}: {shape.num_workers} worker(s), {shape.num_ps} ps, evaluator: "
            f"{shape.evaluator}; model_dir {plan.model_dir}"
        )
        if plan.results.synced:
            launcher.say(
                f"results at {plan.results.where}: each task trains in a local directory and "
                f"uploads there; logs in {plan.results.local_dir}/logs, uploaded at the end"
            )
        deadline = time.monotonic() + settings.timeout_secs if settings.timeout_secs else None
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, _raise_signalled)
        try:
            return run_with_restarts(
                launcher,
                engine.new_cluster,
                plan.results,
                plan.train_steps,
                deadline,
                settings.restarts,
            )
        except _Signalled as signalled:
            return _stop_on_signal(launcher, signalled, plan, settings.restarts.grace_secs)
    finally:
        engine.close()


def _stop_on_signal(launcher: Launcher, signalled: _Signalled, plan: Plan, grace: float) -> int:
    """Stops every task at one checkpointed step after SIGTERM/SIGINT; returns 128 + signal."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    grace = max(grace, plan.stop_secs)
    launcher.say(
        f"received {signalled}; stopping every task, which stop at one step the chief "
        f"checkpoints (killed if still running in {grace:g} s)"
    )
    launcher.stop(grace)
    launcher.say(
        f"stopped; the latest checkpoint is at step {plan.checkpoint_step()}"
        "; run the same command to resume from it"
    )
    return 128 + signalled.signum
