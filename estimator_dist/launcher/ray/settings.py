"""The Ray engine's settings: the cluster, the placement, each task's resources; Ray itself.

`RaySettings` is what `--engine=ray` and its flags make (`launch_flags`),
validated, without importing Ray; `import_ray` imports Ray or says how to install it.

Example:
  >>> settings = RaySettings("10.0.0.1:6379", placement="spread", gpus_per_task=1)
  >>> settings.placement, settings.bundle
  ('SPREAD', {'CPU': 1.0, 'GPU': 1})
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

from estimator_dist.base.errors import UsageError
from estimator_dist.base.settings import setting

#: Values of `--ray_placement`: Ray's placement group strategies.
PLACEMENTS = ("STRICT_SPREAD", "SPREAD", "PACK")
#: What to install when Ray is missing.
INSTALL_HINT = "pip install 'estimator-dist[ray]'"


@dataclasses.dataclass(frozen=True)
class RaySettings:
    """Where and how the Ray engine runs a job's tasks.

    Attributes:
      address: The Ray cluster's address, `HOST:PORT` (what `ray start
        --head` prints) or `auto` (the cluster this machine belongs to).
      placement: `STRICT_SPREAD` (every task on a node of its own),
        `SPREAD` or `PACK`; any case.
      cpus_per_task: CPUs each task's bundle and actor reserve.
      gpus_per_task: GPUs each task's bundle and actor reserve.
      placement_timeout_secs: Seconds to wait for the placement group.

    >>> RaySettings("10.0.0.1:6379", placement="spread").placement
    'SPREAD'
    >>> RaySettings("10.0.0.1:6379", cpus_per_task=0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    estimator_dist.base.errors.UsageError: --ray_cpus_per_task must be more than 0, received 0. ...
    """

    address: Optional[str] = setting(
        None,
        "With --engine=ray: the Ray cluster's address, HOST:PORT as `ray start --head` prints it, "
        "or `auto` on a node of the cluster.",
        kind="string",
        flag="ray_address",
    )
    placement: str = setting(
        "STRICT_SPREAD",
        "With --engine=ray: how the tasks are spread over the nodes, as a Ray placement group "
        "strategy: STRICT_SPREAD puts every task on a node of its own; SPREAD spreads them as far "
        "as the nodes allow; PACK packs them on as few nodes as possible.",
        enum=PLACEMENTS,
        flag="ray_placement",
    )
    cpus_per_task: float = setting(
        1.0,
        "With --engine=ray: CPUs reserved for each task (its bundle and its actor).",
        flag="ray_cpus_per_task",
    )
    gpus_per_task: float = setting(
        0.0,
        "With --engine=ray: GPUs reserved for each task; Ray sets CUDA_VISIBLE_DEVICES of the task "
        "to the GPUs it reserved.",
        flag="ray_gpus_per_task",
    )
    placement_timeout_secs: float = setting(
        60.0,
        "With --engine=ray: seconds to wait for the nodes of an attempt (its placement group and "
        "actors) before the job fails with exit 151, naming how many nodes fit and how many it "
        "needs.",
        flag="ray_placement_timeout_secs",
    )

    def __post_init__(self) -> None:
        address = (self.address or "").strip()
        if not address:
            raise UsageError(
                "--engine=ray needs --ray_address, the Ray cluster's address: HOST:PORT as "
                "`ray start --head` prints it, or `auto` on a node of the cluster."
            )
        if address.startswith("ray://"):
            raise UsageError(
                f"--ray_address={address} is a Ray Client address, which the launcher does not "
                "support (it streams every task's output through its Ray driver). Run the "
                "launcher on a node of the cluster and pass the cluster's HOST:PORT (often port "
                "6379), or `auto`."
            )
        placement = self.placement.upper()
        if placement not in PLACEMENTS:
            raise UsageError(
                f"--ray_placement must be one of {', '.join(PLACEMENTS)}, received "
                f"{self.placement!r}."
            )
        if not self.cpus_per_task > 0:
            raise UsageError(
                f"--ray_cpus_per_task must be more than 0, received {self.cpus_per_task:g}. "
                "Every task needs a CPU; give a fraction (0.5) to share one."
            )
        if self.gpus_per_task < 0:
            raise UsageError(
                f"--ray_gpus_per_task must be 0 or more, received {self.gpus_per_task:g}."
            )
        if not self.placement_timeout_secs > 0:
            raise UsageError(
                "--ray_placement_timeout_secs must be more than 0, received "
                f"{self.placement_timeout_secs:g}."
            )
        object.__setattr__(self, "address", address)
        object.__setattr__(self, "placement", placement)

    @property
    def bundle(self) -> Dict[str, float]:
        """The resources of one task, as a placement group bundle.

        >>> RaySettings("auto", gpus_per_task=1).bundle
        {'CPU': 1.0, 'GPU': 1}
        """
        bundle = {"CPU": self.cpus_per_task}
        if self.gpus_per_task:
            bundle["GPU"] = self.gpus_per_task
        return bundle


def import_ray() -> Any:
    """Imports Ray, or says how to install it.

    Raises:
      UsageError: when Ray is not installed.
    """
    try:
        import ray
    except ImportError as error:
        raise UsageError(
            f"--engine=ray needs Ray, which cannot be imported here ({error}). Install it "
            f"with `{INSTALL_HINT}` on the launcher's machine and on every node."
        ) from None
    return ray
