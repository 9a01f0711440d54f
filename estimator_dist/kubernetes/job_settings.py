"""What every kind of manifest shares: the validated settings, volumes, the training job's check.

`ManifestSettings` is the job `python -m estimator_dist.manifest` describes,
whatever its kind: `tfjob` (Kubeflow training-operator v1), `trainjob`
(Kubeflow Trainer v2), `jobset` (JobSet) or `indexed-job` (plain batch/v1
Indexed Jobs). Its fields carry the program's flags
(`estimator_dist.base.settings`). Nothing here imports a Kubernetes SDK.

>>> settings = ManifestSettings(name="mnist", image="trainer:1", model_dir="gs://bucket/run1",
...     train_args=("--model_dir=gs://bucket/run1",), shape=JobShape(2, 0, False))
>>> settings.kind, settings.grace_period_secs(), settings.groups()
('tfjob', 30, {'train': 2})
"""

from __future__ import annotations

import dataclasses
import functools
import math
import posixpath
import re
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

from estimator_dist.base.errors import UsageError
from estimator_dist.base.settings import check_bounds, setting
from estimator_dist.cluster.pod_env import EVALUATOR_GROUP, PS_GROUP, TRAIN_GROUP
from estimator_dist.cluster.tf_config import CHIEF, EVALUATOR, PS, WORKER
from estimator_dist.config.shape import JobShape
from run_config.names import MULTI_WORKER_MIRRORED

if TYPE_CHECKING:
    from estimator_dist.config.job import JobConfig

#: The kinds of manifest, the default first: existing users get the TFJob they always got.
TFJOB, TRAINJOB, JOBSET, INDEXED_JOB = "tfjob", "trainjob", "jobset", "indexed-job"
KINDS = (TFJOB, TRAINJOB, JOBSET, INDEXED_JOB)
#: The container every kind runs, and its gRPC port (the operator's default port).
CONTAINER_NAME = "tensorflow"
PORT = 2222
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
#: Raised when a kind's SDK is not installed.
SDK_MISSING = (
    "estimator_dist.manifest --kind={kind} builds its manifest with {sdk}, which is not "
    "installed ({error}); install it with `pip install 'estimator-dist[kubernetes]'` ({pins})."
)

# Kubernetes' name rules: a service name is a DNS-1035 label, a namespace a DNS-1123 label.
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_MAX_LABEL = 63
_OWN_ENV = "ESTIMATOR_DIST_"


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
class ManifestSettings:
    """A job of any kind that runs `estimator_dist.train` on every pod, validated on construction.

    The settings given by `estimator_dist.manifest`'s flags are fields carrying
    them (`estimator_dist.base.settings`); the others come from the job.

    Attributes:
      name: The job's name, the prefix of its pods' and services' names.
      image: The container image, with estimator-dist and the model code.
      model_dir: The training job's `--model_dir`, shared by every replica.
      train_args: Arguments of `program`, the same on every replica.
      kind: What to print: one of `KINDS`.
      preemption_grace_secs: The training job's `--preemption_grace_secs`.
      strategy: The training job's `--distribution_strategy`.
      communication: Its `--communication` (upper case) when the training
        flags set it, None when they leave it to the default.
      gpus_per_worker: `nvidia.com/gpu` limit of the chief and each worker.
      namespace: The Kubernetes namespace.
      mounts: PersistentVolumeClaims mounted in every pod.
      env: Extra environment variables of every container.
      labels: Labels of the job and of every pod.
      annotations: Annotations of the job and of every pod.
      backoff_limit: The kind's bound on restarts: TFJob `runPolicy.backoffLimit`,
        JobSet `failurePolicy.maxRestarts`, Indexed Job `backoffLimitPerIndex`.
      active_deadline_secs: The kind's `activeDeadlineSeconds`, or None.
      ttl_secs_after_finished: The kind's `ttlSecondsAfterFinished`, or None.
      program: The module each replica runs: `estimator_dist.train`, or
        `estimator_dist.script` for a script or module (`train_args` then hold
        its flags, `--`, and the program's arguments).
      shape: The replicas: chief and workers, parameter servers, an evaluator
        (the launcher's `JobShape`, from the same flags).
    """

    name: str = setting(
        dataclasses.MISSING,
        "The job's name: a DNS-1035 label, the prefix of its pods' and services' names.",
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
    model_dir: str
    train_args: Tuple[str, ...]
    kind: str = setting(
        TFJOB,
        "What to print: tfjob (a Kubeflow TFJob, training-operator v1), trainjob (a Kubeflow "
        "Trainer v2 TrainJob and its TrainingRuntime), jobset (a JobSet) or indexed-job (a "
        "headless Service and Indexed Jobs, no operator); docs/kubernetes.md says which.",
        enum=KINDS,
    )
    preemption_grace_secs: float = 25.0
    strategy: str = MULTI_WORKER_MIRRORED
    communication: Optional[str] = None
    gpus_per_worker: int = setting(
        0,
        "nvidia.com/gpu limit of the chief and each worker; the training flags get "
        "--communication=NCCL unless they choose the collectives themselves.",
        lower_bound=0,
    )
    namespace: str = setting("default", "Kubernetes namespace of the job.")
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
        "KEY=VALUE label of the job and its pods.",
        kind="multi_string",
        flag="label",
        convert=functools.partial(parse_pairs, "--label"),
    )
    annotations: Tuple[Tuple[str, str], ...] = setting(
        (),
        "KEY=VALUE annotation of the job and its pods.",
        kind="multi_string",
        flag="annotation",
        convert=functools.partial(parse_pairs, "--annotation"),
    )
    backoff_limit: int = setting(
        3,
        "Restarts after retryable failures (exit 128-255) before the job fails: a TFJob's "
        "runPolicy.backoffLimit (training-operator 1.9 does not count ExitCode pod "
        "re-creations against it; --active_deadline_secs bounds such a job), a JobSet's "
        "failurePolicy.maxRestarts, an Indexed Job's backoffLimitPerIndex.",
        lower_bound=0,
    )
    active_deadline_secs: Optional[int] = setting(
        None,
        "activeDeadlineSeconds: fail the job after this many seconds (a JobSet's: each "
        "child Job, per restart).",
        kind="integer",
        lower_bound=1,
    )
    ttl_secs_after_finished: Optional[int] = setting(
        None,
        "ttlSecondsAfterFinished: delete the job and its pods this many seconds after it finished.",
        kind="integer",
        lower_bound=0,
    )
    program: str = TRAIN_COMMAND[-1]
    shape: JobShape = JobShape()

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
                f"--name={self.name!r}: expected a DNS-1035 label, which service and host "
                "names must be: lower-case letters, digits and '-', starting "
                "with a letter and ending with a letter or digit, such as 'mnist-run1'."
            )
        longest = self.longest_host()
        if len(longest) > _MAX_LABEL:
            raise UsageError(
                f"--name={self.name!r} is too long: pod and service names such as "
                f"{longest!r} ({len(longest)} characters) must stay within {_MAX_LABEL}, or "
                "the controller cannot create them and the job waits forever; use at most "
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
            if not _ENV_NAME.match(key) or key == "TF_CONFIG" or key.startswith(_OWN_ENV):
                raise UsageError(
                    f"--env={key}=...: expected an environment variable name (letters, "
                    "digits, '_', '-', '.'), other than TF_CONFIG and ESTIMATOR_DIST_*, "
                    "which the operator or the manifest writes."
                )

    @property
    def num_workers(self) -> int:
        """Training replicas, the chief included."""
        return self.shape.num_workers

    @property
    def num_ps(self) -> int:
        """Parameter server replicas."""
        return self.shape.num_ps

    @property
    def evaluator(self) -> bool:
        """Whether the job has an Evaluator replica."""
        return self.shape.evaluator

    def roles(self) -> Dict[str, int]:
        """Tasks by TF_CONFIG role, in the order they are written, without empty roles."""
        counts = {CHIEF: 1, WORKER: self.num_workers - 1, PS: self.num_ps}
        counts[EVALUATOR] = 1 if self.evaluator else 0
        return {role: count for role, count in counts.items() if count}

    def groups(self) -> Dict[str, int]:
        """Pods by group (JobSet replicated job, or Indexed Job): chief and workers train."""
        counts = {TRAIN_GROUP: self.num_workers, PS_GROUP: self.num_ps}
        counts[EVALUATOR_GROUP] = 1 if self.evaluator else 0
        return {group: count for group, count in counts.items() if count}

    def longest_host(self) -> str:
        """The longest pod host name (a DNS label) this kind gives a pod."""
        if self.kind == TFJOB:
            names = [f"{self.name}-{role}-{n - 1}" for role, n in self.roles().items()]
        elif self.kind == INDEXED_JOB:
            names = [f"{self.name}-{group}-{n - 1}" for group, n in self.groups().items()]
        else:  # JobSet's <jobset>-<replicatedJob>-<jobIndex>-<podIndex>.
            names = [f"{self.name}-{group}-0-{n - 1}" for group, n in self.groups().items()]
        return max(names, key=len)

    def grace_period_secs(self) -> int:
        """The pods' `terminationGracePeriodSeconds`."""
        return math.ceil(self.preemption_grace_secs) + GRACE_MARGIN_SECS

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
        if self.kind == INDEXED_JOB and self.num_ps:
            found.append(
                f"the {self.num_ps} parameter server pod(s) serve until deleted, and no "
                f"operator deletes them: `kubectl delete job {self.name}-{PS_GROUP}` once "
                "training has finished."
            )
        tfjob = self.kind == TFJOB
        if tfjob and self.evaluator and self.num_ps and self.ttl_secs_after_finished is None:
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


def check_train_job(settings: ManifestSettings, job: JobConfig) -> None:
    """Refuses a training job that cannot run on these pods, as every task would.

    Raises:
      UsageError: a strategy that does not fit the tasks, or a global batch
        that does not divide over the training tasks.
    """
    from estimator_dist.cluster.tf_config import ClusterConfig
    from estimator_dist.config.job import check_batch
    from run_config.options import check_cluster_fits

    jobs = {
        role: tuple(f"{role}-{i}:{PORT}" for i in range(count))
        for role, count in settings.roles().items()
        if role != EVALUATOR
    }
    try:
        check_cluster_fits(job.strategy, ClusterConfig(jobs=jobs, task_type=CHIEF))
    except UsageError as error:
        raise UsageError(
            f"{error} Here the cluster is the manifest's: --num_workers sets the chief and "
            "workers, --num_ps the parameter servers."
        ) from None
    if job.strategy.name == MULTI_WORKER_MIRRORED:
        per_worker = max(1, settings.gpus_per_worker)
        check_batch(
            job.batch_size,
            job.micro_batches,
            settings.num_workers * per_worker,
            f"--num_workers={settings.num_workers} x {per_worker} device(s) each",
        )
