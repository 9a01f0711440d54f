"""What `estimator_dist.script` runs: the script, its arguments and the task's settings.

Its flags live on their own `FlagValues` (`define_flags`), because a script
that uses absl defines and parses its own flags on the global ones; the
launcher defines them too and passes them on (`ScriptConfig.to_args`). No
TensorFlow import here: the launcher reads this before starting any task.

>>> config = ScriptConfig(__file__, ["--max_steps=10"], communication="ring")
>>> config.to_args()[:2]
['--communication=RING', '--startup_timeout=600.0']
"""

from __future__ import annotations

import dataclasses
import os
from typing import List, Optional, Sequence, Tuple

from absl import flags

from estimator_dist.base.errors import UsageError
from run_config.names import COMMUNICATIONS

PROGRAM = "estimator_dist.script"

#: Starts the line each task prints when the script calls train_and_evaluate;
#: the launcher reads the last step from it.
MAX_STEPS_MARKER = "estimator_dist.script: training to max_steps="

#: Names of the flags `define_flags` defines, in the order they are passed on.
FLAG_NAMES = (
    "model_dir",
    "communication",
    "collective_timeout",
    "startup_timeout",
    "stall_timeout",
    "eval_start_delay_secs",
    "eval_throttle_secs",
    "preemption_checkpoint",
    "preemption_grace_secs",
)


def define_flags(flag_values: flags.FlagValues) -> None:
    """Defines this module's flags on `flag_values` (the launcher defines them too).

    They live on their own `FlagValues` in this module, not on `flags.FLAGS`:
    a script that uses absl defines and parses its own flags there.
    """
    f = flag_values
    flags.DEFINE_string(
        "model_dir",
        None,
        "The directory the script's estimator writes to (its RunConfig or Estimator "
        "model_dir). When given, a task whose estimator uses another one fails at once "
        "(exit 2). The launcher writes logs/ there and reads the checkpoint step from it.",
        flag_values=f,
    )
    flags.DEFINE_enum(
        "communication",
        "AUTO",
        COMMUNICATIONS,
        "Collective implementation of the MultiWorkerMirroredStrategy given to a script "
        "whose RunConfig sets no train_distribute; NCCL needs GPUs, RING runs anywhere.",
        case_sensitive=False,
        flag_values=f,
    )
    flags.DEFINE_float(
        "collective_timeout",
        0,
        "Seconds a collective of the given strategy may wait for its peers; 0 waits forever "
        "(see estimator_dist.train --helpfull).",
        lower_bound=0.0,
        flag_values=f,
    )
    flags.DEFINE_float(
        "startup_timeout",
        600,
        "Seconds for the cluster to assemble and run the first step before a training "
        "task fails (exit 151).",
        lower_bound=1.0,
        flag_values=f,
    )
    flags.DEFINE_float(
        "stall_timeout",
        120,
        "Seconds the global step may stay the same before a training task fails (exit 152); "
        "on the evaluator, seconds without a new checkpoint while the chief is unreachable.",
        lower_bound=1.0,
        flag_values=f,
    )
    flags.DEFINE_integer(
        "eval_start_delay_secs",
        None,
        "Replaces the script's EvalSpec start_delay_secs (TensorFlow's default: 120 s).",
        lower_bound=0,
        flag_values=f,
    )
    flags.DEFINE_integer(
        "eval_throttle_secs",
        None,
        "Replaces the script's EvalSpec throttle_secs (TensorFlow's default: 600 s). The "
        "evaluator may wait this long after training ends before its final evaluation.",
        lower_bound=0,
        flag_values=f,
    )
    flags.DEFINE_boolean(
        "preemption_checkpoint",
        True,
        "On SIGTERM or SIGINT, stop every task at one global step and checkpoint it (exit "
        "155), as estimator_dist.train does; --nopreemption_checkpoint leaves the signals to "
        "the script.",
        flag_values=f,
    )
    flags.DEFINE_float(
        "preemption_grace_secs",
        25,
        "Seconds after SIGTERM or SIGINT at which a task exits 155 even if the job could not "
        "stop at one step. Keep it below the platform's grace period.",
        lower_bound=1.0,
        flag_values=f,
    )


def check_script(path: str) -> str:
    """Checks that `path` is a readable Python file; returns its absolute path.

    Raises:
      UsageError: naming the path, what is wrong and the fix.
    """
    absolute = os.path.abspath(path)
    if not os.path.exists(absolute):
        raise UsageError(
            f"--script={path} does not exist (looked for {absolute}). Give the path of the "
            "training script, relative to the current directory or absolute."
        )
    if not os.path.isfile(absolute):
        raise UsageError(f"--script={path} is not a file; give the training script's .py file.")
    try:
        with open(absolute, "rb") as stream:
            compile(stream.read(), absolute, "exec")
    except OSError as error:
        raise UsageError(f"--script={path} cannot be read: {error.strerror}.") from None
    except (SyntaxError, ValueError) as error:
        line = getattr(error, "lineno", None)
        raise UsageError(
            f"--script={path} is not a Python script"
            f"{f' (line {line}: {error.msg})' if line else f' ({error})'}; give the "
            "training script's .py file."
        ) from None
    return absolute


@dataclasses.dataclass(frozen=True)
class ScriptConfig:
    """A legacy script to run on a task, and what the task adds to it.

    Attributes:
      path: The script; made absolute and checked to be Python.
      args: The script's own command-line arguments.
      communication: RING, NCCL or AUTO (any case), for the strategy given to
        a script whose RunConfig has none.
      collective_timeout: Seconds a collective may wait, or None for ever.
      startup_timeout: Seconds to the first training step.
      stall_timeout: Seconds the global step may stay the same.
      model_dir: The directory the script's estimator must write to, or None
        to take the script's.
      eval_start_delay_secs: Replaces the EvalSpec's start_delay_secs, or None.
      eval_throttle_secs: Replaces the EvalSpec's throttle_secs, or None.
      preemption_checkpoint: Stop every task at one checkpointed step on
        SIGTERM/SIGINT (`estimator_dist.preemption`).
      preemption_grace_secs: Seconds from the signal to a forced exit 155.

    >>> config = ScriptConfig(__file__, ["--max_steps=10"], communication="ring")
    >>> config.communication, config.args
    ('RING', ('--max_steps=10',))
    """

    path: str
    args: Tuple[str, ...] = ()
    communication: str = "AUTO"
    collective_timeout: Optional[float] = None
    startup_timeout: float = 600.0
    stall_timeout: float = 120.0
    model_dir: Optional[str] = None
    eval_start_delay_secs: Optional[int] = None
    eval_throttle_secs: Optional[int] = None
    preemption_checkpoint: bool = True
    preemption_grace_secs: float = 25.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", check_script(self.path))
        object.__setattr__(self, "args", tuple(self.args))
        communication = str(self.communication).upper()
        if communication not in COMMUNICATIONS:
            raise UsageError(
                f"--communication={self.communication} is not a collective implementation; "
                f"valid values are {', '.join(COMMUNICATIONS)}."
            )
        object.__setattr__(self, "communication", communication)
        if self.collective_timeout is not None and self.collective_timeout <= 0:
            raise UsageError(
                f"collective_timeout must be positive or None, received {self.collective_timeout}."
            )
        for name in ("startup_timeout", "stall_timeout", "preemption_grace_secs"):
            if getattr(self, name) <= 0:
                raise UsageError(f"--{name} must be positive, received {getattr(self, name)}.")
        for name in ("eval_start_delay_secs", "eval_throttle_secs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise UsageError(f"--{name} must be 0 or more, received {value}.")
        if self.model_dir is not None:
            if not self.model_dir:
                raise UsageError("--model_dir is empty; give the directory the script writes to.")
            if "://" not in self.model_dir:
                object.__setattr__(self, "model_dir", os.path.abspath(self.model_dir))

    def to_args(self) -> List[str]:
        """The command line of `python -m estimator_dist.script` that runs this config."""
        values = {
            "model_dir": self.model_dir,
            "communication": self.communication,
            "collective_timeout": self.collective_timeout,
            "startup_timeout": self.startup_timeout,
            "stall_timeout": self.stall_timeout,
            "eval_start_delay_secs": self.eval_start_delay_secs,
            "eval_throttle_secs": self.eval_throttle_secs,
            "preemption_checkpoint": str(self.preemption_checkpoint).lower(),
            "preemption_grace_secs": self.preemption_grace_secs,
        }
        given = [f"--{name}={values[name]}" for name in FLAG_NAMES if values[name] is not None]
        return [*given, "--", self.path, *self.args]


def config_from_flags(
    flag_values: flags.FlagValues, path: str, args: Sequence[str]
) -> ScriptConfig:
    """Turns parsed `define_flags` flags, the script and its arguments into a `ScriptConfig`.

    Raises:
      UsageError: for a bad value or script.
    """
    f = flag_values
    return ScriptConfig(
        path=path,
        args=tuple(args),
        communication=f.communication,
        collective_timeout=f.collective_timeout or None,
        startup_timeout=f.startup_timeout,
        stall_timeout=f.stall_timeout,
        model_dir=f.model_dir,
        eval_start_delay_secs=f.eval_start_delay_secs,
        eval_throttle_secs=f.eval_throttle_secs,
        preemption_checkpoint=f.preemption_checkpoint,
        preemption_grace_secs=f.preemption_grace_secs,
    )
