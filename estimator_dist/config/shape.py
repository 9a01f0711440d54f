"""The tasks of a job: how many training workers, parameter servers, and whether an evaluator.

`JobShape` is the one description of a job's tasks: the launcher starts them
(`estimator_dist.launch`, nested in its `LaunchSettings`) and the manifests
declare them as replicas (`estimator_dist.manifest`, nested in
`ManifestSettings`), from the same flags with the same defaults. No
TensorFlow import.

>>> JobShape().tasks()
[('chief', 0), ('worker', 0), ('evaluator', 0)]
"""

from __future__ import annotations

import dataclasses
from typing import List, Tuple

from estimator_dist.base.settings import check_bounds, setting
from estimator_dist.cluster.tf_config import CHIEF, EVALUATOR, PS, WORKER


@dataclasses.dataclass(frozen=True)
class JobShape:
    """The tasks of a job: training workers (the chief included), ps tasks, an evaluator.

    Attributes:
      num_workers: Training tasks, the chief included.
      num_ps: Parameter server tasks.
      evaluator: Whether the job has an evaluator task, which evaluates each
        checkpoint and the last one, as `tf.estimator.train_and_evaluate`
        does in one process.
    """

    num_workers: int = setting(
        2, "Training tasks, the chief included: a chief and NUM_WORKERS-1 workers.", lower_bound=1
    )
    num_ps: int = setting(
        0, "Parameter server tasks (with --distribution_strategy=parameter_server).", lower_bound=0
    )
    evaluator: bool = setting(
        True,
        "Run an evaluator task, which evaluates each checkpoint and writes the final metrics, "
        "as train_and_evaluate does in one process (--noevaluator: none).",
    )

    def __post_init__(self) -> None:
        check_bounds(self)

    def tasks(self) -> List[Tuple[str, int]]:
        """Each task's job name and index, in the order of the cluster's tasks.

        >>> JobShape(2, 1, True).tasks()
        [('chief', 0), ('worker', 0), ('ps', 0), ('evaluator', 0)]
        """
        tasks = [(CHIEF, 0)] + [(WORKER, i) for i in range(self.num_workers - 1)]
        tasks += [(PS, i) for i in range(self.num_ps)]
        return tasks + ([(EVALUATOR, 0)] if self.evaluator else [])
