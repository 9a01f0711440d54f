"""What a task's exit means: a readable cause, the failure of an attempt, a restart or not.

`describe_exit` names a return code (`exited with code 150 (PEER_FAILURE)`,
`was killed by SIGKILL`); a `Failure` is why an attempt ended, with the exit
code the job ends with if nobody restarts it; `RestartPolicy` decides after
each failed attempt whether a restart of the whole cluster may help: not for
a failure that is not retryable (exit codes 2-9), nor for the same failure
(the same task, exit code and reason, `Failure.kind`) at the same checkpoint
step twice, nor beyond the restart budget.
"""

from __future__ import annotations

import dataclasses
import signal
from typing import Optional, Set, Tuple

from estimator_dist.base import exit_codes

#: What `_cause_behind` appends when a lost-peer exit came before its cause.
LOST_PEER = " ({reporter} exited first, with code 150, as it lost this peer)"


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why an attempt ended early.

    Attributes:
      cause: One line naming the task and what happened, for people.
      exit_code: The code the launcher exits with if it gives up.
      task: The task that failed (`worker-0`), or '' when none alone did.
      reason: What the task said its failure was (`status.Exiting.reason`: the
        error's kind), or the signal that killed it; None when it said nothing.
    """

    cause: str
    exit_code: int
    task: str = ""
    reason: Optional[str] = None

    @property
    def kind(self) -> Tuple[str, int, Optional[str]]:
        """What makes two failures the same: the task, its exit code, the reason it gave."""
        return self.task, self.exit_code, self.reason

    @property
    def retryable(self) -> bool:
        """Whether a restart of the whole cluster may succeed."""
        return exit_codes.is_retryable(self.exit_code)


class RestartPolicy:
    """Decides after each failed attempt whether the whole cluster is restarted.

    Args:
      max_restarts: Restarts allowed in all.

    Two failures are the same when the same task failed with the same exit code
    and reason (`Failure.kind`), typed values the tasks sent: the text people
    read (pids, ports, timings) never decides.

    >>> policy = RestartPolicy(max_restarts=3)
    >>> lost = Failure("worker-0 exited with code 150 (PEER_FAILURE): ...", 150, "worker-0",
    ...                "PeerFailureError")
    >>> policy.give_up(lost, step=100) is None
    True
    >>> print(policy.give_up(lost, step=100))  # doctest: +NORMALIZE_WHITESPACE
    the same failure (worker-0 exited with code 150 (PEER_FAILURE): ...) at checkpoint step 100
    twice: not retrying
    """

    def __init__(self, max_restarts: int) -> None:
        self._max_restarts = max_restarts
        self._attempts = 0
        self._seen: Set[Tuple[Tuple[str, int, Optional[str]], int]] = set()

    def give_up(self, failure: Failure, step: int) -> Optional[str]:
        """Records a failed attempt; returns why not to restart, or None to restart.

        Args:
          failure: Why the attempt ended.
          step: The latest checkpoint's step once every task stopped.
        """
        self._attempts += 1
        key = (failure.kind, step)
        repeated = key in self._seen
        self._seen.add(key)
        if not failure.retryable:
            return "not retryable"
        if repeated:
            return (
                f"the same failure ({failure.cause}) at checkpoint step {step} twice: not retrying"
            )
        if self._attempts > self._max_restarts:
            return "no restarts left"
        return None


def describe_exit(code: int) -> str:
    """Returns a readable cause for a process return code."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    name = exit_codes.name_of(code)
    return f"exited with code {code}" + (f" ({name})" if name else "")


def exit_code_of(code: int) -> int:
    return 128 - code if code < 0 else code
