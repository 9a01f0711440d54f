"""What a task's exit means: a readable cause, the failure of an attempt, a restart or not.

`describe_exit` names a return code (`exited with code 150 (PEER_FAILURE)`,
`was killed by SIGKILL`); a `Failure` is why an attempt ended, with the exit
code the job ends with if nobody restarts it; `RestartPolicy` decides after
each failed attempt whether a restart of the whole cluster may help: not for
a failure that is not retryable (exit codes 2-9), nor for the same failure
at the same checkpoint step twice, nor beyond the restart budget.
"""

from __future__ import annotations

import dataclasses
import re
import signal
from typing import Optional, Set, Tuple

from estimator_dist.base import exit_codes

#: What `_cause_behind` appends when a lost-peer exit came before its cause.
LOST_PEER = " ({reporter} exited first, with code 150, as it lost this peer)"

#: Parts of a cause that differ between two attempts failing the same way.
_VOLATILE = (
    (re.compile(re.escape(LOST_PEER).replace(r"\{reporter\}", r"\S+")), ""),
    (re.compile(r"\bpid \d+"), "pid #"),
    (re.compile(r"(?<=[\w\]]):\d{2,5}\b"), ":#"),
    (re.compile(r"\b0x[0-9a-fA-F]+\b"), "0x#"),
    (re.compile(r"\bsteps? \d+"), "step #"),
    (re.compile(r"\b\d+(?:\.\d+)?(?= ?(?:ms|s|sec|secs|seconds|minutes)\b)"), "#"),
    (re.compile(r"\b\d+\.\d+\b"), "#"),
)


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why an attempt ended early.

    Attributes:
      cause: One line naming the task and what happened.
      exit_code: The code the launcher exits with if it gives up.
    """

    cause: str
    exit_code: int

    @property
    def retryable(self) -> bool:
        """Whether a restart of the whole cluster may succeed."""
        return exit_codes.is_retryable(self.exit_code)


def normalise_cause(cause: str) -> str:
    """The cause without what differs between two attempts that fail the same way.

    Pids, ports, durations, step numbers (the checkpoint step is compared on
    its own) and which task reported a lost peer first are replaced.

    >>> normalise_cause("chief exited with code 150 (PEER_FAILURE): AbortedError at "
    ...                 "global step 57 after 12.3 s (peer localhost:41234, pid 812)")[43:]
    'AbortedError at global step # after # s (peer localhost:#, pid #)'
    """
    for pattern, replacement in _VOLATILE:
        cause = pattern.sub(replacement, cause)
    return cause


class RestartPolicy:
    """Decides after each failed attempt whether the whole cluster is restarted.

    Args:
      max_restarts: Restarts allowed in all.

    >>> policy = RestartPolicy(max_restarts=3)
    >>> lost = Failure("worker-0 exited with code 150 (PEER_FAILURE)", 150)
    >>> policy.give_up(lost, step=100) is None
    True
    >>> print(policy.give_up(lost, step=100))  # doctest: +NORMALIZE_WHITESPACE
    the same failure (worker-0 exited with code 150 (PEER_FAILURE)) at checkpoint step 100 twice:
    not retrying
    """

    def __init__(self, max_restarts: int) -> None:
        self._max_restarts = max_restarts
        self._attempts = 0
        self._seen: Set[Tuple[str, int]] = set()

    def give_up(self, failure: Failure, step: int) -> Optional[str]:
        """Records a failed attempt; returns why not to restart, or None to restart.

        Args:
          failure: Why the attempt ended.
          step: The latest checkpoint's step once every task stopped.
        """
        self._attempts += 1
        key = (normalise_cause(failure.cause), step)
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
    names = {
        value: name
        for name, value in vars(exit_codes).items()
        if name.isupper() and isinstance(value, int)
    }
    return f"exited with code {code}" + (f" ({names[code]})" if code in names else "")


def exit_code_of(code: int) -> int:
    return 128 - code if code < 0 else code
