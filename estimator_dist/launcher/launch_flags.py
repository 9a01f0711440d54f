"""The launcher's engine flags: where the tasks run, and the frozen settings they make.

`--engine=local` (the default) runs every task as a process of this machine;
`--engine=ray` runs each as a Ray actor on a node of an existing Ray cluster
(`estimator_dist.launcher.ray.engine`, docs/ray.md). `ray_settings` checks that the
flags given belong to the engine chosen, turns the Ray flags into a
`ray_engine.RaySettings`, and checks that Ray can be imported.

Example:
  python -m estimator_dist.launch --engine=ray --ray_address=10.0.0.1:6379 \\
      --num_workers=2 --evaluator -- --model_dir=/shared/run1 --train_steps=500
"""

from __future__ import annotations

from typing import Optional

from absl import flags

from estimator_dist.base.errors import UsageError
from estimator_dist.launcher.ray.settings import PLACEMENTS, RaySettings, import_ray

#: Values of `--engine`.
ENGINES = ("local", "ray")

_ENGINE = flags.DEFINE_enum(
    "engine",
    "local",
    ENGINES,
    "Where the tasks run: `local`, processes of this machine in a private network namespace; "
    "`ray`, one Ray actor per task on the nodes of the Ray cluster at --ray_address (needs a "
    "--model_dir every node shares; see docs/ray.md).",
)
_RAY_ADDRESS = flags.DEFINE_string(
    "ray_address",
    None,
    "With --engine=ray: the Ray cluster's address, HOST:PORT as `ray start --head` prints it, "
    "or `auto` on a node of the cluster.",
)
_RAY_PLACEMENT = flags.DEFINE_enum(
    "ray_placement",
    "STRICT_SPREAD",
    PLACEMENTS,
    "With --engine=ray: how the tasks are spread over the nodes, as a Ray placement group "
    "strategy: STRICT_SPREAD puts every task on a node of its own; SPREAD spreads them as far "
    "as the nodes allow; PACK packs them on as few nodes as possible.",
    case_sensitive=False,
)
_RAY_CPUS = flags.DEFINE_float(
    "ray_cpus_per_task",
    1,
    "With --engine=ray: CPUs reserved for each task (its bundle and its actor).",
)
_RAY_GPUS = flags.DEFINE_float(
    "ray_gpus_per_task",
    0,
    "With --engine=ray: GPUs reserved for each task; Ray sets CUDA_VISIBLE_DEVICES of the task "
    "to the GPUs it reserved.",
)
_RAY_PLACEMENT_TIMEOUT = flags.DEFINE_float(
    "ray_placement_timeout_secs",
    60,
    "With --engine=ray: seconds to wait for the nodes of an attempt (its placement group and "
    "actors) before the job fails with exit 151, naming how many nodes fit and how many it "
    "needs.",
)

#: The Ray flags, which only --engine=ray reads.
RAY_FLAGS = (
    "ray_address",
    "ray_placement",
    "ray_cpus_per_task",
    "ray_gpus_per_task",
    "ray_placement_timeout_secs",
)
#: The launcher's flags about the local machine, which --engine=ray cannot honour.
LOCAL_FLAGS = ("host", "network_isolation", "pin_cores")


def ray_settings() -> Optional[RaySettings]:
    """The Ray engine's settings with --engine=ray; None with --engine=local.

    Raises:
      UsageError: for a flag of the other engine, a bad Ray flag, or no Ray
        installed (before the pre-flight, so that it fails at once).
    """
    if _ENGINE.value == "local":
        given = [name for name in RAY_FLAGS if flags.FLAGS[name].present]
        if given:
            raise UsageError(
                f"--{given[0]} is a flag of --engine=ray; pass --engine=ray with "
                "--ray_address=HOST:PORT, or leave it out to run the job on this machine."
            )
        return None
    given = [name for name in LOCAL_FLAGS if flags.FLAGS[name].present]
    if given:
        raise UsageError(
            f"--{given[0]} is a flag of the local engine and means nothing with --engine=ray, "
            "where each task runs on its Ray node; leave it out."
        )
    settings = RaySettings(
        _RAY_ADDRESS.value or "",
        _RAY_PLACEMENT.value,
        _RAY_CPUS.value,
        _RAY_GPUS.value,
        _RAY_PLACEMENT_TIMEOUT.value,
    )
    import_ray()
    return settings
