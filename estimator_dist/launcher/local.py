"""The local engine: every task a process of this machine, in a private network.

`LocalEngine` runs a job's tasks as children of the launcher
(`task_start.start_local_task`: the parent death signal, so a SIGKILL of the
launcher ends them all), on free loopback ports picked afresh for each attempt,
inside a private network namespace when the system allows it
(`netns.isolate`: no task port reachable from outside). With `pin_cores`,
each training task runs on its own share of the launcher's cores, so that
tasks do not fight over cores and TensorFlow sizes each task's thread pools to
its share; the evaluator and ps tasks use every core.

Example:
  >>> from estimator_dist.config.shape import JobShape
  >>> engine = LocalEngine(JobShape(2, 0, True), network_isolation=False)
  >>> [config.role for config in engine.new_cluster(0).tasks]
  ['chief-0', 'worker-0', 'evaluator-0']
"""

from __future__ import annotations

import dataclasses
import subprocess
from typing import Callable, Dict, FrozenSet

import portpicker

from estimator_dist.cluster.tf_config import CHIEF, WORKER, LocalCluster, make_local_cluster
from estimator_dist.config.shape import JobShape
from estimator_dist.hardware.cpus import split_cores
from estimator_dist.launcher import netns
from estimator_dist.launcher.task_start import TaskSpec, start_local_task


class LocalEngine:
    """Runs a job's tasks as processes of this machine.

    Args:
      shape: The job's tasks.
      host: The address the tasks use to reach each other (`--host`).
      network_isolation: Run the cluster in a private network namespace when
        `host` is loopback (`--network_isolation`).
      pin_cores: Give each training task its own share of the cores (`--pin_cores`).
    """

    kind = "local cluster"
    needs_shared_model_dir = False

    def __init__(
        self,
        shape: JobShape,
        host: str = "localhost",
        network_isolation: bool = True,
        pin_cores: bool = False,
    ) -> None:
        self._shape = shape
        self._host = host
        self._network_isolation = network_isolation
        self._pin_cores = pin_cores
        self._cores: Dict[str, FrozenSet[int]] = {}

    def prepare(self, reach_out: bool = False) -> str:
        """Enters the private network namespace, before any thread or task starts.

        Args:
          reach_out: The job reaches remote storage or data: the namespace
            gets a way out that opens no port (`estimator_dist.launcher.way_out`).
        """
        return netns.isolate(self._host, self._network_isolation, reach_out)

    def connect(self, say: Callable[[str], None]) -> None:
        """Nothing to join: the tasks run here."""

    def new_cluster(self, attempt: int) -> LocalCluster:
        """The cluster of one attempt, on fresh ports, with each training task's cores."""
        shape = self._shape
        ports = [portpicker.pick_unused_port() for _ in range(shape.num_workers + shape.num_ps)]
        cluster = make_local_cluster(
            shape.num_workers, ports, shape.num_ps, shape.evaluator, self._host
        )
        training = [c.role for c in cluster.tasks if c.task_type in (CHIEF, WORKER)]
        self._cores = dict(zip(training, split_cores(len(training)))) if self._pin_cores else {}
        return cluster

    def start_task(self, spec: TaskSpec) -> subprocess.Popen:
        """Starts the task as a child of this process, on its cores."""
        cores = self._cores.get(spec.config.role)
        process = start_local_task(dataclasses.replace(spec, cores=cores))
        process.where = f" on cores {','.join(map(str, sorted(cores)))}" if cores else ""
        return process

    def close(self) -> None:
        """Nothing is held: the tasks are stopped by the launcher."""
