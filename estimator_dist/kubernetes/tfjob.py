"""A Kubeflow TFJob (`kubeflow.org/v1`) whose every replica runs `estimator_dist.train`.

`TFJobSettings` is the validated job; `build_tfjob` turns it into the Kubeflow
Training SDK's own model (`KubeflowOrgV1TFJob`, `kubernetes.client` pod models
inside) and `to_yaml` into the document `kubectl apply -f -` reads. Only these
two import the SDK, so the package works without it. Why each field is what it
is (replicas, `restartPolicy: ExitCode`, `cleanPodPolicy`, the grace period,
volumes, GPUs): docs/kubernetes.md.

>>> settings = TFJobSettings(name="mnist", image="trainer:1", num_workers=2,
...     model_dir="gs://bucket/run1", train_args=("--model_dir=gs://bucket/run1",))
>>> settings.replicas(), settings.grace_period_secs(), settings.clean_pod_policy()
({'Chief': 1, 'Worker': 1}, 30, 'Running')
"""

from __future__ import annotations

import dataclasses
import functools
import math
import posixpath
import re
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from estimator_dist.base.errors import Error, UsageError
from estimator_dist.base.settings import check_bounds, setting
from run_config.names import MULTI_WORKER_MIRRORED

if TYPE_CHECKING:
    from estimator_dist.config.job import JobConfig

API_VERSION = "kubeflow.org/v1"
KIND = "TFJob"
#: The container the operator reads exit codes from; its admission webhook requires it.
CONTAINER_NAME = "tensorflow"
#: The operator's default TensorFlow port and its name (it builds TF_CONFIG from it).
PORT_NAME = "tfjob-port"
PORT = 2222
CHIEF, WORKER, PS, EVALUATOR = "Chief", "Worker", "PS", "Evaluator"
#: Every replica's policy: the operator restarts exits 128-255 and fails the job on 1-127.
RESTART_POLICY = "ExitCode"
#: Seconds between a task's forced exit (`--preemption_grace_secs`) and the kubelet's SIGKILL.
GRACE_MARGIN_SECS = 5
#: model_dir URLs that every pod reaches without a volume.
REMOTE_SCHEMES = ("gs://", "s3://", "hdfs://")
#: Each replica's command; the training flags are its arguments.
TRAIN_COMMAND = ("python", "-m", "estimator_dist.train")
#: An Istio sidecar keeps a finished pod running and intercepts the gRPC ports.
POD_ANNOTATIONS = (("sidecar.istio.io/inject", "false"),)
#: Environment of every container: task logs reach `kubectl logs` as they are written.
BASE_ENV = (("PYTHONUNBUFFERED", "1"),)
#: Raised when the Kubeflow Training SDK is not installed.
SDK_MISSING = (
    "estimator_dist.manifest builds the TFJob with the Kubeflow Training SDK, which is not "
    "installed ({error}); install it with `pip install 'estimator-dist[kubernetes]'` "
    "(kubeflow-training 1.9.4)."
)

# Kubernetes' name rules: a service name is a DNS-1035 label, a namespace a DNS-1123 label.
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_MAX_LABEL = 63


@dataclasses.dataclass(frozen=True)
class Mount:
    """A PersistentVolumeClaim mounted at the same path in every pod.

    >>> Mount.parse("shared-runs:/mnt/runs")
    Mount(claim='shared-runs', path='/mnt/runs')
    """

    claim: str
    path: str

    def __post_init__(self) -> None:
        if not (_DNS_1123_SUBDOMAIN.match(self.claim) and len(self.claim) <= 253):
            raise UsageError(
                f"--pvc={self.claim}:{self.path}: the claim name {self.claim!r} is not a "
                "PersistentVolumeClaim name (lower-case letters, digits, '-' and '.'); give "
                "the name `kubectl get pvc` lists."
            )
        if not posixpath.isabs(self.path) or posixpath.normpath(self.path) == "/":
            raise UsageError(
                f"--pvc={self.claim}:{self.path}: the mount path must be an absolute "
                "directory other than '/', such as /mnt/runs."
            )

    @classmethod
    def parse(cls, text: str) -> Mount:
        """Parses `CLAIM:/mount/path`."""
        claim, colon, path = text.partition(":")
        if not colon or not claim or not path:
            raise UsageError(
                f"--pvc={text}: expected CLAIM:/mount/path, such as "
                "--pvc=shared-runs:/mnt/runs (mounts that claim at /mnt/runs in every pod)."
            )
        return cls(claim, posixpath.normpath(path))


def parse_pairs(flag: str, items: Sequence[str]) -> Tuple[Tuple[str, str], ...]:
    """Parses repeated `KEY=VALUE` values of `flag`.

    >>> parse_pairs("--label", ["team=vision", "tier=a=b"])
    (('team', 'vision'), ('tier', 'a=b'))

    Raises:
      UsageError: for an item that is not `KEY=VALUE`.
    """
    pairs = []
    for item in items:
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise UsageError(f"{flag}={item}: expected KEY=VALUE, such as {flag}=team=vision.")
        pairs.append((key, value))
    return tuple(pairs)


def _mounts(texts: Sequence[str]) -> Tuple[Mount, ...]:
    return tuple(Mount.parse(text) for text in texts)


@dataclasses.dataclass(frozen=True)
class TFJobSettings:
    """A TFJob that runs `estimator_dist.train`, validated on construction.

    The settings given by `estimator_dist.manifest`'s flags are fields carrying
    them (`estimator_dist.base.settings`); the others come from the job.

    Attributes:
      name: The TFJob's name; pods and services are `<name>-<type>-<i>`.
      image: The container image, with estimator-dist and the model code.
      num_workers: Training tasks, the chief included (as the launcher's).
      model_dir: The training job's `--model_dir`, shared by every replica.
      train_args: Arguments of `program`, the same on every replica.
      preemption_grace_secs: The training job's `--preemption_grace_secs`.
      strategy: The training job's `--distribution_strategy`.
      communication: Its `--communication` (upper case) when the training
        flags set it, None when they leave it to the default.
      evaluator: Whether to add an Evaluator replica.
      num_ps: Parameter server replicas.
      gpus_per_worker: `nvidia.com/gpu` limit of the chief and each worker.
      namespace: The Kubernetes namespace.
      mounts: PersistentVolumeClaims mounted in every pod.
      env: Extra environment variables of every container.
      labels: Labels of the TFJob and of every pod.
      annotations: Annotations of the TFJob and of every pod.
      backoff_limit: `runPolicy.backoffLimit`.
      active_deadline_secs: `runPolicy.activeDeadlineSeconds`, or None.
      ttl_secs_after_finished: `runPolicy.ttlSecondsAfterFinished`, or None.
      program: The module each replica runs: `estimator_dist.train`, or
        `estimator_dist.script` for a script or module (`train_args` then hold
        its flags, `--`, and the program's arguments).
    """

    name: str = setting(
        dataclasses.MISSING,
        "The TFJob's name: a DNS-1035 label; pods and services are NAME-<type>-<index>.",
        kind="string",
        flag_default=None,
        required=True,
    )
    image: str = setting(
        dataclasses.MISSING,
        "Container image with estimator-dist and the model code.",
        kind="string",
        flag_default=None,
        required=True,
    )
    num_workers: int = setting(
        dataclasses.MISSING,
        "Training tasks, the chief included: a Chief replica and NUM_WORKERS-1 Worker replicas.",
        kind="integer",
        flag_default=None,
        lower_bound=1,
        required=True,
    )
    model_dir: str
    train_args: Tuple[str, ...]
    preemption_grace_secs: float = 25.0
    strategy: str = MULTI_WORKER_MIRRORED
    communication: Optional[str] = None
    evaluator: bool = setting(
        False,
        "Add an Evaluator replica, which evaluates each checkpoint and writes the final "
        "metrics; cleanPodPolicy becomes None so that the chief's success does not end it.",
    )
    num_ps: int = setting(
        0,
        "PS replicas (with --distribution_strategy=parameter_server after '--').",
        lower_bound=0,
    )
    gpus_per_worker: int = setting(
        0,
        "nvidia.com/gpu limit of the chief and each worker; the training flags get "
        "--communication=NCCL unless they choose the collectives themselves.",
        lower_bound=0,
    )
    namespace: str = setting("default", "Kubernetes namespace of the TFJob.")
    mounts: Tuple[Mount, ...] = setting(
        (),
        "CLAIM:/mount/path: mount this PersistentVolumeClaim at that path in every pod; a "
        "local --model_dir must be under one.",
        kind="multi_string",
        flag="pvc",
        convert=_mounts,
    )
    env: Tuple[Tuple[str, str], ...] = setting(
        (),
        "KEY=VALUE environment variable of every container.",
        kind="multi_string",
        convert=functools.partial(parse_pairs, "--env"),
    )
    labels: Tuple[Tuple[str, str], ...] = setting(
        (),
        "KEY=VALUE label of the TFJob and its pods.",
        kind="multi_string",
        flag="label",
        convert=functools.partial(parse_pairs, "--label"),
    )
    annotations: Tuple[Tuple[str, str], ...] = setting(
        (),
        "KEY=VALUE annotation of the TFJob and its pods.",
        kind="multi_string",
        flag="annotation",
        convert=functools.partial(parse_pairs, "--annotation"),
    )
    backoff_limit: int = setting(
        3,
        "runPolicy.backoffLimit: retries before the job fails. Training-operator 1.9 "
        "does not count ExitCode pod re-creations against it (docs/kubernetes.md); "
        "--active_deadline_secs bounds a job that keeps failing.",
        lower_bound=0,
    )
    active_deadline_secs: Optional[int] = setting(
        None,
        "runPolicy.activeDeadlineSeconds: fail the job after this many seconds.",
        kind="integer",
        lower_bound=1,
    )
    ttl_secs_after_finished: Optional[int] = setting(
        None,
        "runPolicy.ttlSecondsAfterFinished: delete the TFJob and its pods this many "
        "seconds after it finished.",
        kind="integer",
        lower_bound=0,
    )
    program: str = TRAIN_COMMAND[-1]

    def __post_init__(self) -> None:
        object.__setattr__(self, "train_args", tuple(self.train_args))
        self._validate_counts()
        self._validate_name()
        self._validate_namespace_and_image()
        self._validate_model_dir()
        self._validate_metadata()

    def _validate_counts(self) -> None:
        check_bounds(self)
        if self.preemption_grace_secs <= 0:
            raise UsageError(
                f"--preemption_grace_secs={self.preemption_grace_secs:g}: expected seconds > 0."
            )

    def _validate_name(self) -> None:
        if not _DNS_1035.match(self.name):
            raise UsageError(
                f"--name={self.name!r}: expected a DNS-1035 label, which the operator's "
                "admission webhook requires: lower-case letters, digits and '-', starting "
                "with a letter and ending with a letter or digit, such as 'mnist-run1'."
            )
        names = (f"{self.name}-{kind.lower()}-{n - 1}" for kind, n in self.replicas().items())
        longest = max(names, key=len)
        if len(longest) > _MAX_LABEL:
            raise UsageError(
                f"--name={self.name!r} is too long: pod and service names such as "
                f"{longest!r} ({len(longest)} characters) must stay within {_MAX_LABEL}, or "
                "the operator cannot create them and the job waits forever; use at most "
                f"{len(self.name) - len(longest) + _MAX_LABEL} characters."
            )

    def _validate_namespace_and_image(self) -> None:
        if not (_DNS_1123_LABEL.match(self.namespace) and len(self.namespace) <= _MAX_LABEL):
            raise UsageError(
                f"--namespace={self.namespace!r}: expected a Kubernetes namespace name "
                "(lower-case letters, digits and '-'), as `kubectl get namespaces` lists."
            )
        if not self.image or any(c.isspace() for c in self.image):
            raise UsageError(
                f"--image={self.image!r}: expected a container image with estimator-dist and "
                "the model code installed, such as registry.example.com/trainer:1.0."
            )

    def _validate_model_dir(self) -> None:
        if self.model_dir.startswith(REMOTE_SCHEMES):
            return
        path = posixpath.normpath(self.model_dir)
        if posixpath.isabs(path) and any(_is_under(path, m.path) for m in self.mounts):
            return
        mounted = ", ".join(f"{m.path} (claim {m.claim})" for m in self.mounts) or "none"
        raise UsageError(
            f"--model_dir={self.model_dir} (after '--') is a path inside each pod, under no "
            f"shared volume (mounts: {mounted}): every replica would write to its own "
            "disk, the workers could not resume from the chief's checkpoints and the "
            "checkpoints would vanish with the pods. Mount a PersistentVolumeClaim that "
            "every pod can write (ReadWriteMany), e.g. --pvc=shared-runs:/mnt/runs with "
            "--model_dir=/mnt/runs/run1, or use a remote URL "
            f"({', '.join(s + '...' for s in REMOTE_SCHEMES)})."
        )

    def _validate_metadata(self) -> None:
        paths = [m.path for m in self.mounts]
        if len(set(paths)) != len(paths):
            raise UsageError(f"--pvc: two claims mounted at the same path: {paths}.")
        for key, _ in self.env:
            if not _ENV_NAME.match(key) or key == "TF_CONFIG":
                raise UsageError(
                    f"--env={key}=...: expected an environment variable name (letters, "
                    "digits, '_', '-', '.'), other than TF_CONFIG, which the operator writes."
                )

    def replicas(self) -> Dict[str, int]:
        """Replica counts by TFJob replica type, in the order they are written."""
        counts = {CHIEF: 1, WORKER: self.num_workers - 1, PS: self.num_ps}
        counts[EVALUATOR] = 1 if self.evaluator else 0
        return {kind: count for kind, count in counts.items() if count}

    def grace_period_secs(self) -> int:
        """The pods' `terminationGracePeriodSeconds`."""
        return math.ceil(self.preemption_grace_secs) + GRACE_MARGIN_SECS

    def clean_pod_policy(self) -> str:
        """`None` keeps an evaluator's final evaluation alive once the chief succeeded."""
        return "None" if self.evaluator else "Running"

    def container_args(self) -> Tuple[str, ...]:
        """The training flags, with `--communication=NCCL` for GPUs unless they chose one."""
        if self.gpus_per_worker and self.strategy == MULTI_WORKER_MIRRORED:
            if self.communication is None and self.program == TRAIN_COMMAND[-1]:
                return (*self.train_args, "--communication=NCCL")
        return self.train_args

    def warnings(self) -> List[str]:
        """What the user should know about this job before applying it."""
        found = []
        collective = self.strategy == MULTI_WORKER_MIRRORED
        if collective and self.gpus_per_worker and self.communication == "RING":
            found.append(
                f"--communication=RING kept as chosen with --gpus_per_worker="
                f"{self.gpus_per_worker}: RING all-reduces through the CPU; NCCL (the "
                "default with GPUs) moves gradients between GPUs and is usually faster."
            )
        if collective and not self.gpus_per_worker and self.communication == "NCCL":
            found.append(
                "--communication=NCCL without --gpus_per_worker: the pods see no GPU, and "
                "TensorFlow runs RING collectives instead."
            )
        if self.evaluator and self.num_ps and self.ttl_secs_after_finished is None:
            found.append(
                "cleanPodPolicy is None so that the evaluator's final evaluation survives "
                f"the chief's success, but the {self.num_ps} parameter server pod(s) serve "
                "until deleted: pass --ttl_secs_after_finished=SECONDS (long enough for the "
                f"final evaluation), or `kubectl delete tfjob {self.name}` once the "
                "evaluator has finished."
            )
        return found


def _is_under(path: str, mount: str) -> bool:
    return path == mount or path.startswith(mount.rstrip("/") + "/")


def operator_tf_config(settings: TFJobSettings, kind: str, index: int) -> Dict[str, Any]:
    """The TF_CONFIG the training operator writes into one replica's pod.

    >>> settings = TFJobSettings(name="m", image="i", num_workers=1, model_dir="gs://b/r",
    ...     train_args=())
    >>> operator_tf_config(settings, "Chief", 0)["cluster"]
    {'chief': ['m-chief-0.default.svc:2222']}
    """
    cluster = {
        other.lower(): [
            f"{settings.name}-{other.lower()}-{i}.{settings.namespace}.svc:{PORT}"
            for i in range(count)
        ]
        for other, count in settings.replicas().items()
    }
    return {
        "cluster": cluster,
        "task": {"type": kind.lower(), "index": index},
        "environment": "cloud",
    }


def check_train_job(settings: TFJobSettings, job: JobConfig) -> None:
    """Refuses a training job that cannot run on these replicas, as every task would.

    Raises:
      UsageError: a strategy that does not fit the replicas, or a global
        batch that does not divide over the training replicas.
    """
    import json

    from estimator_dist.base.cluster import parse_tf_config
    from estimator_dist.config.job import check_batch
    from run_config.options import check_cluster_fits

    cluster = parse_tf_config(json.dumps(operator_tf_config(settings, CHIEF, 0)))
    try:
        check_cluster_fits(job.strategy, cluster)
    except UsageError as error:
        raise UsageError(
            f"{error} Here TF_CONFIG is what the operator writes for this TFJob: "
            "--num_workers sets the chief and workers, --num_ps the ps replicas."
        ) from None
    if job.strategy.name == MULTI_WORKER_MIRRORED:
        per_worker = max(1, settings.gpus_per_worker)
        check_batch(
            job.batch_size,
            job.micro_batches,
            settings.num_workers * per_worker,
            f"--num_workers={settings.num_workers} x {per_worker} device(s) each",
        )


def build_tfjob(settings: TFJobSettings) -> Any:
    """Builds the TFJob as the Training SDK's `KubeflowOrgV1TFJob`.

    Raises:
      Error: if the Kubeflow Training SDK is not installed (exit code 1).
    """
    try:
        from kubeflow.training import models
    except ImportError as error:
        raise Error(SDK_MISSING.format(error=error)) from None
    specs = {
        kind: models.KubeflowOrgV1ReplicaSpec(
            replicas=count,
            restart_policy=RESTART_POLICY,
            template=_pod_template(models, settings, kind),
        )
        for kind, count in settings.replicas().items()
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
                clean_pod_policy=settings.clean_pod_policy(),
                active_deadline_seconds=settings.active_deadline_secs,
                ttl_seconds_after_finished=settings.ttl_secs_after_finished,
            ),
        ),
    )


def _pod_template(models: Any, settings: TFJobSettings, kind: str) -> Any:
    """One replica type's pod: the `tensorflow` container, its volumes, its grace period."""
    limits = {}
    if settings.gpus_per_worker and kind in (CHIEF, WORKER):
        limits["nvidia.com/gpu"] = str(settings.gpus_per_worker)
    container = models.V1Container(
        name=CONTAINER_NAME,
        image=settings.image,
        command=[*TRAIN_COMMAND[:-1], settings.program],
        args=list(settings.container_args()),
        ports=[models.V1ContainerPort(name=PORT_NAME, container_port=PORT)],
        env=[models.V1EnvVar(name=k, value=v) for k, v in (*BASE_ENV, *settings.env)],
        resources=models.V1ResourceRequirements(limits=limits or None),
        volume_mounts=[
            models.V1VolumeMount(name=f"pvc-{i}", mount_path=m.path)
            for i, m in enumerate(settings.mounts)
        ],
    )
    volumes = [
        models.V1Volume(
            name=f"pvc-{i}",
            persistent_volume_claim=models.V1PersistentVolumeClaimVolumeSource(claim_name=m.claim),
        )
        for i, m in enumerate(settings.mounts)
    ]
    return models.V1PodTemplateSpec(
        metadata=models.V1ObjectMeta(
            labels=dict(settings.labels) or None,
            annotations=dict((*POD_ANNOTATIONS, *settings.annotations)),
        ),
        spec=models.V1PodSpec(
            containers=[container],
            volumes=volumes or None,
            termination_grace_period_seconds=settings.grace_period_secs(),
        ),
    )


def to_yaml(tfjob: Any) -> str:
    """The TFJob as one YAML document, through the Kubernetes client's own serialisation."""
    import yaml
    from kubernetes import client

    document = client.ApiClient().sanitize_for_serialization(tfjob)
    return yaml.safe_dump(document, sort_keys=False, default_flow_style=False)
