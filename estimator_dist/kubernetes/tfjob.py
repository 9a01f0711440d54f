"""A Kubeflow TFJob (`kubeflow.org/v1`) whose every replica runs `estimator_dist.train`.

`build_tfjob` turns the validated `ManifestSettings` into the Kubeflow
Training SDK's own model (`KubeflowOrgV1TFJob`, with the shared pod of
`kubernetes.pod` inside). Only it imports the SDK, so the package works
without it. Why each field is what it is (replicas, `restartPolicy: ExitCode`,
`cleanPodPolicy`, the grace period, volumes, GPUs): docs/kubernetes.md.

>>> from estimator_dist.config.shape import JobShape
>>> from estimator_dist.kubernetes.job_settings import ManifestSettings
>>> settings = ManifestSettings(name="mnist", image="trainer:1", model_dir="gs://bucket/run1",
...     train_args=("--model_dir=gs://bucket/run1",), shape=JobShape(2, 0, False))
>>> replicas(settings), clean_pod_policy(settings)
({'Chief': 1, 'Worker': 1}, 'Running')
"""

from __future__ import annotations

from typing import Any, Dict

from estimator_dist.base.errors import Error
from estimator_dist.kubernetes import pod
from estimator_dist.kubernetes.job_settings import (
    PORT,
    SDK_MISSING,
    TFJOB,
    ManifestSettings,
)

API_VERSION = "kubeflow.org/v1"
KIND = "TFJob"
#: The operator's port name: it builds TF_CONFIG from it.
PORT_NAME = "tfjob-port"
#: TFJob replica types by TF_CONFIG role.
REPLICA_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
CHIEF, WORKER = REPLICA_TYPES["chief"], REPLICA_TYPES["worker"]
#: Every replica's policy: the operator restarts exits 128-255 and fails the job on 1-127.
RESTART_POLICY = "ExitCode"


def replicas(settings: ManifestSettings) -> Dict[str, int]:
    """Replica counts by TFJob replica type, in the order they are written."""
    return {REPLICA_TYPES[role]: count for role, count in settings.roles().items()}


def clean_pod_policy(settings: ManifestSettings) -> str:
    """`None` keeps an evaluator's final evaluation alive once the chief succeeded."""
    return "None" if settings.evaluator else "Running"


def operator_tf_config(settings: ManifestSettings, kind: str, index: int) -> Dict[str, Any]:
    """The TF_CONFIG the training operator writes into one replica's pod.

    >>> from estimator_dist.config.shape import JobShape
    >>> settings = ManifestSettings(name="m", image="i", model_dir="gs://b/r", train_args=(),
    ...     shape=JobShape(1, 0, False))
    >>> operator_tf_config(settings, "Chief", 0)["cluster"]
    {'chief': ['m-chief-0.default.svc:2222']}
    """
    cluster = {
        other.lower(): [
            f"{settings.name}-{other.lower()}-{i}.{settings.namespace}.svc:{PORT}"
            for i in range(count)
        ]
        for other, count in replicas(settings).items()
    }
    return {
        "cluster": cluster,
        "task": {"type": kind.lower(), "index": index},
        "environment": "cloud",
    }


def build_tfjob(settings: ManifestSettings) -> Any:
    """Builds the TFJob as the Training SDK's `KubeflowOrgV1TFJob`.

    Raises:
      Error: if the Kubeflow Training SDK is not installed (exit code 1).
    """
    try:
        from kubeflow.training import models
    except ImportError as error:
        raise Error(
            SDK_MISSING.format(
                kind=TFJOB,
                sdk="the Kubeflow Training SDK",
                error=error,
                pins="kubeflow-training 1.9.4",
            )
        ) from None
    specs = {
        kind: models.KubeflowOrgV1ReplicaSpec(
            replicas=count,
            restart_policy=RESTART_POLICY,
            template=pod.pod_template(
                models,
                settings,
                gpus=bool(settings.gpus_per_worker) and kind in (CHIEF, WORKER),
                port_name=PORT_NAME,
            ),
        )
        for kind, count in replicas(settings).items()
    }
    return models.KubeflowOrgV1TFJob(
        api_version=API_VERSION,
        kind=KIND,
        metadata=models.V1ObjectMeta(
            name=settings.name,
            namespace=settings.namespace,
            labels=dict(settings.labels) or None,
            annotations=dict(settings.annotations) or None,
        ),
        spec=models.KubeflowOrgV1TFJobSpec(
            tf_replica_specs=specs,
            run_policy=models.KubeflowOrgV1RunPolicy(
                backoff_limit=settings.backoff_limit,
                clean_pod_policy=clean_pod_policy(settings),
                active_deadline_seconds=settings.active_deadline_secs,
                ttl_seconds_after_finished=settings.ttl_secs_after_finished,
            ),
        ),
    )
