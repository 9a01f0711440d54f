"""The launcher's flags, defined once, and the frozen settings they make.

Each launcher setting is a field of `LaunchSettings` (the job's shape a
nested `engine.JobShape`, the Ray engine's a `RaySettings`) that carries its
flag (`base/settings.py`). `define_flags` defines them, and the flags of
`estimator_dist.script` that a `--script`/`--module` job passes to every
task; `settings_from_flags` builds the settings, checking that the flags
given belong to the engine chosen; `make_engine` builds that engine. Library
code receives the settings and the engine, never the flags.

Example:
  python -m estimator_dist.launch --engine=ray --ray_address=10.0.0.1:6379 \\
      --num_workers=2 --evaluator -- --model_dir=/shared/run1 --train_steps=500
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from absl import flags

from estimator_dist.base import settings as settings_lib
from estimator_dist.base.errors import UsageError
from estimator_dist.base.settings import setting
from estimator_dist.config.shape import JobShape
from estimator_dist.launcher.engine import Engine
from estimator_dist.launcher.local import LocalEngine
from estimator_dist.launcher.ray.engine import RayEngine
from estimator_dist.launcher.ray.settings import RaySettings, import_ray
from estimator_dist.launcher.restarts import RestartSettings
from estimator_dist.programs import config as script_lib

#: Values of `--engine`.
ENGINES = ("local", "ray")
#: The launcher's flags about the local machine, which --engine=ray cannot honour.
LOCAL_FLAGS = ("host", "network_isolation", "pin_cores")


@dataclasses.dataclass(frozen=True)
class LaunchSettings:
    """The launcher's settings: the job's shape, its supervision, its engine.

    Attributes:
      program: Whether the tasks run a whole program (`--script` or `--module`)
        instead of `estimator_dist.train`.
      ray: The Ray engine's settings with `--engine=ray`, else None.
    Every other field is the flag of the same name (`--helpfull`, docs/flags.md).
    """

    shape: JobShape = JobShape()
    host: str = setting("localhost", "Address the tasks use to reach each other.")
    network_isolation: bool = setting(
        True,
        "Run the cluster in a private network namespace, so that no task port is reachable "
        "from outside; if the system refuses, warn and run in the host's network. Turn off "
        "when the tasks must reach the network (remote data or model_dir).",
    )
    max_restarts: int = setting(
        3,
        "Whole-cluster restarts from the latest checkpoint after a retryable failure.",
        lower_bound=0,
    )
    finish_timeout_secs: float = setting(
        300.0,
        "After the first training task finishes, seconds the others (and the evaluator's "
        "final evaluation) may take before the job fails.",
        lower_bound=1,
    )
    timeout_secs: float = setting(
        0.0, "Stop the job and fail after this many seconds; 0 means no limit.", lower_bound=0
    )
    grace_secs: float = setting(
        10.0,
        "Seconds between SIGTERM and SIGKILL when stopping tasks after a failure; after a signal "
        "to the launcher, at least the tasks' --preemption_grace_secs + 5 (their checkpoint).",
        lower_bound=0,
    )
    pin_cores: bool = setting(
        True,
        "Give each training task its own share of the cores this launcher may use (round-robin "
        "when tasks outnumber cores), so tasks do not fight over cores and TensorFlow sizes each "
        "task's thread pools to its share; the evaluator and ps tasks use every core. Run the "
        "launcher under `taskset -c ...` to give the job fewer cores.",
    )
    verbose: bool = setting(
        False,
        "Echo every line every task prints (TensorFlow's deprecation warnings, C++ start-up lines, "
        "Estimator's INFO lines) and the launcher's own log. By default the console shows the "
        "job's progress line every --log_step_count_steps steps, each evaluation's "
        "metrics, warnings, failures and the launcher's summary; every task's full output is in "
        "model_dir/logs/<task>.log either way, the launcher's own in model_dir/logs/launcher.log.",
    )
    script: Optional[str] = setting(
        None,
        "A whole training script that builds its own Estimator and calls "
        "tf.estimator.train_and_evaluate; every task runs it (via estimator_dist.script) with "
        "the arguments after `--`, which are then the script's own. See docs/scripts.md.",
        kind="string",
    )
    engine: str = setting(
        "local",
        "Where the tasks run: `local`, processes of this machine in a private network namespace; "
        "`ray`, one Ray actor per task on the nodes of the Ray cluster at --ray_address (needs a "
        "--model_dir every node shares; see docs/ray.md).",
        enum=ENGINES,
    )
    program: bool = False
    ray: Optional[RaySettings] = None

    def __post_init__(self) -> None:
        settings_lib.check_bounds(self)

    @property
    def restarts(self) -> RestartSettings:
        """Timeouts and the restart budget of the whole-job loop."""
        return RestartSettings(
            self.max_restarts, self.finish_timeout_secs, self.grace_secs, self.shape.evaluator
        )


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines the launcher's flags, and those of `estimator_dist.script`, on `flag_values`."""
    settings_lib.define_flags(LaunchSettings, flag_values, __name__)
    settings_lib.define_flags(RaySettings, flag_values, __name__)
    # The flags of estimator_dist.script, which the launcher passes on to every task.
    script_lib.define_flags(flag_values)


def settings_from_flags(flag_values: flags.FlagValues = flags.FLAGS) -> LaunchSettings:
    """The settings of parsed launcher flags.

    Raises:
      UsageError: for a flag of the other engine, a bad Ray flag, no Ray
        installed (before the pre-flight, so that it fails at once), or a flag
        of `--script` jobs on an `estimator_dist.train` job.
    """
    f = flag_values
    program = bool(f.script or f.module or f.package_path is not None)
    if not program:
        given = [name for name in script_lib.FLAG_NAMES if f[name].present]
        if given:
            raise UsageError(
                f"--{given[0]} is a flag of --script jobs; for an estimator_dist.train job give "
                f"it after '--' (e.g. `-- --{given[0]}=...`), or pass --script=PATH."
            )
    return settings_lib.from_flags(LaunchSettings, f, program=program, ray=_ray_settings(f))


def _ray_settings(f: flags.FlagValues) -> Optional[RaySettings]:
    """The Ray engine's settings with --engine=ray; None with --engine=local."""
    ray_flags = settings_lib.flag_names(RaySettings)
    if f.engine == "local":
        given = [name for name in ray_flags if f[name].present]
        if given:
            raise UsageError(
                f"--{given[0]} is a flag of --engine=ray; pass --engine=ray with "
                "--ray_address=HOST:PORT, or leave it out to run the job on this machine."
            )
        return None
    given = [name for name in LOCAL_FLAGS if f[name].present]
    if given:
        raise UsageError(
            f"--{given[0]} is a flag of the local engine and means nothing with --engine=ray, "
            "where each task runs on its Ray node; leave it out."
        )
    settings = settings_lib.from_flags(RaySettings, f)
    import_ray()
    return settings


def make_engine(settings: LaunchSettings) -> Engine:
    """The engine the settings choose: Ray's with `--engine=ray`, else this machine's."""
    if settings.ray is not None:
        return RayEngine(settings.ray, settings.shape)
    return LocalEngine(
        settings.shape, settings.host, settings.network_isolation, settings.pin_cores
    )
