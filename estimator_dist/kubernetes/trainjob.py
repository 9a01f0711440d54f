"""A Kubeflow Trainer v2 TrainJob (`trainer.kubeflow.org/v1alpha1`) and the TrainingRuntime it runs.

Trainer v2 ships no TensorFlow runtime, so the manifest brings its own: a
namespaced `TrainingRuntime` named as the job, with the plain ML policy (no
torch, mpi, jax or xgboost policy, so Trainer adds no environment of its own)
and as its template the JobSet spec of `kubernetes.jobset`: Trainer creates a
JobSet named as the TrainJob from it, whose pods build their TF_CONFIG from
JobSet's labels (`estimator_dist.cluster.pod_env`). The `TrainJob` references the
runtime and overrides nothing. Built with the Kubeflow Trainer SDK's models.
"""

from __future__ import annotations

from typing import Any, List

from estimator_dist.kubernetes import jobset
from estimator_dist.kubernetes.job_settings import ManifestSettings

API_GROUP = "trainer.kubeflow.org"
API_VERSION = f"{API_GROUP}/v1alpha1"
KIND = "TrainJob"
RUNTIME_KIND = "TrainingRuntime"


def build_trainjob(settings: ManifestSettings) -> List[Any]:
    """Builds the TrainingRuntime and the TrainJob, in the order `kubectl apply` needs.

    Raises:
      Error: if the Kubeflow Trainer SDK is not installed (exit code 1).
    """
    m = jobset.models(settings.kind)
    meta = m.IoK8sApimachineryPkgApisMetaV1ObjectMeta.from_dict(jobset.metadata(settings))
    runtime = m.TrainerV1alpha1TrainingRuntime(
        api_version=API_VERSION,
        kind=RUNTIME_KIND,
        metadata=meta,
        spec=m.TrainerV1alpha1TrainingRuntimeSpec(
            ml_policy=m.TrainerV1alpha1MLPolicy(num_nodes=settings.num_workers),
            template=m.TrainerV1alpha1JobSetTemplateSpec(spec=jobset.jobset_spec(settings)),
        ),
    )
    job = m.TrainerV1alpha1TrainJob(
        api_version=API_VERSION,
        kind=KIND,
        metadata=meta,
        spec=m.TrainerV1alpha1TrainJobSpec(
            runtime_ref=m.TrainerV1alpha1RuntimeRef(
                api_group=API_GROUP, kind=RUNTIME_KIND, name=settings.name
            ),
            active_deadline_seconds=settings.active_deadline_secs,
        ),
    )
    return [runtime, job]
