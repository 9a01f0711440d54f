"""Where a job's tasks run: the protocol every engine of the launcher implements.

The launcher (`supervise.Launcher`, `restarts.run_with_restarts`) does not know
where its tasks run. An engine makes the cluster of each attempt (its
TF_CONFIGs, on fresh ports) and starts one task's process on it; the launcher
starts, watches and stops those processes the same way for every engine.
`local.LocalEngine` runs them as processes of this machine, `ray.engine.RayEngine`
as Ray actors on a Ray cluster's nodes.

Example:
  >>> from estimator_dist.config.shape import JobShape
  >>> from estimator_dist.launcher.local import LocalEngine
  >>> engine: Engine = LocalEngine(JobShape(2, 0, True), network_isolation=False)
  >>> engine.kind, engine.needs_shared_model_dir
  ('local cluster', False)
"""

from __future__ import annotations

from typing import Callable, Protocol

from estimator_dist.cluster.tf_config import LocalCluster
from estimator_dist.launcher.task_start import TaskProcess, TaskSpec


class Engine(Protocol):
    """Starts a job's tasks somewhere; one attempt's cluster at a time.

    Attributes:
      kind: How the launcher names the cluster it runs on (`local cluster`).
      needs_shared_model_dir: Whether the job must name a `--model_dir` every
        task can reach (tasks on other machines), instead of a temporary one.
    """

    kind: str
    needs_shared_model_dir: bool

    def prepare(self, reach_out: bool = False) -> str:
        """Readies this process before the pre-flight runs; returns the line saying
        from where the tasks' ports can be reached. `reach_out`: the job reads or
        writes remote storage or data."""
        ...

    def connect(self, say: Callable[[str], None]) -> None:
        """Joins what runs the tasks, once, before the first attempt.

        Args:
          say: Prints a launcher line.

        Raises:
          Error: when the engine cannot be reached (its own exit code).
        """
        ...

    def new_cluster(self, attempt: int) -> LocalCluster:
        """The cluster of attempt `attempt` (0 first), on fresh ports.

        Raises:
          Error: when there is nothing to run the attempt on.
        """
        ...

    def start_task(self, spec: TaskSpec) -> TaskProcess:
        """Starts one task of the latest cluster; called from the main thread."""
        ...

    def close(self) -> None:
        """Releases what the engine holds; the launcher calls it once, at the end."""
        ...
