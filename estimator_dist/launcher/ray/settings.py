"""The Ray engine's settings: the cluster, the placement, each task's resources; Ray itself.

`RaySettings` is what `--engine=ray` and its flags make (`launch_flags`),
validated, without importing Ray; `JobShape` lists a job's tasks in the order
of its cluster; `import_ray` imports Ray or says how to install it.

Example:
  >>> settings = RaySettings("10.0.0.1:6379", placement="spread", gpus_per_task=1)
  >>> settings.placement, settings.bundle
  ('SPREAD', {'CPU': 1.0, 'GPU': 1})
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Tuple

from estimator_dist.base.cluster import CHIEF, EVALUATOR, PS, WORKER
from estimator_dist.base.errors import UsageError

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

    address: str
    placement: str = "STRICT_SPREAD"
    cpus_per_task: float = 1.0
    gpus_per_task: float = 0.0
    placement_timeout_secs: float = 60.0

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


@dataclasses.dataclass(frozen=True)
class JobShape:
    """The tasks of a job: training workers (the chief included), ps tasks, an evaluator."""

    num_workers: int
    num_ps: int
    evaluator: bool

    def tasks(self) -> List[Tuple[str, int]]:
        """Each task's job name and index, in the order of the cluster's tasks.

        >>> JobShape(2, 1, True).tasks()
        [('chief', 0), ('worker', 0), ('ps', 0), ('evaluator', 0)]
        """
        tasks = [(CHIEF, 0)] + [(WORKER, i) for i in range(self.num_workers - 1)]
        tasks += [(PS, i) for i in range(self.num_ps)]
        return tasks + ([(EVALUATOR, 0)] if self.evaluator else [])


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
