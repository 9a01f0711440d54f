"""The guards of a task: its time bounds and the preemption checkpoint, for every kind of job.

`GuardConfig` is nested in the configuration of every program that runs a
task (`estimator_dist.config.job.JobConfig` for named functions,
`estimator_dist.programs.config.ScriptConfig` for a whole program), so each
setting and its flag are declared once. No TensorFlow import.

>>> GuardConfig(stall_timeout=30).startup_timeout
600.0
"""

from __future__ import annotations

import dataclasses

from estimator_dist.base.settings import check_bounds, setting


@dataclasses.dataclass(frozen=True)
class GuardConfig:
    """What keeps a task from hanging or losing work (`estimator_dist.guards`).

    Attributes:
      startup_timeout: Seconds a training task may take to complete its first
        step, cluster assembly included, before it fails (exit 151).
      stall_timeout: Seconds without a completed training step before the task
        fails (exit 152); also the bound of session creation (exit 157) and of
        the end of training (exit 158); on the evaluator, seconds without a new
        checkpoint while the chief is unreachable.
      heartbeat_timeout: Seconds a training peer may leave the heartbeat
        unanswered while this task trains (exit 156); 0 turns it off.
      preemption_checkpoint: Stop every task at one checkpointed step on
        SIGTERM/SIGINT (`estimator_dist.guards.preemption`); False leaves the
        signals' default.
      preemption_grace_secs: Seconds from SIGTERM/SIGINT to a forced exit 155;
        keep it below the platform's grace period.
    """

    startup_timeout: float = setting(
        600.0,
        "Seconds for the cluster to assemble and run the first step before a training "
        "task fails (exit 151), naming the peers it cannot reach.",
        lower_bound=1.0,
    )
    stall_timeout: float = setting(
        120.0,
        "Seconds without a completed training step before a training task fails "
        "(exit 152); also the bound of session creation up to the first step (exit 157) "
        "and of the end of training without progress (exit 158); on the evaluator, "
        "seconds without a new checkpoint while the chief is unreachable.",
        lower_bound=1.0,
    )
    heartbeat_timeout: float = setting(
        15.0,
        "Seconds a training peer may leave this task's heartbeat (UDP datagrams on its gRPC "
        "port's number) unanswered while training runs before the task fails (exit 156): a "
        "frozen peer or a cut network, noticed long before --stall_timeout. 0 turns it off.",
        lower_bound=0.0,
    )
    preemption_checkpoint: bool = setting(
        True,
        "On SIGTERM or SIGINT, stop every task at one global step and checkpoint it (exit "
        "155); --nopreemption_checkpoint leaves the signals' default (and a program's own "
        "handlers).",
    )
    preemption_grace_secs: float = setting(
        25.0,
        "On SIGTERM or SIGINT every task stops at one global step, the chief checkpoints it "
        "and all exit 155 (retryable, no step lost); this many seconds after the signal a "
        "task exits even if the job could not stop. Keep it below the platform's grace "
        "period (Kubernetes terminationGracePeriodSeconds, default 30).",
        lower_bound=1.0,
    )

    def __post_init__(self) -> None:
        check_bounds(self)
