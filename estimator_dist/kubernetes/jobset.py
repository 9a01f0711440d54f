"""A JobSet (`jobset.x-k8s.io/v1alpha2`) running the job's groups of pods, and its spec.

One replicated job per group (`train`: the chief at completion index 0 and the
workers after it; `ps`; `evaluator`), each one Indexed Job with the group's
pods, so that JobSet's hostnames `<name>-<group>-0-<index>.<name>` are the
addresses every pod writes into its TF_CONFIG (`estimator_dist.cluster.pod_env`).
The exit-code contract becomes JobSet's rules: a pod exiting 1-127 fails its
Job through the `podFailurePolicy` (reason `PodFailurePolicy`), which fails
the whole set; any other failure of a training or ps pod fails its Job
(`backoffLimit: 0`) and JobSet restarts the whole set, at most
`--backoff_limit` times (`failurePolicy.maxRestarts`). The evaluator's Job
retries its own pod instead. The spec is shared with `trainjob`, whose
TrainingRuntime holds it. Built with the Kubeflow Trainer SDK's JobSet models
(`kubeflow_trainer_api.models`); why each field is what it is: docs/kubernetes.md.
"""

from __future__ import annotations

from typing import Any, Dict

from estimator_dist.base.errors import Error
from estimator_dist.cluster.pod_env import EVALUATOR_GROUP, PS_GROUP
from estimator_dist.kubernetes import pod
from estimator_dist.kubernetes.job_settings import SDK_MISSING, ManifestSettings

API_VERSION = "jobset.x-k8s.io/v1alpha2"
KIND = "JobSet"
#: The Job failure reason Kubernetes gives a Job that a podFailurePolicy rule failed.
POD_FAILURE_POLICY_REASON = "PodFailurePolicy"
#: The failure policy rule that fails the whole set on a deterministic exit.
RULE_NAME = "deterministic-exit"


def models(kind: str) -> Any:
    """The Kubeflow Trainer SDK's models, or an error naming the extra to install.

    Raises:
      Error: if `kubeflow_trainer_api` is not installed (exit code 1).
    """
    try:
        from kubeflow_trainer_api import models as trainer_models
    except ImportError as error:
        raise Error(
            SDK_MISSING.format(
                kind=kind, sdk="the Kubeflow Trainer SDK", error=error, pins="kubeflow 0.5.0"
            )
        ) from None
    return trainer_models


def jobset_spec(settings: ManifestSettings) -> Any:
    """The JobSet spec of the job, as the SDK's `JobsetV1alpha2JobSetSpec`."""
    m = models(settings.kind)
    k8s = pod.client(settings.kind)
    replicated = []
    for group, count in settings.groups().items():
        # The evaluator retries its own pod; a training or ps pod's failure restarts the set.
        backoff = settings.backoff_limit if group == EVALUATOR_GROUP else 0
        spec = pod.indexed_job_spec(k8s, settings, group, count, backoff_limit=backoff)
        template = pod.serialize(k8s.V1JobTemplateSpec(spec=spec))
        replicated.append(
            m.JobsetV1alpha2ReplicatedJob(
                name=group,
                replicas=1,
                template=m.IoK8sApiBatchV1JobTemplateSpec.from_dict(template),
            )
        )
    return m.JobsetV1alpha2JobSetSpec(
        replicated_jobs=replicated,
        network=m.JobsetV1alpha2Network(
            enable_dns_hostnames=True,
            subdomain=settings.name,
            publish_not_ready_addresses=True,
        ),
        failure_policy=m.JobsetV1alpha2FailurePolicy(
            max_restarts=settings.backoff_limit,
            rules=[
                m.JobsetV1alpha2FailurePolicyRule(
                    name=RULE_NAME,
                    action="FailJobSet",
                    on_job_failure_reasons=[POD_FAILURE_POLICY_REASON],
                )
            ],
        ),
        # Parameter servers serve until stopped: the set succeeds without them.
        success_policy=m.JobsetV1alpha2SuccessPolicy(
            operator="All",
            target_replicated_jobs=[g for g in settings.groups() if g != PS_GROUP],
        ),
        ttl_seconds_after_finished=settings.ttl_secs_after_finished,
    )


def metadata(settings: ManifestSettings) -> Dict[str, Any]:
    """The object's metadata: name, namespace, `--label`s and `--annotation`s."""
    meta: Dict[str, Any] = {"name": settings.name, "namespace": settings.namespace}
    if settings.labels:
        meta["labels"] = dict(settings.labels)
    if settings.annotations:
        meta["annotations"] = dict(settings.annotations)
    return meta


def build_jobset(settings: ManifestSettings) -> Any:
    """Builds the JobSet as the SDK's `JobsetV1alpha2JobSet`.

    Raises:
      Error: if the Kubeflow Trainer SDK is not installed (exit code 1).
    """
    m = models(settings.kind)
    return m.JobsetV1alpha2JobSet(
        api_version=API_VERSION,
        kind=KIND,
        metadata=m.IoK8sApimachineryPkgApisMetaV1ObjectMeta.from_dict(metadata(settings)),
        spec=jobset_spec(settings),
    )
