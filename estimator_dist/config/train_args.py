"""Training flags given as arguments, after a program's `--`, parsed as a task will parse them.

The launcher, `estimator_dist.check` and `estimator_dist.manifest` take the
flags of `estimator_dist.train` after their own `--` and check them once,
before any task starts: an unknown or misspelt flag fails there (exit 2),
not on every task later.

Example:
  >>> job = job_from_args(["--model_dir=/tmp/run", "--train_steps=50"])  # doctest: +SKIP
  >>> job.train_steps  # doctest: +SKIP
  50
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Sequence

from absl import flags

from estimator_dist.base.errors import UsageError
from estimator_dist.config.train_flags import PROGRAM, define_flags, job_from_flags

if TYPE_CHECKING:
    from estimator_dist.config.job import JobConfig


def parse_args(args: Sequence[str]) -> flags.FlagValues:
    """Parses training flags given as arguments (after `--`) as the task will, strictly.

    absl's own flags (`--verbosity`, ...), which every task also takes, parse
    into copies, so this process's own are untouched.

    Raises:
      UsageError: for an unknown flag (with absl's "did you mean"), a bad
        value or a positional argument.
    """
    flag_values = flags.FlagValues()
    define_flags(flag_values)
    for module, defined in flags.FLAGS.flags_by_module_dict().items():
        if module.startswith("absl."):
            for flag in defined:
                flag_values[flag.name] = copy.deepcopy(flag)
    try:
        rest = flag_values([PROGRAM, *args])
    except flags.Error as error:
        raise UsageError(f"training flag after '--': {error}") from None
    if len(rest) > 1:
        raise UsageError(
            f"unexpected positional arguments after '--': {rest[1:]}; {PROGRAM} takes only --flags."
        )
    return flag_values


def job_from_args(args: Sequence[str]) -> JobConfig:
    """Parses training flags given as arguments (those after `--`) into a `JobConfig`.

    Args:
      args: Training flags, such as `["--model_dir=/tmp/m", "--train_steps=10"]`.

    Raises:
      UsageError: for a bad flag or value (see `parse_args`).
    """
    return job_from_flags(parse_args(args))
