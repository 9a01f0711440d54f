"""A headless Service and plain Indexed Jobs (`batch/v1`): the job on a cluster with no operator.

One Job per group: `<name>-train` (the chief at completion index 0, the
workers after it), `<name>-ps`, `<name>-evaluator`. Kubernetes names each pod's
host `<job>-<index>`, and the headless Service `<name>` (the pods' subdomain)
makes it `<job>-<index>.<name>`, the address every pod writes into its
TF_CONFIG (`estimator_dist.cluster.pod_env`). The exit-code contract is the Jobs'
`podFailurePolicy`: 1-127 fails the Job, 128-255 replaces that pod, at most
`--backoff_limit` times per index (`backoffLimitPerIndex`), and the package's
start-up agreement makes the other tasks meet the new pod. Built with the
Kubernetes client's models; why each field is what it is: docs/kubernetes.md.
"""

from __future__ import annotations

from typing import Any, List

from estimator_dist.kubernetes import pod
from estimator_dist.kubernetes.job_settings import PORT, ManifestSettings


def build_indexed_jobs(settings: ManifestSettings) -> List[Any]:
    """Builds the Service, then one Job per group, as `kubernetes.client` models.

    Raises:
      Error: if the Kubernetes client is not installed (exit code 1).
    """
    k8s = pod.client(settings.kind)
    labels = dict(settings.labels) or None
    annotations = dict(settings.annotations) or None
    service = k8s.V1Service(
        api_version="v1",
        kind="Service",
        metadata=k8s.V1ObjectMeta(name=settings.name, namespace=settings.namespace, labels=labels),
        spec=k8s.V1ServiceSpec(
            cluster_ip="None",
            publish_not_ready_addresses=True,
            selector={pod.JOB_LABEL: settings.name},
            ports=[k8s.V1ServicePort(name=pod.PORT_NAME, port=PORT, target_port=PORT)],
        ),
    )
    jobs = [
        k8s.V1Job(
            api_version="batch/v1",
            kind="Job",
            metadata=k8s.V1ObjectMeta(
                name=f"{settings.name}-{group}",
                namespace=settings.namespace,
                labels=labels,
                annotations=annotations,
            ),
            spec=pod.indexed_job_spec(
                k8s,
                settings,
                group,
                count,
                backoff_limit_per_index=settings.backoff_limit,
                max_failed_indexes=0,
                ttl_seconds_after_finished=settings.ttl_secs_after_finished,
            ),
        )
        for group, count in settings.groups().items()
    ]
    return [service, *jobs]
