"""A JobSet, or plain Indexed Jobs, run on this machine as their controllers run them, for tests.

The sibling of `tests/tfjob_operator.py` for the kinds whose pods build their own
TF_CONFIG (`estimator_dist.cluster.pod_env`). `pods()` expands a manifest into its
pods as the controllers would: JobSet (jobset.x-k8s.io v1alpha2) creates, for
each replicated job, `replicas` child Jobs named `<jobset>-<replicatedJob>-<jobIndex>`
and labels them and their pods with `jobset.sigs.k8s.io/jobset-name`,
`replicatedjob-name`, `replicatedjob-replicas`, `job-index`, `job-global-index`,
`global-replicas` and `restart-attempt`; with `network.enableDNSHostnames` it
sets each pod's hostname to `<job>-<completionIndex>` and its subdomain to
`network.subdomain` (default: the JobSet's name). An Indexed Job's controller
sets `JOB_COMPLETION_INDEX` and the hostname `<job>-<index>` in each pod; the
pod spec's `subdomain` is kept. The downward API resolves
`valueFrom.fieldRef: metadata.labels['...']` to the label's value, or to an
empty string when the pod has no such label. `KindRun` runs those pods with
`tests/pod_emulation.py` (network namespaces, processes, the run's lifecycle),
as `tests/tfjob_operator.py` does, under the JobSet and Job controllers' rules.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from estimator_dist.report import status
from tests.pod_emulation import REPO, PodRun, Sandbox, exit_code

JOBSET_LABEL = "jobset.sigs.k8s.io/"


@dataclasses.dataclass(frozen=True)
class Pod:
    """One pod of a manifest: what the kubelet starts and the rule that restarts it."""

    job: str
    group: str
    index: int
    hostname: str
    subdomain: str
    env: Tuple[Tuple[str, str], ...]
    command: Tuple[str, ...]
    grace_secs: float
    job_spec: Mapping

    @property
    def name(self) -> str:
        return f"{self.job}-{self.index}"

    @property
    def fqdn(self) -> str:
        return f"{self.hostname}.{self.subdomain}"


def _resolve_env(container: Mapping, labels: Mapping[str, str]) -> List[Tuple[str, str]]:
    env = []
    for variable in container.get("env", []):
        if "value" in variable:
            env.append((variable["name"], variable["value"]))
            continue
        path = variable["valueFrom"]["fieldRef"]["fieldPath"]
        assert path.startswith("metadata.labels['") and path.endswith("']"), path
        env.append((variable["name"], labels.get(path[len("metadata.labels['") : -2], "")))
    return env


def _job_pods(
    job_name: str, group: str, job_spec: Mapping, labels: Mapping[str, str], subdomain: str
) -> List[Pod]:
    assert job_spec["completionMode"] == "Indexed", job_spec
    assert job_spec["completions"] == job_spec["parallelism"], job_spec
    pod_spec = job_spec["template"]["spec"]
    (container,) = pod_spec["containers"]
    pods = []
    for index in range(job_spec["completions"]):
        hostname = f"{job_name}-{index}"
        env = [
            *_resolve_env(container, labels),
            ("JOB_COMPLETION_INDEX", str(index)),
            ("HOSTNAME", hostname),
        ]
        pods.append(
            Pod(
                job=job_name,
                group=group,
                index=index,
                hostname=hostname,
                subdomain=subdomain,
                env=tuple(env),
                command=(*container["command"], *container.get("args", [])),
                grace_secs=pod_spec.get("terminationGracePeriodSeconds", 30),
                job_spec=job_spec,
            )
        )
    return pods


def jobset_pods(jobset: Mapping, restart_attempt: int = 0) -> List[Pod]:
    """The pods JobSet creates for `jobset` (a JobSet document, or a TrainingRuntime's spec)."""
    name = jobset["metadata"]["name"]
    spec = jobset["spec"]
    network = spec.get("network", {})
    assert network.get("enableDNSHostnames", True), "the pods would get no stable hostname"
    subdomain = network.get("subdomain") or name
    replicated = spec["replicatedJobs"]
    global_replicas = sum(r.get("replicas", 1) for r in replicated)
    pods, global_index = [], 0
    for rjob in replicated:
        for job_index in range(rjob.get("replicas", 1)):
            labels = {
                JOBSET_LABEL + "jobset-name": name,
                JOBSET_LABEL + "replicatedjob-name": rjob["name"],
                JOBSET_LABEL + "replicatedjob-replicas": str(rjob.get("replicas", 1)),
                JOBSET_LABEL + "job-index": str(job_index),
                JOBSET_LABEL + "job-global-index": str(global_index),
                JOBSET_LABEL + "global-replicas": str(global_replicas),
                JOBSET_LABEL + "restart-attempt": str(restart_attempt),
            }
            job = f"{name}-{rjob['name']}-{job_index}"
            pods += _job_pods(job, rjob["name"], rjob["template"]["spec"], labels, subdomain)
            global_index += 1
    return pods


def indexed_job_pods(documents: Sequence[Mapping]) -> List[Pod]:
    """The pods of an Indexed Job manifest's Jobs; its Service must select them all."""
    (service,) = [d for d in documents if d["kind"] == "Service"]
    assert service["spec"]["clusterIP"] == "None", "the Service must be headless"
    pods = []
    for job in (d for d in documents if d["kind"] == "Job"):
        template = job["spec"]["template"]
        labels = template["metadata"].get("labels", {})
        selector = service["spec"]["selector"]
        assert all(labels.get(k) == v for k, v in selector.items()), (selector, labels)
        subdomain = template["spec"]["subdomain"]
        assert subdomain == service["metadata"]["name"], "the pods' subdomain is the Service"
        group = job["metadata"]["name"].rsplit("-", 1)[1]
        pods += _job_pods(job["metadata"]["name"], group, job["spec"], labels, subdomain)
    return pods


def pods(documents: Sequence[Mapping]) -> List[Pod]:
    """Every pod of a manifest of kind jobset, trainjob (its runtime's JobSet) or indexed-job."""
    kinds = {d["kind"]: d for d in documents}
    if "JobSet" in kinds:
        return jobset_pods(kinds["JobSet"])
    if "TrainingRuntime" in kinds:
        runtime, job = kinds["TrainingRuntime"], kinds["TrainJob"]
        assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]
        # Trainer v2 names the JobSet after the TrainJob.
        return jobset_pods(
            {"metadata": job["metadata"], "spec": runtime["spec"]["template"]["spec"]}
        )
    return indexed_job_pods(documents)


# --- running the pods: sandboxes, the controllers' restart rules ------------------------


def _fail_job_codes(job_spec: Mapping) -> Tuple[int, ...]:
    """The exit codes whose `podFailurePolicy` rule is `FailJob` (`operator: In`)."""
    codes: List[int] = []
    for rule in job_spec.get("podFailurePolicy", {}).get("rules", []):
        on_codes = rule.get("onExitCodes")
        if rule["action"] == "FailJob" and on_codes:
            assert on_codes["operator"] == "In", "only `In` is emulated"
            codes += on_codes["values"]
    return tuple(codes)


@dataclasses.dataclass
class Slot:
    """One pod slot (`<job>-<index>`) across every pod created for it."""

    pod: Pod
    sandbox: Optional[Sandbox] = None
    exit_codes: List[int] = dataclasses.field(default_factory=list)
    addresses: List[str] = dataclasses.field(default_factory=list)
    events: List[Tuple[float, status.Event]] = dataclasses.field(default_factory=list)
    failures: int = 0  # the Job controller's count for this index
    created: int = 0
    succeeded: bool = False
    not_before: float = 0.0  # the Job controller's back-off before it creates the pod again


class KindRun(PodRun):
    """Runs a JobSet (or a TrainJob's) or Indexed Job manifest's pods until it ends.

    The rules, read from JobSet v0.8 (pkg/controllers/jobset_controller.go,
    failure_policy.go, success_policy.go) and Kubernetes' Job controller
    (pkg/controller/job: pod_failure_policy.go, backoff_utils.go,
    indexed_job_utils.go), in our words:

    * A pod exits 0: its index succeeded; it is not created again.
    * A pod exits with a code of its Job's `podFailurePolicy` `FailJob` rule: the Job
      fails with reason `PodFailurePolicy` and its running pods are terminated.
    * Any other failure (a deleted pod's exit 143 or 155 included) counts for the Job
      (`backoffLimit`) or its index (`backoffLimitPerIndex`); past the limit the Job
      fails (`BackoffLimitExceeded`, or `MaxFailedIndexesExceeded` with
      `maxFailedIndexes: 0`), else the index gets a new pod, same name and host, new
      sandbox, after the controller's back-off (10 s, doubling).
    * JobSet: a failed child Job whose reason a `failurePolicy` rule names takes its
      action (`FailJobSet`); any other restarts the whole set (every pod terminated,
      every Job created again, `restart-attempt` one higher) while `restarts <
      maxRestarts`, else fails it. It succeeds when every Job of the
      `successPolicy` targets completed.
    * Indexed Jobs: the run fails when a Job fails, and succeeds when every Job with
      an evaluator or training pod completed (parameter servers never complete).
    * A headless Service with `publishNotReadyAddresses` resolves a pod's host from
      its creation to its removal.

    What it cannot show: what `tests/tfjob_operator.py` cannot (scheduler, kubelet,
    DNS server, API server delays, storage, images), the CRDs' admission (CEL) rules,
    Trainer v2's own controller (a TrainJob's pods are run as its runtime's JobSet),
    `DisruptionTarget` (no eviction API), and the Job controller's pod finalizers.
    """

    NETNS_PREFIX = "jsc"

    def __init__(self, documents: Sequence[Mapping], log_dir: str, backoff_secs: float = 10.0):
        super().__init__(log_dir)
        self.documents = documents
        self.backoff_secs = backoff_secs
        self.is_jobset = any(d["kind"] in ("JobSet", "TrainingRuntime") for d in documents)
        self.slots = {p.name: Slot(p) for p in pods(documents)}
        self.jobs = {p.job: p.job_spec for p in pods(documents)}
        self.job_failures: Dict[str, int] = dict.fromkeys(self.jobs, 0)
        spec = next(
            d["spec"] for d in documents if d["kind"] in ("JobSet", "TrainingRuntime", "Service")
        )
        self.jobset_spec = spec.get("template", {}).get("spec", spec)
        self.restarts = 0
        self._restarting = False

    def _pod_names(self) -> Iterable[str]:
        return self.slots

    def _sandboxes(self) -> List[Sandbox]:
        return [s.sandbox for s in self.slots.values() if s.sandbox]

    def _status_events(self, name: str) -> List[Tuple[float, status.Event]]:
        return self.slots[name].events

    def _reconcile(self) -> None:
        if self.condition:
            return
        if self._restarting:
            if any(s.sandbox for s in self.slots.values()):
                return  # JobSet creates the Jobs again once the old ones are gone
            self._restarting = False
            self.restarts += 1
            self.job_failures = dict.fromkeys(self.jobs, 0)
            for slot in self.slots.values():
                slot.succeeded, slot.failures, slot.not_before = False, 0, 0.0
            self._event(f"JobSet restarts every Job (restart-attempt {self.restarts})")
        now = time.monotonic()
        for slot in self.slots.values():
            if slot.sandbox is None and not slot.succeeded and now >= slot.not_before:
                self._create(slot)
            elif slot.sandbox and not slot.sandbox.deleting:
                code = slot.sandbox.process.poll()
                if code is not None:
                    self._exited(slot, exit_code(code))
        if not self.condition and not self._restarting:
            self._decide_success()

    def _create(self, slot: Slot) -> None:
        slot.sandbox = sandbox = self._new_sandbox(Sandbox)
        slot.addresses.append(sandbox.address)
        slot.created += 1
        self._publish()  # Before the start: `ip netns exec` mounts the hosts file if it exists.
        env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
        env.update(slot.pod.env)
        command = list(slot.pod.command)
        if command[0] == "python":
            command[0] = sys.executable
        started = f"created pod {slot.pod.name} at {sandbox.address}"
        self._start_container(slot.pod.name, sandbox, command, REPO, env, started)

    def _exited(self, slot: Slot, code: int) -> None:
        """The Job controller and JobSet see pod `slot` terminated with `code`."""
        slot.exit_codes.append(code)
        self._remove(slot)
        job = slot.pod.job
        self._event(f"{slot.pod.name} exited {code}")
        if self.condition or self._restarting:
            return
        spec = self.jobs[job]
        if code == 0:
            slot.succeeded = True
        elif code in _fail_job_codes(spec):
            self._job_failed(job, "PodFailurePolicy")
        elif "backoffLimitPerIndex" in spec:
            slot.failures += 1
            if slot.failures > spec["backoffLimitPerIndex"]:
                self._job_failed(job, "MaxFailedIndexesExceeded")
            else:
                slot.not_before = time.monotonic() + self._backoff(slot.failures)
        else:
            self.job_failures[job] += 1
            if self.job_failures[job] > spec.get("backoffLimit", 6):
                self._job_failed(job, "BackoffLimitExceeded")
            else:
                slot.not_before = time.monotonic() + self._backoff(self.job_failures[job])

    def _backoff(self, failures: int) -> float:
        return self.backoff_secs * 2 ** (failures - 1)

    def _job_failed(self, job: str, reason: str) -> None:
        self._event(f"Job {job} failed: {reason}")
        if not self.is_jobset:
            self._terminate_all([s for s in self.slots.values() if s.pod.job == job])
            self._finish("Failed", f"Job {job} failed ({reason})")
            return
        policy = self.jobset_spec.get("failurePolicy", {})
        for rule in policy.get("rules", []):
            if reason in rule.get("onJobFailureReasons", [reason]):
                assert rule["action"] == "FailJobSet", rule
                self._terminate_all(list(self.slots.values()))
                self._finish("Failed", f"rule {rule['name']}: Job {job} failed ({reason})")
                return
        if self.restarts >= policy.get("maxRestarts", 0):
            self._terminate_all(list(self.slots.values()))
            self._finish("Failed", f"Job {job} failed ({reason}) after {self.restarts} restarts")
            return
        self._restarting = True
        self._terminate_all(list(self.slots.values()))

    def _decide_success(self) -> None:
        if self.is_jobset:
            targets = self.jobset_spec.get("successPolicy", {}).get("targetReplicatedJobs")
            slots = [s for s in self.slots.values() if targets is None or s.pod.group in targets]
        else:
            slots = [s for s in self.slots.values() if s.pod.group != "ps"]
        if all(s.succeeded for s in slots):
            self._finish("Succeeded", "every Job of the success policy completed")

    def _publish(self) -> None:
        names = {}
        for slot in self.slots.values():
            if slot.sandbox:
                names[slot.pod.fqdn] = names[slot.pod.hostname] = slot.sandbox.address
        self._network.write_hosts(names)

    def _remove(self, slot: Slot) -> None:
        sandbox, slot.sandbox = slot.sandbox, None
        self._remove_sandbox(sandbox)

    def _terminate_all(self, slots: Sequence[Slot]) -> None:
        for slot in slots:
            if slot.sandbox and not slot.sandbox.deleting:
                slot.sandbox.deleting = True
                self._spawn(self._delete, slot, False)

    def _delete(self, slot: Slot, by_user: bool) -> None:
        code = self._terminate(slot.pod.name, slot.sandbox.process, slot.pod.grace_secs)
        with self._lock:
            if by_user:  # a failed pod, which the Job controller counts
                self._exited(slot, code)
            else:
                slot.exit_codes.append(code)
                self._remove(slot)
                self._event(f"{slot.pod.name} terminated, exit {code}")

    def delete_pod(self, name: str) -> None:
        """`kubectl delete pod`: returns once the pod is gone and its failure counted."""
        with self._lock:
            slot = self.slots[name]
            if slot.sandbox is None or slot.sandbox.deleting:
                raise RuntimeError(f"pod {name} does not exist or is already being deleted")
            slot.sandbox.deleting = True
            thread = self._spawn(self._delete, slot, True)
        thread.join()
