"""What `estimator_dist.script` runs: the script or module, its arguments, the task's settings.

The program is a script file (`--script=train.py`, run as `python train.py`
runs it) or a module of a package (`--module=trainer.task`, run as
`python -m trainer.task` runs it, with `--package_path` first on `sys.path`).
A module is found by its files, without importing anything: the launcher must
not run user code.

Its flags live on their own `FlagValues` (`define_flags`), because a script
that uses absl defines and parses its own flags on the global ones; the
launcher defines them too and passes them on (`ScriptConfig.to_args`). No
TensorFlow import here: the launcher reads this before starting any task.

>>> ring = StrategyConfig(communication="ring")
>>> config = ScriptConfig(__file__, ["--max_steps=10"], strategy=ring)
>>> config.to_args()[:2]
['--distribution_strategy=multi_worker_mirrored', '--communication=RING']
"""

from __future__ import annotations

import dataclasses
import os
from typing import List, Optional, Sequence, Tuple

from absl import flags

from estimator_dist.base import settings
from estimator_dist.base.errors import UsageError
from estimator_dist.base.settings import setting
from estimator_dist.config.evaluation import EvaluationConfig
from estimator_dist.config.guards import GuardConfig
from estimator_dist.config.results import ResultsConfig
from estimator_dist.programs.locate import (
    check_module_name,
    check_package_path,
    check_script,
    find_module,
)
from run_config.names import MULTI_WORKER_MIRRORED, PARAMETER_SERVER
from run_config.options import PrecisionConfig, StrategyConfig

__all__ = ["ScriptConfig", "check_script", "config_from_flags", "define_flags", "model_dir_of"]

PROGRAM = "estimator_dist.script"
#: The strategies a program's task can give a program whose RunConfig sets none.
PROGRAM_STRATEGIES = (MULTI_WORKER_MIRRORED, PARAMETER_SERVER)


#: Arguments of a program that name its model_dir, by the conventions programs follow.
MODEL_DIR_ARGS = ("--model_dir", "--model-dir", "--job-dir", "--job_dir")


def model_dir_of(script_args: Sequence[str]) -> Optional[str]:
    """The model_dir a program is given by its own arguments, if one of them names it.

    >>> model_dir_of(["--max_steps=10", "--model_dir", "/tmp/run1"])
    '/tmp/run1'
    >>> model_dir_of(["--job-dir=gs://bucket/run"]), model_dir_of(["--steps=1"])
    ('gs://bucket/run', None)
    """
    for index, arg in enumerate(script_args):
        name, equals, value = arg.partition("=")
        if name in MODEL_DIR_ARGS:
            if equals:
                return value
            if index + 1 < len(script_args):
                return script_args[index + 1]
    return None


@dataclasses.dataclass(frozen=True)
class ScriptConfig:
    """A legacy script to run on a task, and what the task adds to it.

    Each setting is a field carrying its flag (`estimator_dist.base.settings`):
    `define_flags`, `config_from_flags` and `to_args` are generated from them.

    Attributes:
      path: The script; made absolute and checked to be Python. With `module`,
        the module's file (what `python -m` puts in `sys.argv[0]`), found from it.
      args: The program's own command-line arguments.
      results: The job's model_dir (where the program's estimators must write,
        or None to take the program's) and the storage URL of its results.
      strategy: The strategy given, on a cluster, to a program whose RunConfig
        sets none: its collectives and gradient transport (`name` is
        multi_worker_mirrored, or parameter_server; `num_gpus` stays None).
      evaluation: The evaluator's timing over the program's EvalSpec.
      guards: The task's time bounds and preemption checkpoint.
      precision: `--mixed_precision` of the estimator's sessions, the
        script's own session config kept.
      module: The module to run as `python -m` runs it, instead of a script.
      package_path: With `module`: the directory put first on `sys.path`
        (default: the current directory), made absolute.
      resolve: Whether the program's files are on this machine, to be found and
        checked; False for a manifest, whose program is inside an image: then
        only the names are checked and paths are kept as given.

    >>> ring = StrategyConfig(communication="ring")
    >>> config = ScriptConfig(__file__, ["--max_steps=10"], strategy=ring)
    >>> config.strategy.communication, config.args
    ('RING', ('--max_steps=10',))
    """

    path: Optional[str] = None
    args: Tuple[str, ...] = ()
    module: Optional[str] = setting(
        None,
        "Run this module of a package as `python -m` runs it (e.g. trainer.task, with "
        "`from . import model` inside) instead of a script: its file is sys.argv[0], "
        "__name__ is __main__ and relative imports work. Everything after `--` is its own "
        "arguments. See docs/scripts.md.",
        kind="string",
    )
    package_path: Optional[str] = setting(
        None,
        "With --module: the directory holding the module's top-level package, put first "
        "on sys.path (default: the current directory, made absolute).",
        kind="string",
    )
    results: ResultsConfig = ResultsConfig()
    strategy: StrategyConfig = StrategyConfig()
    evaluation: EvaluationConfig = EvaluationConfig()
    guards: GuardConfig = GuardConfig()
    precision: PrecisionConfig = PrecisionConfig()
    resolve: bool = dataclasses.field(default=True, compare=False)

    def __post_init__(self) -> None:
        self._check_program()
        object.__setattr__(self, "args", tuple(self.args))
        self._check_strategy()
        model_dir = self.results.model_dir
        if model_dir and "://" not in model_dir and self.resolve:
            results = dataclasses.replace(self.results, model_dir=os.path.abspath(model_dir))
            object.__setattr__(self, "results", results)

    def _check_strategy(self) -> None:
        """Refuses strategy settings that have no meaning for a program's task."""
        name = self.strategy.name
        if name not in PROGRAM_STRATEGIES:
            raise UsageError(
                f"--distribution_strategy={name} for a program: the strategy the task gives a "
                "program whose RunConfig sets no train_distribute must span the cluster; "
                f"expected one of {', '.join(PROGRAM_STRATEGIES)} (the second when TF_CONFIG "
                "lists ps tasks, chosen by itself). To train with another strategy, build it "
                "in the program's RunConfig: a strategy the program sets is kept."
            )
        if self.strategy.num_gpus is not None:
            raise UsageError(
                f"--num_gpus={self.strategy.num_gpus} for a program: a program's task trains on "
                "the GPUs its process sees, as the program does alone. Choose them with "
                "CUDA_VISIBLE_DEVICES in the task's environment, and leave --num_gpus out."
            )

    @property
    def model_dir(self) -> Optional[str]:
        """`--model_dir`: where the program's estimators must write, or None for anywhere."""
        return self.results.model_dir

    @property
    def storage(self) -> Optional[str]:
        """`--storage`: the URL the job's results live at, or None."""
        return self.results.storage

    def working_in(self, model_dir: str) -> ScriptConfig:
        """This config as a task runs it in `model_dir`, its local copy of the job's results."""
        return dataclasses.replace(
            self, results=dataclasses.replace(self.results, model_dir=model_dir)
        )

    def _check_program(self) -> None:
        """Checks the script or the module (found by its files when `resolve`)."""
        if self.module is None and self.package_path is not None:
            raise UsageError(
                f"--package_path={self.package_path} was given without --module; expected "
                "it only with --module=PACKAGE.MODULE. Add --module, or leave --package_path "
                "out to run a --script."
            )
        if self.module is None and not self.path:
            raise UsageError(
                "no program given (neither --script nor --module); expected one of them: "
                "--script=train.py for a script file, or --module=trainer.task for a module "
                "of a package, run as `python -m trainer.task` runs it."
            )
        if self.module is None:
            path = check_script(self.path) if self.resolve else self.path
            object.__setattr__(self, "path", path)
            return
        if not self.resolve:
            check_module_name(self.module)
            if self.path is not None:
                raise UsageError(_both(self.path, self.module))
            return
        package_path = check_package_path(self.package_path)
        found = find_module(self.module, package_path)
        # A copy (dataclasses.replace) brings the file found before.
        if self.path is not None and os.path.abspath(self.path) != found:
            raise UsageError(_both(self.path, self.module))
        object.__setattr__(self, "package_path", package_path)
        object.__setattr__(self, "path", found)

    @property
    def program(self) -> str:
        """How messages name the program: `train.py`, or `module trainer.task`."""
        return f"module {self.module}" if self.module else str(self.path)

    def to_args(self) -> List[str]:
        """The command line of `python -m estimator_dist.script` that runs this config.

        >>> ScriptConfig(module="m", package_path="/srv", resolve=False).to_args()[:2]
        ['--module=m', '--package_path=/srv']
        """
        # --module and --package_path first, when given.
        given = settings.to_args(self)
        if self.module is None:
            return [*given, "--", str(self.path), *self.args]
        return [*given, "--", *self.args]


#: What the strategy flags mean for a program, where they are narrower than for a named job.
PROGRAM_HELPS = {
    "distribution_strategy": (
        "Strategy a task on a cluster gives a program whose RunConfig sets no "
        "train_distribute: multi_worker_mirrored, or parameter_server (chosen by itself when "
        "TF_CONFIG lists ps tasks). A strategy the program sets is kept; in one process the "
        "program trains as it does alone."
    ),
    "num_gpus": (
        "Not for programs: a program trains on the GPUs its process sees; choose them with "
        "CUDA_VISIBLE_DEVICES."
    ),
}
#: The flags of a script's settings, in the order they are passed on, the program's first.
PROGRAM_FLAG_NAMES = ("module", "package_path")
#: The other flags: those of the task's settings.
FLAG_NAMES = tuple(n for n in settings.flag_names(ScriptConfig) if n not in PROGRAM_FLAG_NAMES)


def define_flags(flag_values: flags.FlagValues, package_path_help: str = "") -> None:
    """Defines the flags of `ScriptConfig`'s settings on `flag_values` (the launcher's too).

    `package_path_help` replaces the help of `--package_path` (the manifest's
    means a path inside the image).

    They live on their own `FlagValues` in this module, not on `flags.FLAGS`:
    a script that uses absl defines and parses its own flags there.
    """
    helps = dict(PROGRAM_HELPS)
    if package_path_help:
        helps["package_path"] = package_path_help
    settings.define_flags(ScriptConfig, flag_values, __name__, helps)


def _both(path: str, module: str) -> str:
    return (
        f"both --script={path} and --module={module} were given; expected one program: "
        "--script=FILE for a script, or --module=PACKAGE.MODULE for a module of a package. "
        "Keep one of the two."
    )


def config_from_flags(
    flag_values: flags.FlagValues,
    path: Optional[str],
    args: Sequence[str],
    resolve: bool = True,
) -> ScriptConfig:
    """Turns parsed `define_flags` flags, the script (or --module) and its arguments into a config.

    Raises:
      UsageError: for a bad value, script or module.
    """
    if path is not None and flag_values.module is not None:
        raise UsageError(_both(path, flag_values.module))
    return settings.from_flags(
        ScriptConfig, flag_values, path=path, args=tuple(args), resolve=resolve
    )
