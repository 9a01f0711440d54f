"""The launcher's Ray engine: a job's tasks as Ray actors on the nodes of a Ray cluster.

`python -m estimator_dist.launch --engine=ray --ray_address=HOST:PORT ...`
runs the job the local launcher runs, supervised and restarted by the same
code (`supervise.Launcher`, `restarts.run_with_restarts`); only where each
task's process starts differs. For every attempt, `RayEngine.new_cluster`:

1. removes the previous attempt's actors and placement group;
2. creates a placement group of one bundle per task (`--ray_cpus_per_task`,
   `--ray_gpus_per_task`), `STRICT_SPREAD` by default: every task on a node
   of its own. It waits at most `--ray_placement_timeout_secs`; then it
   fails with `errors.ClusterTimeoutError` (exit 151), saying how many alive
   nodes have the resources of one task, how many the job needs, and the fix;
3. creates one `ray_actor.TaskHost` actor per task in its bundle, which binds
   the task's port on its node and holds it;
4. returns the cluster whose TF_CONFIG names each node's address and the
   port its actor holds.

`RayEngine.start_task` then has the task's actor start the command, and
returns a `ray_actor.ActorProcess`. The actors are owned by the launcher's
Ray driver, so Ray ends them when the launcher dies, and each task holds the
parent death signal of its actor. `close` kills this job's actors and removes
its placement group, nothing else of the cluster. Ray is imported only here,
when `--engine=ray` is used.

Example:
  >>> engine = RayEngine(RaySettings("10.0.0.1:6379"), JobShape(2, 0, True))
  >>> engine.connect(print)  # doctest: +SKIP
  >>> cluster = engine.new_cluster(0)  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

from estimator_dist.base.errors import ClusterTimeoutError, Error, UsageError
from estimator_dist.cluster.tf_config import CHIEF, EVALUATOR, WORKER, ClusterConfig, LocalCluster
from estimator_dist.config.shape import JobShape
from estimator_dist.hardware.cpus import split_cores
from estimator_dist.launcher.ray.actor import CALL_TIMEOUT_SECS, ActorProcess, TaskHost
from estimator_dist.launcher.ray.settings import INSTALL_HINT, RaySettings, import_ray
from estimator_dist.launcher.task_start import TaskSpec

#: The launcher's first line when its tasks run on a Ray cluster.
NETWORK_MESSAGE = (
    "WARNING: network: the Ray cluster's; TensorFlow's gRPC servers listen on all interfaces "
    "of their nodes without authentication while the job runs: run it only on a network "
    "nobody else can reach"
)
#: Seconds to wait for the Ray cluster's address to accept a connection.
_CONNECT_TIMEOUT_SECS = 10.0
#: Threads of an actor: its output stream, signals, and a start.
_ACTOR_CONCURRENCY = 4


def _check_reachable(address: str) -> None:
    """Fails at once when nothing listens at HOST:PORT: `ray.init` would retry for minutes."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise UsageError(
            f"--ray_address must be HOST:PORT or auto, received {address!r}: the address "
            "`ray start --head` prints (often port 6379)."
        )
    try:
        socket.create_connection((host.strip("[]"), int(port)), _CONNECT_TIMEOUT_SECS).close()
    except OSError as error:
        raise ClusterTimeoutError(
            f"no Ray cluster answers at --ray_address={address} ({error}). Start one "
            "(`ray start --head` prints its address) or fix the address."
        ) from None


@dataclasses.dataclass
class _Placed:
    """One task's actor and where it runs."""

    actor: Any
    location: Dict[str, Any]

    @property
    def where(self) -> str:
        return f" on Ray node {self.location['ip']} (node {self.location['node_id'][:8]})"


class RayEngine:
    """Places a job's tasks on a Ray cluster, one actor per task, one attempt at a time.

    Args:
      settings: The Ray flags.
      shape: The job's tasks.
    """

    kind = "Ray cluster"
    needs_shared_model_dir = True

    def __init__(self, settings: RaySettings, shape: JobShape) -> None:
        self._settings = settings
        self._shape = shape
        self._say: Callable[[str], None] = print
        self._ray: Any = None
        self._group: Any = None
        self._actors: List[Any] = []
        self._placed: Dict[str, _Placed] = {}
        #: Cores of training tasks that share a host with another (`shared_host_cores`).
        self._cores: Dict[str, FrozenSet[int]] = {}

    def prepare(self, reach_out: bool = False) -> str:
        """Nothing to ready here: the tasks' network is the Ray cluster's; says so."""
        return NETWORK_MESSAGE

    def connect(self, say: Callable[[str], None]) -> None:
        """Connects this process to the Ray cluster as its driver.

        Args:
          say: Prints a launcher line; the engine says where each task runs.

        Raises:
          UsageError: when Ray is missing or the address is malformed.
          ClusterTimeoutError: when nothing answers at the address.
        """
        self._say = say
        ray = import_ray()
        if self._settings.address != "auto":
            _check_reachable(self._settings.address)
        started = time.monotonic()
        # The tasks' output reaches the launcher through the actors' streams; Ray's copy of
        # the actors' own output would only repeat Ray's lines on the console.
        try:
            ray.init(
                address=self._settings.address, log_to_driver=False, logging_level=logging.WARNING
            )
        except (ConnectionError, RuntimeError, ValueError) as error:  # Ray's, such as versions.
            raise Error(
                f"cannot join the Ray cluster at --ray_address={self._settings.address}: "
                f"{_first_line(error)}"
            ) from None
        self._ray = ray
        alive = [node for node in ray.nodes() if node["Alive"]]
        node = ray.get_runtime_context().get_node_id()
        self._say(
            f"Ray: connected to {self._settings.address} in {time.monotonic() - started:.1f} s "
            f"as a driver on node {node[:8]}; {len(alive)} alive node(s)"
        )

    def new_cluster(self, attempt: int) -> LocalCluster:
        """Places the tasks of attempt `attempt` on fresh actors; returns their TF_CONFIGs.

        Raises:
          ClusterTimeoutError: when the placement group or the actors are not
            ready in time: too few nodes, or too few free resources.
          Error: when an actor fails to start on its node.
        """
        ray = self._ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        gone = self._nodes_gone()
        self.release()
        if gone:
            self._say(f"{gone}; placing attempt {attempt} on the nodes that remain")
        tasks = self._shape.tasks()
        settings = self._settings
        started = time.monotonic()
        self._group = placement_group([settings.bundle] * len(tasks), settings.placement)
        if not self._group.wait(settings.placement_timeout_secs):
            raise ClusterTimeoutError(self._unplaceable(len(tasks)))
        host = ray.remote(TaskHost)
        self._actors = [
            host.options(
                num_cpus=settings.cpus_per_task,
                num_gpus=settings.gpus_per_task,
                max_concurrency=_ACTOR_CONCURRENCY,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._group, index),
            ).remote(job != EVALUATOR)
            for index, (job, _) in enumerate(tasks)
        ]
        try:
            locations = ray.get(
                [actor.location.remote() for actor in self._actors],
                timeout=settings.placement_timeout_secs,
            )
        except ray.exceptions.GetTimeoutError:
            raise ClusterTimeoutError(
                f"the job's {len(tasks)} Ray actors did not start within "
                f"--ray_placement_timeout_secs={settings.placement_timeout_secs:g} after their "
                "placement group was ready; see the Ray cluster's logs of its workers"
            ) from None
        except ray.exceptions.RayError as error:
            raise Error(
                f"a Ray actor of the job could not start on its node: {_first_line(error)}. "
                f"Every node needs estimator-dist and its dependencies installed ({INSTALL_HINT})"
            ) from None
        cluster = cluster_of(tasks, locations)
        self._cores = shared_host_cores(cluster.tasks, locations)
        self._placed = {
            config.role: _Placed(actor, location)
            for config, actor, location in zip(cluster.tasks, self._actors, locations)
        }
        self._say(
            f"Ray: placement group ({settings.placement}, {len(tasks)} x {settings.bundle}) and "
            f"{len(tasks)} actors ready in {time.monotonic() - started:.1f} s"
        )
        for role, placed in self._placed.items():
            port = placed.location["port"]
            held = f", holding port {port}" if port is not None else ", no port"
            cores = self._cores.get(role)
            on = f", on cores {','.join(map(str, sorted(cores)))}" if cores else ""
            self._say(f"Ray: {role}{placed.where}{held}{on}")
        return cluster

    def start_task(self, spec: TaskSpec) -> ActorProcess:
        """Has the task's actor start its process; a gone actor gives a process already lost."""
        ray = self._ray
        placed = self._placed[spec.config.role]

        def explain(error: BaseException) -> str:
            return self._explain_loss(placed, error)

        cores = self._cores.get(spec.config.role)
        call = placed.actor.start.remote(
            spec.module,
            list(spec.args),
            spec.environment(),
            os.getcwd(),
            sorted(cores) if cores else None,
        )
        try:
            pid = ray.get(call, timeout=CALL_TIMEOUT_SECS)
        except ray.exceptions.RayActorError as error:
            return ActorProcess(None, 0, placed.where, explain, lost=explain(error))
        except ray.exceptions.RayError as error:  # The command itself could not start.
            lost = f"could not start on its Ray node{placed.where}: {_first_line(error)}"
            return ActorProcess(None, 0, placed.where, explain, lost=lost)
        return ActorProcess(placed.actor, pid, placed.where, explain)

    def release(self) -> None:
        """Kills this job's actors and removes its placement group, if any."""
        ray = self._ray
        for actor in self._actors:
            try:
                ray.kill(actor, no_restart=True)
            except ray.exceptions.RayError:
                pass  # Gone with its node.
        self._actors, self._placed, self._cores = [], {}, {}
        if self._group is not None:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(self._group)
            self._group = None

    def close(self) -> None:
        """Releases the job's actors and placement group, and disconnects from Ray."""
        if self._ray is not None:
            self.release()
            self._ray.shutdown()
            self._ray = None

    def _alive_nodes(self) -> List[Dict[str, Any]]:
        return [node for node in self._ray.nodes() if node["Alive"]]

    def _nodes_gone(self) -> Optional[str]:
        """Names the nodes of the last attempt that are no longer alive, if any."""
        alive = {node["NodeID"] for node in self._alive_nodes()}
        gone = [
            f"Ray node {p.location['ip']} (node {p.location['node_id'][:8]}), where {role} ran,"
            for role, p in self._placed.items()
            if p.location["node_id"] not in alive
        ]
        if not gone:
            return None
        return f"{'; '.join(gone)} is gone; {len(alive)} alive node(s) remain"

    def _explain_loss(self, placed: _Placed, error: BaseException) -> str:
        import ray

        try:
            alive = {node["NodeID"] for node in self._alive_nodes()}
        except (AttributeError, ray.exceptions.RayError):  # Disconnected (closed) meanwhile.
            alive = {placed.location["node_id"]}
        if placed.location["node_id"] not in alive:
            return (
                f"its Ray node {placed.location['ip']} (node {placed.location['node_id'][:8]}) died"
            )
        return f"its Ray actor{placed.where} died ({_first_line(error)})"

    def _unplaceable(self, tasks: int) -> str:
        """Why the placement group of `tasks` bundles was not placed, and the fix."""
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self._group)
        self._group = None
        settings = self._settings
        bundle = settings.bundle
        alive = self._alive_nodes()
        fit = [n for n in alive if all(n["Resources"].get(k, 0) >= v for k, v in bundle.items())]
        waited = (
            f"the Ray placement group of the job's {tasks} tasks ({bundle} each, "
            f"--ray_placement={settings.placement}) was not placed within "
            f"--ray_placement_timeout_secs={settings.placement_timeout_secs:g}: "
        )
        if settings.placement == "STRICT_SPREAD":
            return waited + (
                f"{len(fit)} alive Ray node(s) (of {len(alive)}) have the resources of one task, "
                f"and the job needs {tasks} distinct nodes. Add nodes to the Ray cluster, or pass "
                "--ray_placement=SPREAD to let tasks share nodes"
            )
        free = self._ray.available_resources()
        have = ", ".join(f"{free.get(k, 0):g} {k}" for k in bundle)
        need = ", ".join(f"{v * tasks:g} {k}" for k, v in bundle.items())
        return waited + (
            f"the {len(alive)} alive Ray node(s) have {have} free, and the job needs {need}. Add "
            "nodes, wait for other jobs to finish, or ask for less per task "
            "(--ray_cpus_per_task, --ray_gpus_per_task)"
        )


def shared_host_cores(
    configs: Sequence[ClusterConfig], locations: List[Dict[str, Any]]
) -> Dict[str, FrozenSet[int]]:
    """Each training task's share of its host's cores, for hosts that run several of them.

    Ray reserves CPUs by count, not by core: training tasks on one machine (Ray
    nodes that share it, or a placement that packs them) would each size their
    thread pools to every core and fight over them. As the local launcher
    does, each then gets its own share (`cpus.split_cores`); a task alone on
    its host keeps every core.

    >>> from estimator_dist.cluster.tf_config import make_local_cluster
    >>> configs = make_local_cluster(2, [1, 2], evaluator=True).tasks
    >>> here = {"host": "h1", "cores": [0, 1, 2, 3]}
    >>> shared_host_cores(configs, [here, here, here])
    {'chief-0': frozenset({0, 1}), 'worker-0': frozenset({2, 3})}
    >>> shared_host_cores(configs, [here, {"host": "h2", "cores": [0, 1]}, here])
    {}
    """
    by_host: Dict[str, List[int]] = {}
    for index, (config, location) in enumerate(zip(configs, locations)):
        if config.task_type in (CHIEF, WORKER):
            by_host.setdefault(location["host"], []).append(index)
    shares: Dict[str, FrozenSet[int]] = {}
    for indexes in by_host.values():
        if len(indexes) > 1:
            cores = split_cores(len(indexes), locations[indexes[0]]["cores"])
            shares.update({configs[i].role: share for i, share in zip(indexes, cores)})
    return shares


def cluster_of(tasks: List[Tuple[str, int]], locations: List[Dict[str, Any]]) -> LocalCluster:
    """The TF_CONFIG of every task: each node's address with the port its actor holds.

    Args:
      tasks: Each task's job name and index, as `JobShape.tasks` lists them.
      locations: Each task's actor's `TaskHost.location()`.

    >>> tasks = [("chief", 0), ("worker", 0), ("evaluator", 0)]
    >>> locations = [{"ip": "10.0.0.1", "port": 41001}, {"ip": "fd00::2", "port": 41002}, {}]
    >>> evaluator = cluster_of(tasks, locations).tasks[2]
    >>> evaluator.role, dict(evaluator.jobs)
    ('evaluator-0', {'chief': ('10.0.0.1:41001',), 'worker': ('[fd00::2]:41002',)})
    """
    jobs: Dict[str, List[str]] = {}
    for (job, _), location in zip(tasks, locations):
        if job != EVALUATOR:
            ip = location["ip"]
            host = f"[{ip}]" if ":" in ip else ip
            jobs.setdefault(job, []).append(f"{host}:{location['port']}")
    return LocalCluster(tuple(ClusterConfig(jobs, job, index) for job, index in tasks))


def _first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0].rstrip(".") if lines else type(error).__name__
