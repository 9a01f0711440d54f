"""TF_CONFIG built inside a Kubernetes pod, from what JobSet or an Indexed Job gives it.

Kubeflow Trainer v2's plain runtime, a bare JobSet and plain Indexed Jobs write
no TF_CONFIG: every pod of a replicated job gets the same environment. The
manifests of `python -m estimator_dist.manifest --kind=trainjob|jobset|indexed-job`
therefore pass each container what it needs to build its own, and this module
builds it, the same cluster on every pod:

* `ESTIMATOR_DIST_REPLICAS` (a literal): tasks per role, such as
  `chief=1,worker=2,evaluator=1`;
* `ESTIMATOR_DIST_SUBDOMAIN`, `ESTIMATOR_DIST_PORT` (literals): the headless
  Service that names the pods, every task's gRPC port;
* `ESTIMATOR_DIST_REPLICATED_JOB`: the pod's group, `train`, `ps` or
  `evaluator`: JobSet's label `jobset.sigs.k8s.io/replicatedjob-name` through
  the downward API, or an Indexed Job's literal;
* JobSet only, through the downward API: `ESTIMATOR_DIST_JOBSET` (label
  `jobset.sigs.k8s.io/jobset-name`, a TrainJob's name) and
  `ESTIMATOR_DIST_JOB_INDEX` (label `jobset.sigs.k8s.io/job-index`, 0 here);
* Indexed Jobs only: `ESTIMATOR_DIST_NAME` (a literal), their names' prefix;
* `JOB_COMPLETION_INDEX`, which Kubernetes sets in an Indexed Job's pods, and
  `HOSTNAME`, the kubelet's, checked against the host the others reach.

Group `train` holds the training tasks by completion index: 0 is the chief,
`i` is worker `i-1`; `ps` and `evaluator` are their own groups. A pod's
address is `<host>.<subdomain>:<port>`, where host is JobSet's
`<jobset>-<group>-<jobIndex>-<index>` (with `network.enableDNSHostnames`) or
an Indexed Job's `<name>-<group>-<index>`. An explicit TF_CONFIG wins; this
runs only when `ESTIMATOR_DIST_REPLICAS` is set and TF_CONFIG names no cluster.

>>> env = {"ESTIMATOR_DIST_REPLICAS": "chief=1,worker=1", "ESTIMATOR_DIST_SUBDOMAIN": "m",
...        "ESTIMATOR_DIST_PORT": "2222", "ESTIMATOR_DIST_REPLICATED_JOB": "train",
...        "ESTIMATOR_DIST_JOBSET": "m", "ESTIMATOR_DIST_JOB_INDEX": "0",
...        "JOB_COMPLETION_INDEX": "1", "HOSTNAME": "m-train-0-1"}
>>> config = cluster_from_pod(env)
>>> config.role, config.jobs["chief"]
('worker-0', ('m-train-0-0.m:2222',))
"""

from __future__ import annotations

import dataclasses
import json
from typing import Dict, List, Mapping, Optional, Tuple

from estimator_dist.base.errors import ClusterConfigError
from estimator_dist.cluster.tf_config import (
    CHIEF,
    EVALUATOR,
    EVALUATOR_ENV,
    PS,
    WORKER,
    ClusterConfig,
    parse_tf_config,
)

REPLICAS = "ESTIMATOR_DIST_REPLICAS"
SUBDOMAIN = "ESTIMATOR_DIST_SUBDOMAIN"
PORT = "ESTIMATOR_DIST_PORT"
REPLICATED_JOB = "ESTIMATOR_DIST_REPLICATED_JOB"
JOBSET = "ESTIMATOR_DIST_JOBSET"
JOB_INDEX = "ESTIMATOR_DIST_JOB_INDEX"
NAME = "ESTIMATOR_DIST_NAME"
COMPLETION_INDEX = "JOB_COMPLETION_INDEX"

#: The groups of pods (replicated jobs, or Jobs) and the roles each holds.
TRAIN_GROUP, PS_GROUP, EVALUATOR_GROUP = "train", "ps", "evaluator"
GROUPS = (TRAIN_GROUP, PS_GROUP, EVALUATOR_GROUP)
ROLES = (CHIEF, WORKER, PS, EVALUATOR)

#: Where the manifest sets each variable, for the error that finds it missing.
SOURCES = {
    REPLICAS: "the container's env, a literal such as chief=1,worker=2,evaluator=1",
    SUBDOMAIN: "the container's env, a literal: the headless Service's name "
    "(JobSet: spec.network.subdomain, default the JobSet's name)",
    PORT: "the container's env, a literal: the container port",
    REPLICATED_JOB: "the container's env, valueFrom.fieldRef "
    "metadata.labels['jobset.sigs.k8s.io/replicatedjob-name'] (an Indexed Job: a literal)",
    JOBSET: "the container's env, valueFrom.fieldRef "
    "metadata.labels['jobset.sigs.k8s.io/jobset-name']",
    JOB_INDEX: "the container's env, valueFrom.fieldRef "
    "metadata.labels['jobset.sigs.k8s.io/job-index']",
    NAME: "the container's env, a literal: the prefix of the Jobs' names",
    COMPLETION_INDEX: "Kubernetes, for a Job with completionMode: Indexed",
    "HOSTNAME": "the kubelet, from the pod's hostname",
}

#: Logged on a task whose cluster was built here.
POD_NOTE = "built inside the pod from {source}, as TF_CONFIG names no cluster"

#: Appended to every error.
FIX = (
    "These variables come from the manifest of `python -m estimator_dist.manifest "
    "--kind=trainjob|jobset|indexed-job`: regenerate it rather than edit them, or set TF_CONFIG."
)


def cluster_from_pod(environ: Mapping[str, str]) -> Optional[ClusterConfig]:
    """Returns the cluster a JobSet or Indexed Job pod builds from its environment.

    Args:
      environ: The process environment, such as `os.environ`.

    Returns:
      The validated `ClusterConfig`, or None when `ESTIMATOR_DIST_REPLICAS`
      is unset (the pod was not made by the package's manifest).

    Raises:
      ClusterConfigError: naming the variable missing or wrong, the value
        received and the manifest field that sets it.
    """
    if REPLICAS not in environ:
        return None
    counts = _replicas(environ[REPLICAS])
    group = _get(environ, REPLICATED_JOB)
    if group not in GROUPS:
        raise _fail(REPLICATED_JOB, group, f"one of {', '.join(GROUPS)}")
    index = _number(environ, COMPLETION_INDEX)
    port = _number(environ, PORT)
    subdomain = _get(environ, SUBDOMAIN)
    if JOBSET in environ:
        jobset, job_index = _get(environ, JOBSET), _get(environ, JOB_INDEX)
        if job_index != "0":
            raise _fail(
                JOB_INDEX,
                job_index,
                f"0: every replicated job of the manifest has replicas: 1 and its tasks as "
                f"completions, so the {group} tasks are one Indexed Job's pods",
            )
        prefix, source = f"{jobset}-{{group}}-0-", "JobSet's labels"
    else:
        prefix, source = f"{_get(environ, NAME)}-{{group}}-", "the Indexed Job's env"
    hosts = _hosts(counts, prefix)
    task_type, task_index = _role(counts, group, index)
    host = hosts[task_type][task_index]
    if environ.get("HOSTNAME") != host:
        raise _fail(
            "HOSTNAME",
            environ.get("HOSTNAME"),
            f"{host!r}, the name the other pods reach this one by (JobSet: "
            "spec.network.enableDNSHostnames must be true; an Indexed Job: the pod's "
            "hostname is left unset so that Kubernetes makes it <job>-<index>)",
        )
    tf_config = {
        "cluster": {
            role: [f"{name}.{subdomain}:{port}" for name in names]
            for role, names in hosts.items()
            if names
        },
        "task": {"type": task_type, "index": task_index},
    }
    config = parse_tf_config(json.dumps(tf_config))
    note = POD_NOTE.format(source=source)
    return dataclasses.replace(config, notes=(note, *config.notes))


def job_has_evaluator(environ: Mapping[str, str]) -> bool:
    """Whether the job has an evaluator, which TF_CONFIG does not say to training tasks.

    The launcher (local and Ray) says so with `EVALUATOR_ENV`; a pod of the
    package's manifests lists it in `ESTIMATOR_DIST_REPLICAS`.

    >>> job_has_evaluator({"ESTIMATOR_DIST_REPLICAS": "chief=1,worker=1,evaluator=1"})
    True
    >>> job_has_evaluator({"ESTIMATOR_DIST_EVALUATOR": "1"}), job_has_evaluator({})
    (True, False)
    """
    if environ.get(EVALUATOR_ENV) == "1":
        return True
    try:
        return REPLICAS in environ and _replicas(environ[REPLICAS])[EVALUATOR] > 0
    except ClusterConfigError:  # Said where the pod's TF_CONFIG is built from it.
        return False


def _replicas(raw: str) -> Dict[str, int]:
    counts = dict.fromkeys(ROLES, 0)
    for item in raw.split(","):
        role, _, count = item.strip().partition("=")
        if role not in counts or not count.isdigit():
            raise _fail(REPLICAS, raw, f"ROLE=COUNT items of {', '.join(ROLES)}, comma-separated")
        counts[role] = int(count)
    if counts[CHIEF] != 1 or counts[EVALUATOR] > 1:
        raise _fail(REPLICAS, raw, "chief=1 and at most evaluator=1")
    return counts


def _hosts(counts: Mapping[str, int], prefix: str) -> Dict[str, List[str]]:
    """Every role's pod hosts, in task order; `prefix` has a `{group}` field."""
    train = prefix.format(group=TRAIN_GROUP)
    return {
        CHIEF: [f"{train}0"],
        WORKER: [f"{train}{i + 1}" for i in range(counts[WORKER])],
        PS: [prefix.format(group=PS_GROUP) + str(i) for i in range(counts[PS])],
        EVALUATOR: [prefix.format(group=EVALUATOR_GROUP) + "0"] * counts[EVALUATOR],
    }


def _role(counts: Mapping[str, int], group: str, index: int) -> Tuple[str, int]:
    if group == TRAIN_GROUP:
        size = counts[CHIEF] + counts[WORKER]
        role = (CHIEF, 0) if index == 0 else (WORKER, index - 1)
    else:
        size, role = counts[group], (group, index)
    if index >= size:
        raise _fail(
            COMPLETION_INDEX,
            str(index),
            f"an index below {size}, the {group} group's tasks in {REPLICAS}; the Job's "
            "completions and parallelism must equal that count",
        )
    return role


def _get(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise _fail(name, environ.get(name), "a value")
    return value


def _number(environ: Mapping[str, str], name: str) -> int:
    value = _get(environ, name)
    if not value.isdigit():
        raise _fail(name, value, "a whole number")
    return int(value)


def _fail(name: str, value: Optional[str], expected: str) -> ClusterConfigError:
    received = "is unset" if value is None else f"is {value!r}"
    return ClusterConfigError(
        f"Cannot build TF_CONFIG inside the pod: {name} {received}; expected "
        f"{expected}. It is set by {SOURCES[name]}. {FIX}"
    )
