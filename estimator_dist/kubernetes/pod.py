"""The pod every kind runs: the `tensorflow` container, its volumes, grace period and env.

Built with the Kubernetes client's own models (`kubernetes.client`, imported
only when a manifest is built). The TFJob passes them to the Training SDK,
whose models are the same classes; the Indexed Jobs are those models too; the
JobSet and TrainJob take them as dicts into the Trainer SDK's models. Also here:
the `podFailurePolicy` that JobSet and Indexed Jobs share, the downward-API
variables a pod builds its TF_CONFIG from (`estimator_dist.cluster.pod_env`), and
the YAML. Why each field is what it is: docs/kubernetes.md.

>>> deterministic_exit_codes()[:3], len(deterministic_exit_codes())
([1, 2, 3], 127)
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from estimator_dist.base import exit_codes
from estimator_dist.cluster import pod_env
from estimator_dist.cluster.pod_env import TRAIN_GROUP
from estimator_dist.kubernetes.job_settings import (
    BASE_ENV,
    CONTAINER_NAME,
    JOBSET,
    POD_ANNOTATIONS,
    PORT,
    SDK_MISSING,
    TRAIN_COMMAND,
    TRAINJOB,
    ManifestSettings,
)

#: JobSet's labels on every pod, read through the downward API (jobset.sigs.k8s.io).
JOBSET_LABELS = {
    pod_env.JOBSET: "jobset.sigs.k8s.io/jobset-name",
    pod_env.REPLICATED_JOB: "jobset.sigs.k8s.io/replicatedjob-name",
    pod_env.JOB_INDEX: "jobset.sigs.k8s.io/job-index",
}
#: The label every pod of an Indexed Job manifest carries, which its headless Service selects.
JOB_LABEL = "estimator-dist/job"
#: The port's name in the kinds other than TFJob (the TFJob's is the operator's `tfjob-port`).
PORT_NAME = "grpc"


def client(kind: str) -> Any:
    """The `kubernetes.client` module, or an error naming the extra to install.

    Args:
      kind: The manifest's kind, for the error.

    Raises:
      Error: if the Kubernetes client is not installed (exit code 1).
    """
    from estimator_dist.base.errors import Error

    try:
        from kubernetes import client as k8s
    except ImportError as error:
        raise Error(
            SDK_MISSING.format(
                kind=kind, sdk="the Kubernetes client", error=error, pins="kubernetes"
            )
        ) from None
    return k8s


def deterministic_exit_codes() -> List[int]:
    """Exit codes 1-127: the package's deterministic failures, which no restart can fix."""
    return [code for code in range(1, 256) if not exit_codes.is_retryable(code)]


def pod_failure_policy(k8s: Any) -> Any:
    """Fails the Job on a deterministic exit; an evicted or preempted pod does not count.

    Kubernetes marks such a Job failed with reason `PodFailurePolicy`, which a
    JobSet's failure policy turns into failing the whole set.
    """
    return k8s.V1PodFailurePolicy(
        rules=[
            k8s.V1PodFailurePolicyRule(
                action="FailJob",
                on_exit_codes=k8s.V1PodFailurePolicyOnExitCodesRequirement(
                    container_name=CONTAINER_NAME,
                    operator="In",
                    values=deterministic_exit_codes(),
                ),
            ),
            k8s.V1PodFailurePolicyRule(
                action="Ignore",
                on_pod_conditions=[
                    k8s.V1PodFailurePolicyOnPodConditionsPattern(
                        type="DisruptionTarget", status="True"
                    )
                ],
            ),
        ]
    )


def pod_env_vars(k8s: Any, settings: ManifestSettings, group: str) -> List[Any]:
    """What a JobSet or Indexed Job pod builds its TF_CONFIG from (`cluster/pod_env.py`)."""
    replicas = ",".join(f"{role}={count}" for role, count in settings.roles().items())
    literals = {
        pod_env.REPLICAS: replicas,
        pod_env.SUBDOMAIN: settings.name,
        pod_env.PORT: str(PORT),
    }
    variables = [k8s.V1EnvVar(name=name, value=value) for name, value in literals.items()]
    if settings.kind in (JOBSET, TRAINJOB):
        for name, label in JOBSET_LABELS.items():
            path = f"metadata.labels['{label}']"
            source = k8s.V1EnvVarSource(field_ref=k8s.V1ObjectFieldSelector(field_path=path))
            variables.append(k8s.V1EnvVar(name=name, value_from=source))
    else:
        variables.append(k8s.V1EnvVar(name=pod_env.NAME, value=settings.name))
        variables.append(k8s.V1EnvVar(name=pod_env.REPLICATED_JOB, value=group))
    return variables


def pod_template(
    k8s: Any,
    settings: ManifestSettings,
    *,
    gpus: bool,
    port_name: str = PORT_NAME,
    env: Sequence[Any] = (),
    labels: Optional[Dict[str, str]] = None,
    restart_policy: Optional[str] = None,
    subdomain: Optional[str] = None,
) -> Any:
    """One role's pod: the `tensorflow` container, its volumes, its grace period.

    Args:
      k8s: The `kubernetes.client` module.
      settings: The job.
      gpus: Whether this role trains on `--gpus_per_worker` GPUs.
      port_name: The container port's name.
      env: Variables after the package's and `--env`'s.
      labels: Pod labels beside `--label`'s.
      restart_policy: The pod's `restartPolicy`, or None to leave it to the kind.
      subdomain: The pod's `subdomain` (its headless Service), or None.

    Returns:
      A `V1PodTemplateSpec`.
    """
    limits = {"nvidia.com/gpu": str(settings.gpus_per_worker)} if gpus else None
    container = k8s.V1Container(
        name=CONTAINER_NAME,
        image=settings.image,
        command=[*TRAIN_COMMAND[:-1], settings.program],
        args=list(settings.container_args()),
        ports=[k8s.V1ContainerPort(name=port_name, container_port=PORT)],
        env=[
            *(k8s.V1EnvVar(name=k, value=v) for k, v in (*BASE_ENV, *settings.env)),
            *env,
        ],
        resources=k8s.V1ResourceRequirements(limits=limits),
        volume_mounts=[
            k8s.V1VolumeMount(name=f"pvc-{i}", mount_path=m.path)
            for i, m in enumerate(settings.mounts)
        ],
    )
    volumes = [
        k8s.V1Volume(
            name=f"pvc-{i}",
            persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(claim_name=m.claim),
        )
        for i, m in enumerate(settings.mounts)
    ]
    return k8s.V1PodTemplateSpec(
        metadata=k8s.V1ObjectMeta(
            labels={**dict(settings.labels), **(labels or {})} or None,
            annotations=dict((*POD_ANNOTATIONS, *settings.annotations)),
        ),
        spec=k8s.V1PodSpec(
            containers=[container],
            volumes=volumes or None,
            restart_policy=restart_policy,
            subdomain=subdomain,
            termination_grace_period_seconds=settings.grace_period_secs(),
        ),
    )


def indexed_job_spec(
    k8s: Any, settings: ManifestSettings, group: str, count: int, **kw: Any
) -> Any:
    """An Indexed Job's spec running one group's pods, with the exit-code rules.

    Args:
      k8s: The `kubernetes.client` module.
      settings: The job.
      group: `train`, `ps` or `evaluator` (`cluster/pod_env.py`).
      count: The group's pods: completions and parallelism.
      **kw: More `V1JobSpec` fields: the kind's bound on restarts.

    Returns:
      A `V1JobSpec` with `completionMode: Indexed` and `restartPolicy: Never`
      pods, as a `podFailurePolicy` and `backoffLimitPerIndex` require.
    """
    labels = {JOB_LABEL: settings.name} if settings.kind not in (JOBSET, TRAINJOB) else None
    template = pod_template(
        k8s,
        settings,
        gpus=bool(settings.gpus_per_worker) and group == TRAIN_GROUP,
        env=pod_env_vars(k8s, settings, group),
        labels=labels,
        restart_policy="Never",
        subdomain=None if settings.kind in (JOBSET, TRAINJOB) else settings.name,
    )
    return k8s.V1JobSpec(
        completion_mode="Indexed",
        completions=count,
        parallelism=count,
        pod_failure_policy=pod_failure_policy(k8s),
        active_deadline_seconds=settings.active_deadline_secs,
        template=template,
        **kw,
    )


def serialize(model: Any) -> Dict[str, Any]:
    """A `kubernetes.client` model as the dict `kubectl` reads (camelCase, no nulls)."""
    from kubernetes import client as k8s

    return k8s.ApiClient().sanitize_for_serialization(model)


def to_yaml(documents: Sequence[Dict[str, Any]]) -> str:
    """The documents as one YAML stream, in order."""
    import yaml

    return yaml.safe_dump_all(documents, sort_keys=False, default_flow_style=False)
