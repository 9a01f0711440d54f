"""This task's cluster, read from what its platform put in the environment.

TF_CONFIG always wins: Kubeflow, Vertex AI, SageMaker, Ray and the launcher
all write it (`cluster.parse_tf_config` reads every dialect). Then:

* the `ESTIMATOR_DIST_*` variables of a JobSet, Kubeflow Trainer v2 or
  Indexed Job pod, from which `pod_env.cluster_from_pod` builds the cluster
  (those kinds write no TF_CONFIG);
* `CLUSTER_SPEC`, Vertex AI's description of the same cluster under its
  worker pool names (`workerpool0` the chief, `workerpool1` the workers,
  `workerpool2` the parameter servers, `workerpool3` the evaluator). It is read
  only when TF_CONFIG names no cluster, so that the replicas of a Vertex job
  never each train alone into their shared model_dir.
* `SM_FRAMEWORK_PARAMS`: SageMaker's `parameter_server` distribution is
  refused. Its toolkit starts the parameter servers itself, as plain
  TensorFlow servers that know the chief as `master` and never join the
  package's start-up check: measured, the chief waited for them and exited
  151; with that check skipped, the first checkpoint failed on a ps with
  "No worker known as /job:chief/replica:0/task:0".

>>> spec = ('{"cluster": {"workerpool0": ["h0:2222"], "workerpool1": ["h1:2222"]},'
...         ' "task": {"type": "workerpool1", "index": 0}}')
>>> cluster_from_environment({"CLUSTER_SPEC": spec}).role
'worker-0'
"""

from __future__ import annotations

import dataclasses
import json
from typing import Mapping

from estimator_dist.base.errors import ClusterConfigError
from estimator_dist.cluster.pod_env import cluster_from_pod
from estimator_dist.cluster.tf_config import (
    CHIEF,
    EVALUATOR,
    PS,
    TF_CONFIG_SOURCE_NOTE,
    WORKER,
    ClusterConfig,
    parse_tf_config,
)

#: Vertex AI's worker pools, in `workerPoolSpecs` order, and the TF_CONFIG job each one is.
VERTEX_POOLS = {
    "workerpool0": CHIEF,
    "workerpool1": WORKER,
    "workerpool2": PS,
    "workerpool3": EVALUATOR,
}

#: Logged on a task whose cluster came from CLUSTER_SPEC.
CLUSTER_SPEC_NOTE = "built from Vertex AI's CLUSTER_SPEC, as TF_CONFIG names no cluster"

#: Appended to every CLUSTER_SPEC error.
CLUSTER_SPEC_SOURCE_NOTE = (
    "Vertex AI sets CLUSTER_SPEC; estimator-dist reads it only when TF_CONFIG names no "
    "cluster. Set TF_CONFIG, or unset CLUSTER_SPEC to train in one process."
)

#: The key SageMaker puts in SM_FRAMEWORK_PARAMS for `distribution={"parameter_server": ...}`.
SAGEMAKER_PS_KEY = "sagemaker_parameter_server_enabled"

#: Why a SageMaker parameter-server job is refused, with the fix.
SAGEMAKER_PS_REFUSED = (
    "SageMaker's parameter_server distribution cannot run estimator-dist: SM_FRAMEWORK_PARAMS "
    "has {key}=true and TF_CONFIG lists {num_ps} ps task(s). The SageMaker TensorFlow toolkit "
    "runs those parameter servers itself, as plain TensorFlow servers that know the chief as "
    "'master' (estimator-dist must call it 'chief') and never join the tasks' start-up check, "
    "so the job would wait for them and fail. Submit the TensorFlow estimator with "
    'distribution={{"multi_worker_mirrored_strategy": {{"enabled": True}}}} instead '
    "(docs/platforms.md)."
)


def cluster_from_environment(environ: Mapping[str, str]) -> ClusterConfig:
    """Returns this task's validated cluster from its environment variables.

    Args:
      environ: The process environment, such as `os.environ`.

    Returns:
      The `ClusterConfig` of TF_CONFIG when it names a cluster; else the one a
      JobSet or Indexed Job pod builds (`pod_env`); else that of Vertex AI's
      CLUSTER_SPEC when set; else a single process.

    Raises:
      ClusterConfigError: if the variable read is malformed, or the job is a
        SageMaker parameter-server job.
    """
    cluster = parse_tf_config(environ.get("TF_CONFIG"))
    if cluster.is_distributed:
        _refuse_sagemaker_parameter_servers(cluster, environ)
        return cluster
    pod = cluster_from_pod(environ)
    if pod is not None:
        return pod
    spec = environ.get("CLUSTER_SPEC")
    if spec is None or not spec.strip():
        return cluster
    return parse_cluster_spec(spec)


def parse_cluster_spec(raw: str) -> ClusterConfig:
    """Parses Vertex AI's CLUSTER_SPEC into the cluster TF_CONFIG would give.

    Args:
      raw: The CLUSTER_SPEC value, such as
        `{"cluster": {"workerpool0": ["h0:2222"]}, "task": {"type": "workerpool0", "index": 0}}`;
        `environment` is kept, `job`, `trial` and `open_ports` are ignored.

    Returns:
      The normalised `ClusterConfig`, noting where it came from.

    Raises:
      ClusterConfigError: naming what is wrong with the value.
    """
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as error:
        raise _fail(f"it is not valid JSON ({error.msg}); received {raw[:200]!r}.") from None
    cluster = data.get("cluster") if isinstance(data, dict) else None
    task = data.get("task") if isinstance(data, dict) else None
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise _fail(
            "expected an object with `cluster` (worker pool name to addresses) and `task` "
            f'(such as {{"type": "workerpool1", "index": 0}}), received {raw[:200]!r}.'
        )
    pools = [*cluster, task.get("type")]
    unknown = [pool for pool in pools if pool not in VERTEX_POOLS]
    if unknown:
        raise _fail(
            f"unknown worker pool(s) {', '.join(map(repr, unknown))}; Vertex AI names them "
            + ", ".join(f"{pool} ({job})" for pool, job in VERTEX_POOLS.items())
            + "."
        )
    tf_config = {
        "cluster": {VERTEX_POOLS[pool]: addresses for pool, addresses in cluster.items()},
        "task": {"type": VERTEX_POOLS[task["type"]], "index": task.get("index", 0)},
    }
    if "environment" in data:
        tf_config["environment"] = data["environment"]
    try:
        config = parse_tf_config(json.dumps(tf_config))
    except ClusterConfigError as error:
        reason = str(error).removeprefix("Invalid TF_CONFIG: ")
        reason = reason.removesuffix(" " + TF_CONFIG_SOURCE_NOTE)
        raise _fail(f"as the TF_CONFIG {json.dumps(tf_config)}, {reason}") from None
    return dataclasses.replace(config, notes=(CLUSTER_SPEC_NOTE, *config.notes))


def _fail(message: str) -> ClusterConfigError:
    return ClusterConfigError(f"Invalid CLUSTER_SPEC: {message} {CLUSTER_SPEC_SOURCE_NOTE}")


def _refuse_sagemaker_parameter_servers(cluster: ClusterConfig, environ: Mapping[str, str]) -> None:
    if not cluster.num_ps:
        return
    try:
        params = json.loads(environ.get("SM_FRAMEWORK_PARAMS") or "{}")
    except json.JSONDecodeError:
        return
    if isinstance(params, dict) and str(params.get(SAGEMAKER_PS_KEY)).lower() == "true":
        raise ClusterConfigError(
            SAGEMAKER_PS_REFUSED.format(key=SAGEMAKER_PS_KEY, num_ps=cluster.num_ps)
        )
