"""When the evaluator evaluates: its first evaluation's delay and the least time between two.

`EvaluationConfig` is nested in the configuration of every program that runs
a job (`estimator_dist.config.job.JobConfig`,
`estimator_dist.programs.config.ScriptConfig`), so its flags are declared
once. A value left unset keeps the EvalSpec's: a program's own (TensorFlow's
defaults are 120 s and 600 s), or for a named-functions job
`NAMED_START_DELAY_SECS` and `NAMED_THROTTLE_SECS`. No TensorFlow import.

>>> EvaluationConfig(throttle_secs=1).or_else(120, 600)
(120, 1)
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from estimator_dist.base.settings import check_bounds, setting

#: A named-functions job's EvalSpec start_delay_secs: the evaluator starts on the first checkpoint.
NAMED_START_DELAY_SECS = 0
#: A named-functions job's EvalSpec throttle_secs.
NAMED_THROTTLE_SECS = 5


@dataclasses.dataclass(frozen=True)
class EvaluationConfig:
    """The evaluator's timing, over the EvalSpec's.

    Attributes:
      start_delay_secs: Seconds before the first evaluation, or None for the
        EvalSpec's.
      throttle_secs: Least seconds between two evaluations, or None for the
        EvalSpec's. A checkpoint at the last step is evaluated at once,
        whatever its value.
    """

    start_delay_secs: Optional[int] = setting(
        None,
        "Seconds the evaluator waits before its first evaluation (EvalSpec start_delay_secs). "
        f"Default: the program's EvalSpec (TensorFlow's default 120), {NAMED_START_DELAY_SECS} "
        "for estimator_dist.train.",
        kind="integer",
        flag="eval_start_delay_secs",
        lower_bound=0,
    )
    throttle_secs: Optional[int] = setting(
        None,
        "Least seconds between two evaluations (EvalSpec throttle_secs); a checkpoint at the "
        "last step is evaluated at once, whatever its value. Default: the program's EvalSpec "
        f"(TensorFlow's default 600), {NAMED_THROTTLE_SECS} for estimator_dist.train.",
        kind="integer",
        flag="eval_throttle_secs",
        lower_bound=0,
    )

    def __post_init__(self) -> None:
        check_bounds(self)

    def or_else(self, start_delay_secs: int, throttle_secs: int) -> Tuple[int, int]:
        """The start delay and throttle to use, the given ones where this config sets none."""
        return (
            start_delay_secs if self.start_delay_secs is None else self.start_delay_secs,
            throttle_secs if self.throttle_secs is None else self.throttle_secs,
        )
