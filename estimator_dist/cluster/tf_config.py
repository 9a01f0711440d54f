"""TF_CONFIG: parse, validate, normalise, and generate for a local cluster.

TensorFlow reads the cluster layout of a multi-worker job from the
`TF_CONFIG` environment variable and never checks it: a typo shows up as a
hang or a crash minutes later. `parse_tf_config` checks every field up
front, names the field, the value and the fix, and normalises the dialects
that platforms write into the one form `tf.estimator` handles:

* `master` (AI Platform 1.x, SageMaker's ps mode, TFJob) becomes `chief`. A `master`
  job would silently switch Estimator's distribute coordinator off.
* An `evaluator` listed inside `cluster` (Kubeflow TFJob) is taken out of
  it: TensorFlow expects the evaluator to be outside the cluster.
* A cluster of workers only (Ray Train, SageMaker) gets its worker 0 promoted to `chief`, and
  the other workers renumbered, identically on every task.

Example, a chief of a two-task cluster::

    TF_CONFIG='{"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"]},
                "task": {"type": "chief", "index": 0}}'

the other worker::

    TF_CONFIG='{"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"]},
                "task": {"type": "worker", "index": 0}}'

and the evaluator, which is not part of `cluster`::

    TF_CONFIG='{"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"]},
                "task": {"type": "evaluator", "index": 0}}'

>>> config = parse_tf_config(
...     '{"cluster": {"master": ["h0:1"], "worker": ["h1:1"]},'
...     ' "task": {"type": "master", "index": 0}}')
>>> config.task_type, config.num_workers
('chief', 2)
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
from typing import Any, Dict, Mapping, MutableMapping, Optional, Sequence, Tuple

from estimator_dist.base.errors import ClusterConfigError

CHIEF = "chief"
WORKER = "worker"
PS = "ps"
EVALUATOR = "evaluator"
#: Set to "1" on every task of a job that has an evaluator. TF_CONFIG leaves the evaluator out
#: of the cluster, so without it a training task cannot know that one will evaluate its models.
EVALUATOR_ENV = "ESTIMATOR_DIST_EVALUATOR"
MASTER = "master"

#: Job names accepted in TF_CONFIG, including the dialect alias `master`.
JOB_NAMES = (CHIEF, MASTER, WORKER, PS, EVALUATOR)

#: Appended to every TF_CONFIG error: where the value came from.
TF_CONFIG_SOURCE_NOTE = (
    "This value comes from the TF_CONFIG environment variable, which the "
    "platform (Kubeflow, Vertex AI, SageMaker, Ray) or `python -m "
    "estimator_dist.launch` sets; unset TF_CONFIG to train in one process."
)

_EXAMPLE = (
    '{"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222"]}, '
    '"task": {"type": "worker", "index": 0}}'
)
_ADDRESS = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):(?P<port>\d+)$")


def _fail(message: str) -> ClusterConfigError:
    return ClusterConfigError(f"Invalid TF_CONFIG: {message} {TF_CONFIG_SOURCE_NOTE}")


#: What gRPC (and Python's HTTP clients) read for a proxy.
_PROXY_VARIABLES = ("https_proxy", "HTTPS_PROXY", "http_proxy", "HTTP_PROXY", "grpc_proxy")


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """A validated, normalised TF_CONFIG.

    Attributes:
      jobs: Job name to task addresses, with only `chief`, `worker` and `ps`
        jobs (the evaluator is never part of it). Empty for a single process.
      task_type: `chief`, `worker`, `ps` or `evaluator`; None for a single
        process.
      task_index: Index of this task within its job.
      environment: TF_CONFIG's `environment` field, kept as given.
      rpc_layer: TF_CONFIG's `rpc_layer` field, kept as given.
      notes: Human-readable normalisations that were applied, to be logged.
    """

    jobs: Mapping[str, Tuple[str, ...]] = dataclasses.field(default_factory=dict)
    task_type: Optional[str] = None
    task_index: int = 0
    environment: Optional[str] = None
    rpc_layer: Optional[str] = None
    notes: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        frozen = {name: tuple(addresses) for name, addresses in self.jobs.items()}
        object.__setattr__(self, "jobs", types.MappingProxyType(frozen))

    @property
    def is_distributed(self) -> bool:
        """Whether this task belongs to a cluster (False for a single process)."""
        return bool(self.jobs)

    @property
    def num_workers(self) -> int:
        """Number of training workers, the chief included (1 for a single process)."""
        if not self.jobs:
            return 1
        return len(self.jobs.get(CHIEF, ())) + len(self.jobs.get(WORKER, ()))

    @property
    def num_ps(self) -> int:
        """Number of parameter server tasks."""
        return len(self.jobs.get(PS, ()))

    @property
    def is_chief(self) -> bool:
        """Whether this task writes checkpoints (the chief, or a single process)."""
        return self.task_type in (None, CHIEF)

    @property
    def role(self) -> str:
        """A short name for this task, such as `worker-1`, or `local`."""
        if self.task_type is None:
            return "local"
        return f"{self.task_type}-{self.task_index}"

    def to_tf_config(self) -> dict:
        """Returns the normalised TF_CONFIG as a dict that TensorFlow accepts."""
        if not self.jobs:
            return {}
        config: dict[str, Any] = {
            "cluster": {name: list(addresses) for name, addresses in self.jobs.items()},
            "task": {"type": self.task_type, "index": self.task_index},
        }
        if self.environment is not None:
            config["environment"] = self.environment
        if self.rpc_layer is not None:
            config["rpc_layer"] = self.rpc_layer
        return config

    def to_json(self) -> str:
        """Returns `to_tf_config()` as a JSON string for the environment."""
        return json.dumps(self.to_tf_config(), sort_keys=True)

    def keep_peers_direct(self, environ: MutableMapping[str, str]) -> None:
        """Adds the cluster's hosts to `NO_PROXY`/`no_proxy` where a proxy variable is set.

        gRPC honours `https_proxy`/`http_proxy` (and `no_proxy`): a task that
        inherited a proxy for its data or storage would send its collectives to
        the proxy and hang in session creation. The hosts already listed stay.

        >>> env = {"https_proxy": "http://proxy:3128", "no_proxy": "corp"}
        >>> ClusterConfig({"chief": ("h0:2000",), "worker": ("h1:2000",)}).keep_peers_direct(env)
        >>> env["no_proxy"], env["NO_PROXY"]
        ('corp,h0,h1', 'corp,h0,h1')
        """
        if not any(environ.get(name) for name in _PROXY_VARIABLES):
            return
        hosts = [
            address.rsplit(":", 1)[0].strip("[]") for job in self.jobs.values() for address in job
        ]
        for name in ("NO_PROXY", "no_proxy"):
            given = [
                h for n in ("NO_PROXY", "no_proxy") for h in environ.get(n, "").split(",") if h
            ]
            environ[name] = ",".join(dict.fromkeys([*given, *hosts]))


def parse_tf_config(raw: Optional[str]) -> ClusterConfig:
    """Parses and validates a TF_CONFIG string.

    Args:
      raw: The TF_CONFIG value; None or blank means a single local process.

    Returns:
      The normalised `ClusterConfig`.

    Raises:
      ClusterConfigError: if the value is not valid JSON or describes an
        impossible cluster. The message names the field, the value received,
        what was expected and how to fix it.
    """
    if raw is None or not raw.strip():
        return ClusterConfig()
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as error:
        raise _fail(
            f"it is not valid JSON ({error.msg} at line {error.lineno} column "
            f"{error.colno}); received {_clip(raw)}. Expected a JSON object such as "
            f"{_EXAMPLE}."
        ) from None
    if not isinstance(data, dict):
        raise _fail(
            f"expected a JSON object with `cluster` and `task`, received "
            f"{type(data).__name__} {_clip(raw)}."
        )
    for key in ("environment", "rpc_layer"):
        if key in data and not isinstance(data[key], str):
            raise _fail(f"`{key}` must be a string, received {data[key]!r}.")
    cluster = data.get("cluster") or {}
    task = data.get("task")
    if not cluster:
        if task:
            raise _fail(
                f"`task` is {json.dumps(task)} but `cluster` is missing or empty. "
                f"Give the full cluster on every task, e.g. {_EXAMPLE}."
            )
        return ClusterConfig(environment=data.get("environment"), rpc_layer=data.get("rpc_layer"))
    jobs = _validate_jobs(cluster)
    task_type, task_index = _validate_task(task, jobs)
    return _normalise(jobs, task_type, task_index, data.get("environment"), data.get("rpc_layer"))


def _clip(raw: str, limit: int = 200) -> str:
    text = repr(raw)
    return text if len(text) <= limit else text[:limit] + "...'"


def _validate_jobs(cluster: Any) -> dict[str, list[str]]:
    if not isinstance(cluster, dict):
        raise _fail(
            f"`cluster` must map job names to address lists, received "
            f"{type(cluster).__name__} {cluster!r}. Expected e.g. {_EXAMPLE}."
        )
    unknown = sorted(set(cluster) - set(JOB_NAMES))
    if unknown:
        raise _fail(
            f"unknown job name(s) {', '.join(map(repr, unknown))} in `cluster`; "
            f"valid job names are {', '.join(JOB_NAMES)}."
        )
    if CHIEF in cluster and MASTER in cluster:
        raise _fail(
            "`cluster` has both a `chief` and a `master` job; they name the same "
            "role. Keep one of them."
        )
    seen: dict[str, str] = {}
    jobs: dict[str, list[str]] = {}
    for name, addresses in cluster.items():
        if isinstance(addresses, dict):
            raise _fail(
                f"`cluster.{name}` is a map of task index to address, {addresses!r}: a sparse "
                "cluster, which Kubeflow writes for a TFJob with `enableDynamicWorker: true`. "
                "Estimator needs every task's full cluster; set `enableDynamicWorker: false`."
            )
        if not isinstance(addresses, list) or not addresses:
            raise _fail(
                f"`cluster.{name}` must be a non-empty list of 'host:port' strings, "
                f"received {addresses!r}."
            )
        if name in (CHIEF, MASTER, EVALUATOR) and len(addresses) != 1:
            raise _fail(
                f"`cluster.{name}` must have exactly one address, received "
                f"{len(addresses)}: {addresses!r}. Run one {name} task."
            )
        for index, address in enumerate(addresses):
            where = f"cluster.{name}[{index}]"
            _validate_address(where, address)
            if address in seen:
                raise _fail(
                    f"address {address!r} is used twice, by `{seen[address]}` and "
                    f"`{where}`. Every task needs its own host:port."
                )
            seen[address] = where
        jobs[name] = list(addresses)
    if not (set(jobs) & {CHIEF, MASTER, WORKER}):
        raise _fail(
            f"`cluster` has no `chief` or `worker` job (jobs: {', '.join(sorted(jobs))}); "
            "at least one training task is needed."
        )
    return jobs


def _validate_address(where: str, address: Any) -> None:
    if not isinstance(address, str):
        raise _fail(f"`{where}` must be a 'host:port' string, received {address!r}.")
    match = _ADDRESS.match(address)
    if not match or not 1 <= int(match.group("port")) <= 65535:
        raise _fail(
            f"`{where}` is {address!r}; expected 'host:port' with a port from 1 to "
            "65535, such as 'worker-0.example:2222' or '[::1]:2222'."
        )


def _validate_task(task: Any, jobs: Mapping[str, Sequence[str]]) -> Tuple[str, int]:
    if not isinstance(task, dict):
        raise _fail(
            f'`task` must be an object like {{"type": "worker", "index": 0}}, '
            f"received {task!r}. Every task of a cluster needs its own `task`."
        )
    task_type = task.get("type")
    task_index = task.get("index", 0)
    if task_type not in JOB_NAMES:
        raise _fail(f"`task.type` is {task_type!r}; expected one of {', '.join(JOB_NAMES)}.")
    if isinstance(task_index, bool) or not isinstance(task_index, int):
        raise _fail(f"`task.index` must be an integer, received {task_index!r}.")
    if task_type == EVALUATOR and EVALUATOR not in jobs:
        if task_index != 0:
            raise _fail(
                f"`task.index` is {task_index} for the evaluator; there is only one "
                "evaluator, with index 0."
            )
        return task_type, task_index
    if task_type not in jobs:
        raise _fail(
            f"`task.type` is {task_type!r} but `cluster` has no such job "
            f"(jobs: {', '.join(sorted(jobs))}). Add the job to `cluster` or fix "
            "`task.type`."
        )
    size = len(jobs[task_type])
    if not 0 <= task_index < size:
        raise _fail(
            f"`task.index` {task_index} is out of range for job {task_type!r}, which "
            f"has {size} address(es); valid indexes are 0 to {size - 1}."
        )
    return task_type, task_index


def _normalise(
    jobs: dict[str, list[str]],
    task_type: str,
    task_index: int,
    environment: Optional[str],
    rpc_layer: Optional[str],
) -> ClusterConfig:
    notes = []
    if MASTER in jobs:
        jobs[CHIEF] = jobs.pop(MASTER)
        notes.append(
            "renamed job 'master' to 'chief' (a 'master' job disables Estimator's "
            "distribute coordinator)"
        )
        if task_type == MASTER:
            task_type = CHIEF
    if EVALUATOR in jobs:
        del jobs[EVALUATOR]
        notes.append("took 'evaluator' out of the cluster (TensorFlow runs it outside)")
    if CHIEF not in jobs:
        workers = jobs.pop(WORKER)
        jobs[CHIEF] = workers[:1]
        if len(workers) > 1:
            jobs[WORKER] = workers[1:]
        notes.append("promoted worker 0 to chief (the cluster had no chief)")
        if task_type == WORKER:
            task_type, task_index = (CHIEF, 0) if task_index == 0 else (WORKER, task_index - 1)
    ordered = {name: jobs[name] for name in (CHIEF, WORKER, PS) if name in jobs}
    return ClusterConfig(ordered, task_type, task_index, environment, rpc_layer, tuple(notes))


@dataclasses.dataclass(frozen=True)
class LocalCluster:
    """The TF_CONFIG of every task of a cluster on one machine.

    Attributes:
      tasks: One `ClusterConfig` per task: chief, workers, parameter servers,
        then the evaluator if any.
    """

    tasks: Tuple[ClusterConfig, ...]

    @property
    def training_tasks(self) -> Tuple[ClusterConfig, ...]:
        """The chief and workers, which must all finish for training to end."""
        return tuple(t for t in self.tasks if t.task_type in (CHIEF, WORKER))

    def tf_configs(self) -> Dict[str, str]:
        """Each task's TF_CONFIG value, by role: what to start each task's process with.

        >>> configs = make_local_cluster(2, ports=[2001, 2002], evaluator=True).tf_configs()
        >>> list(configs)
        ['chief-0', 'worker-0', 'evaluator-0']
        >>> parse_tf_config(configs["worker-0"]).jobs["worker"]
        ('localhost:2002',)
        """
        return {task.role: task.to_json() for task in self.tasks}


def make_local_cluster(
    num_workers: int,
    ports: Sequence[int],
    num_ps: int = 0,
    evaluator: bool = False,
    host: str = "localhost",
) -> LocalCluster:
    """Builds the TF_CONFIG of each task of a cluster on one host.

    Args:
      num_workers: Training tasks, the chief included (at least 1).
      ports: One free port per chief, worker and parameter server task.
      num_ps: Parameter server tasks.
      evaluator: Whether to add an evaluator task (it needs no port).
      host: Host name or address the tasks use to reach each other.

    Returns:
      A `LocalCluster`.

    Raises:
      ValueError: if the counts are negative or the ports do not match them.

    >>> cluster = make_local_cluster(2, ports=[2001, 2002], evaluator=True)
    >>> [task.role for task in cluster.tasks]
    ['chief-0', 'worker-0', 'evaluator-0']
    """
    if num_workers < 1 or num_ps < 0:
        raise ValueError(
            f"a local cluster needs num_workers >= 1 and num_ps >= 0, received "
            f"num_workers={num_workers}, num_ps={num_ps}."
        )
    if len(ports) != num_workers + num_ps:
        raise ValueError(
            f"expected {num_workers + num_ps} ports (one per worker and ps task), "
            f"received {len(ports)}."
        )
    addresses = [f"{host}:{port}" for port in ports]
    jobs = {CHIEF: addresses[:1]}
    if num_workers > 1:
        jobs[WORKER] = addresses[1:num_workers]
    if num_ps:
        jobs[PS] = addresses[num_workers:]
    tasks = [
        ClusterConfig(jobs, name, index)
        for name in (CHIEF, WORKER, PS)
        for index in range(len(jobs.get(name, ())))
    ]
    if evaluator:
        tasks.append(ClusterConfig(jobs, EVALUATOR, 0))
    return LocalCluster(tuple(tasks))
