"""A Kubeflow TFJob run on this machine as training-operator v1 runs it, for end-to-end tests.

No Kubernetes control plane can run here, so this module does what the operator
and the kubelet do with a TFJob manifest, with real processes and real
networking: one network namespace per pod ("pod sandbox") with its own address
on a veth pair joined by a bridge that lives in a namespace of its own (never
the host's), the operator's service names written into every pod's
`/etc/netns/<ns>/hosts` (which `ip netns exec` mounts over `/etc/hosts`),
TF_CONFIG byte for byte as the operator writes it, and the container's
`command` + `args` as the pod's process (the image replaced by this venv's
Python). It restarts, recreates and cleans up pods, and decides the job's
success or failure, by the rules below. Everything it creates is removed when
the `TFJobRun` context ends, whatever happened. The sandboxes, the pods'
processes and the run's lifecycle are `tests/pod_emulation.py`'s, shared with
`tests/jobset_controller.py`; the operator's rules are this module's.

Read from kubeflow/training-operator v1.9.0
(commit 6f74c7f6b2ed6c27aabd82d0a316b23f0646059c): pkg/controller.v1/tensorflow/
tensorflow.go (genTFConfigJSONStr, genClusterSpec), util.go (GetPortFromTFJob,
isDistributed, setRestartPolicy), tfjob_controller.go (SetClusterSpec,
UpdateJobStatus, IsWorker0Completed); pkg/controller.v1/common/pod.go
(ReconcilePods, createNewPod), job.go (ReconcileJobs, DeletePodsAndServices),
util.go (GenGeneralName); pkg/core/job.go (PastBackoffLimit);
pkg/util/train/train_util.go (IsRetryableExitCode); pkg/apis/kubeflow.org/v1/
tensorflow_defaults.go, tensorflow_types.go, common_types.go;
pkg/webhooks/tensorflow/tfjob_webhook.go. The rules, in our words:

* TF_CONFIG is Go's `json.Marshal` of a struct with fields `cluster`, `task`,
  `environment`, in that order; `task` is `type` then `index`; `environment` is
  always "cloud". `cluster` is a Go map, so its keys come out sorted. It is
  compact (no spaces), and Go escapes `<`, `>`, `&` as \\u003c, \\u003e, \\u0026.
* `cluster` holds every replica type of the job, the evaluator included, under
  its lower-cased name, each replica as `<job>-<type>-<i>.<namespace>.svc:<port>`
  (plus `.<CUSTOM_CLUSTER_DOMAIN>` when the operator has that variable). The
  port is the `tfjob-port` port of the container named `tensorflow`, else 2222.
* A job of one replica in all is "not distributed": it gets no TF_CONFIG.
* Defaults: 1 replica, `restartPolicy: Never`, `cleanPodPolicy: None`, a
  `tfjob-port` of 2222; replica type keys are put into their canonical case.
* The pod and its headless service share the name `<job>-<type>-<i>`; the
  service publishes no address of a pod that is not ready, so the name resolves
  only while the pod runs and is not being deleted.
* `restartPolicy: ExitCode` makes the pod's own policy Never; when its container
  exits 128-255 (a signal, or a code the program chose as retryable) the operator
  deletes the pod and creates it anew, same name and TF_CONFIG; exit 1-127 fails
  the job. `OnFailure` / `Always` are the kubelet's: the container restarts in
  the same pod (its restartCount grows), on failure / on any exit.
* `runPolicy.backoffLimit` caps the sum of the pods' restartCounts (the job fails
  at `>= limit`, or at the first restart when the limit is 0) and then every pod
  is deleted. Pods replaced under ExitCode start with restartCount 0, so the
  operator's own sum never grows for them (its other check counts work-queue
  retries, not pods); this emulation counts each replacement after a retryable
  exit as a restart, which is what kubeflow/common#168 meant the limit to do.
* A pod deleted from outside (SIGTERM, `terminationGracePeriodSeconds`, default
  30, then SIGKILL) is not a failure: the next reconcile creates it again.
* The job succeeds when every Chief (or Master) replica exited 0; with neither,
  when worker 0 exited 0 (or all workers, with `successPolicy: AllWorkers`).
  A pod of a `Never` replica that exits non-zero fails the job.
* Once the job is finished, `cleanPodPolicy` decides what is deleted: `All`
  every pod, `Running` the pods still running (an evaluator still running its
  last evaluation included), `None` nothing.

What it cannot show: no scheduler or kubelet (pods start at once, no image
pulls, no resource limits), no DNS server (hosts files instead; a name not in
them fails at once), no API server or informer delays between reconciles, no
storage driver (a PersistentVolumeClaim is the host directory of its
`mountPath`, shared by every pod), no image (this checkout and its venv).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import threading
from typing import Dict, Iterable, List, Mapping, Optional, Tuple

from estimator_dist.report import status
from tests.pod_emulation import REPO, PodRun, Sandbox, exit_code
from tests.procs import report

DEFAULT_PORT = 2222
PORT_NAME = "tfjob-port"
CONTAINER_NAME = "tensorflow"
DEFAULT_GRACE_SECS = 30
#: The types the operator knows, in the order UpdateJobStatus visits them.
KNOWN_TYPES = ("Chief", "Evaluator", "Master", "PS", "Worker")
RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
CLEAN_POD_POLICIES = ("All", "Running", "None")
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def go_json(value: object) -> str:
    """`value` as Go's `encoding/json` writes it: compact, HTML characters escaped.

    >>> go_json({"a": ["x<y"], "b": 1})
    '{"a":["x\\\\u003cy"],"b":1}'
    """
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(char, escaped)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


@dataclasses.dataclass(frozen=True)
class ReplicaSpec:
    """One `tfReplicaSpecs` entry, with the operator's defaults applied."""

    type: str
    replicas: int
    restart_policy: str
    command: Tuple[str, ...]
    env: Tuple[Tuple[str, str], ...]
    port: int
    grace_secs: float
    working_dir: str


@dataclasses.dataclass(frozen=True)
class TFJob:
    """A TFJob manifest as the operator sees it after defaulting and validation."""

    name: str
    namespace: str
    replicas: Tuple[ReplicaSpec, ...]
    backoff_limit: Optional[int]
    clean_pod_policy: str
    success_policy: str

    @classmethod
    def from_manifest(cls, manifest: Mapping) -> TFJob:
        """Parses a `kubeflow.org/v1` TFJob (the YAML as a dict); raises ValueError if invalid."""
        if manifest.get("kind") != "TFJob" or manifest.get("apiVersion") != "kubeflow.org/v1":
            raise ValueError(
                f"not a kubeflow.org/v1 TFJob: apiVersion {manifest.get('apiVersion')!r}, "
                f"kind {manifest.get('kind')!r}"
            )
        name = manifest["metadata"]["name"]
        if not _DNS_1035.match(name) or len(name) > 63:
            raise ValueError(f"metadata.name {name!r} is not a DNS-1035 label")
        spec = manifest["spec"]
        if spec.get("enableDynamicWorker"):
            raise ValueError("enableDynamicWorker (sparse TF_CONFIG) is not emulated")
        replicas = []
        for key, replica in spec["tfReplicaSpecs"].items():
            canonical = next((t for t in KNOWN_TYPES if t.lower() == key.lower()), key)
            replicas.append(_replica_spec(canonical, replica or {}))
        if sum(r.type in ("Chief", "Master") for r in replicas) > 1:
            raise ValueError("must not have more than 1 Chief or Master role")
        run_policy = spec.get("runPolicy") or {}
        clean = run_policy.get("cleanPodPolicy") or "None"
        if clean not in CLEAN_POD_POLICIES:
            raise ValueError(f"runPolicy.cleanPodPolicy {clean!r}, expected {CLEAN_POD_POLICIES}")
        return cls(
            name=name,
            namespace=manifest["metadata"].get("namespace") or "default",
            replicas=tuple(replicas),
            backoff_limit=run_policy.get("backoffLimit"),
            clean_pod_policy=clean,
            success_policy=spec.get("successPolicy") or "",
        )

    def spec(self, replica_type: str) -> ReplicaSpec:
        return next(r for r in self.replicas if r.type == replica_type)

    def pod_name(self, replica_type: str, index: int) -> str:
        """`<job>-<type>-<index>`: the pod's and its service's name (GenGeneralName)."""
        return f"{self.name}-{replica_type.lower()}-{index}".replace("/", "-")

    def service_host(self, replica_type: str, index: int, cluster_domain: str = "") -> str:
        host = f"{self.pod_name(replica_type, index)}.{self.namespace}.svc"
        return f"{host}.{cluster_domain}" if cluster_domain else host

    def tf_config(self, replica_type: str, index: int, cluster_domain: str = "") -> Optional[str]:
        """TF_CONFIG as the operator sets it on that pod; None for a one-replica job."""
        if sum(r.replicas for r in self.replicas) == 1:
            return None
        cluster = {}
        for r in sorted(self.replicas, key=lambda r: r.type.lower()):  # Go sorts map keys
            hosts = [self.service_host(r.type, i, cluster_domain) for i in range(r.replicas)]
            cluster[r.type.lower()] = [f"{host}:{r.port}" for host in hosts]
        task = {"type": replica_type.lower(), "index": index}
        return go_json({"cluster": cluster, "task": task, "environment": "cloud"})


def _replica_spec(replica_type: str, replica: Mapping) -> ReplicaSpec:
    pod = (replica.get("template") or {}).get("spec") or {}
    containers = pod.get("containers") or []
    where = f"tfReplicaSpecs.{replica_type}"
    container = next((c for c in containers if c.get("name") == CONTAINER_NAME), None)
    if container is None or any(not c.get("image") for c in containers):
        raise ValueError(f"{where}: needs a container named {CONTAINER_NAME!r}, each with an image")
    policy = replica.get("restartPolicy") or "Never"
    if policy not in RESTART_POLICIES:
        raise ValueError(f"{where}.restartPolicy {policy!r}, expected one of {RESTART_POLICIES}")
    if not container.get("command"):
        raise ValueError(f"{where}: the emulation has no image entrypoint; give a command")
    command = [*container["command"], *(container.get("args") or [])]
    if os.path.basename(command[0]).startswith("python"):
        command[0] = sys.executable
    env = []
    for variable in container.get("env") or []:
        if "value" not in variable:
            raise ValueError(f"{where}: env {variable.get('name')!r} has no literal value")
        env.append((variable["name"], str(variable["value"])))
    claims = {v["name"] for v in pod.get("volumes") or [] if "persistentVolumeClaim" in v}
    for mount in container.get("volumeMounts") or []:
        if mount["name"] not in claims or not os.path.isdir(mount["mountPath"]):
            raise ValueError(
                f"{where}: volume {mount['name']!r} at {mount['mountPath']!r}: the emulation "
                "shares a claim as the host directory of its mountPath, which must exist"
            )
    ports = [p for p in container.get("ports") or [] if p.get("name") == PORT_NAME]
    return ReplicaSpec(
        type=replica_type,
        replicas=int(replica.get("replicas", 1)),
        restart_policy=policy,
        command=tuple(command),
        env=tuple(env),
        port=int(ports[0]["containerPort"]) if ports else DEFAULT_PORT,
        grace_secs=float(pod.get("terminationGracePeriodSeconds", DEFAULT_GRACE_SECS)),
        working_dir=container.get("workingDir") or REPO,
    )


@dataclasses.dataclass
class _Pod(Sandbox):
    """One incarnation of a replica: its sandbox and its container's current process."""

    tf_config_seen: Optional[str] = None


@dataclasses.dataclass
class Replica:
    """One replica slot (`<job>-<type>-<i>`) across every pod created for it."""

    spec: ReplicaSpec
    index: int
    name: str
    host: str
    tf_config: Optional[str]
    pod: Optional[_Pod] = None
    restart_count: int = 0  # kubelet restarts inside the current pod (OnFailure, Always)
    replaced_after_failure: int = 0  # the operator's delete-and-create after exit 128-255
    recreated_after_delete: int = 0
    exit_codes: List[int] = dataclasses.field(default_factory=list)
    addresses: List[str] = dataclasses.field(default_factory=list)
    tf_configs_seen: List[Optional[str]] = dataclasses.field(default_factory=list)
    lines: List[Tuple[float, str]] = dataclasses.field(default_factory=list)
    #: The events of its containers' status channels, with the time each was read.
    events: List[Tuple[float, status.Event]] = dataclasses.field(default_factory=list)
    succeeded: bool = False


class TFJobRun(PodRun):
    """Runs a TFJob: pods, services (hosts files), restarts, success or failure, clean-up.

    Use as a context manager; on exit every process is killed and every
    namespace, veth, bridge and /etc/netns directory removed.

    Args:
      manifest: The TFJob manifest, as a dict.
      log_dir: Where each pod's log goes, as `<pod>.log` (appended on restarts).
      cluster_domain: The operator's CUSTOM_CLUSTER_DOMAIN, if any.
    """

    NETNS_PREFIX = "tfj"
    CONTROLLER = "operator"
    FINISHED = "job {condition}: {message}"

    def __init__(self, manifest: Mapping, log_dir: str, cluster_domain: str = "") -> None:
        super().__init__(log_dir)
        self.job = TFJob.from_manifest(manifest)
        self.replicas: Dict[str, Replica] = {}
        for spec in self.job.replicas:
            for index in range(spec.replicas):
                name = self.job.pod_name(spec.type, index)
                host = self.job.service_host(spec.type, index, cluster_domain)
                tf_config = self.job.tf_config(spec.type, index, cluster_domain)
                self.replicas[name] = Replica(spec, index, name, host, tf_config)
        self._cleaned = False

    def _pod_names(self) -> Iterable[str]:
        return self.replicas

    def _sandboxes(self) -> List[Sandbox]:
        return [r.pod for r in self.replicas.values() if r.pod]

    def _status_events(self, name: str) -> List[Tuple[float, status.Event]]:
        return self.replicas[name].events

    def _reconcile(self) -> None:
        if self.condition:
            for replica in self.replicas.values():
                pod = replica.pod
                if pod and not (pod.deleting or pod.exited) and pod.process.poll() is not None:
                    pod.exited = True
                    self._publish()
                    replica.exit_codes.append(exit_code(pod.process.returncode))
                    self._event(f"{replica.name} exited {replica.exit_codes[-1]}")
            if not self._cleaned:
                self._cleaned = True
                policy = self.job.clean_pod_policy
                for replica in self.replicas.values():
                    pod = replica.pod
                    if (
                        pod
                        and not pod.deleting
                        and (policy == "All" or policy == "Running" and not pod.exited)
                    ):
                        self._start_delete(replica, recreate=False)
            return
        for replica in self.replicas.values():
            if replica.pod is None and not replica.succeeded:
                self._create(replica)
            elif replica.pod and not (replica.pod.deleting or replica.pod.exited):
                self._check(replica)
        if not self.condition:
            self._decide_success()

    def _create(self, replica: Replica) -> None:
        replica.pod = pod = self._new_sandbox(_Pod)
        replica.addresses.append(pod.address)
        self._event(f"created pod {replica.name} at {pod.address} (namespace {pod.namespace})")
        self._start(replica)

    def _start(self, replica: Replica) -> None:
        spec, pod = replica.spec, replica.pod
        env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
        env["HOSTNAME"] = replica.name
        env.update(spec.env)
        if replica.tf_config is not None:
            env["TF_CONFIG"] = replica.tf_config
        pod.tf_config_seen, pod.exited = None, False
        self._publish()
        self._start_container(
            replica.name,
            pod,
            spec.command,
            spec.working_dir,
            env,
            f"started {replica.name}",
            lines=replica.lines,
        )

    def _check(self, replica: Replica) -> None:
        pod = replica.pod
        code = pod.process.poll()
        if code is None:
            if pod.tf_config_seen is None:
                environ = _environ(pod.process.pid)  # once `ip netns exec` became the command
                if environ is not None:
                    pod.tf_config_seen = environ.get("TF_CONFIG", "")
                    replica.tf_configs_seen.append(pod.tf_config_seen)
                    self._check_hosts_mounted(replica)
            return
        code = exit_code(code)
        pod.exited = True
        self._publish()
        replica.exit_codes.append(code)
        self._event(f"{replica.name} exited {code}")
        policy = replica.spec.restart_policy
        if policy == "Always" or (policy == "OnFailure" and code != 0):
            replica.restart_count += 1
            if self._past_backoff_limit():
                return
            self._event(f"kubelet restarts {replica.name} (restart {replica.restart_count})")
            self._start(replica)
        elif code == 0:
            replica.succeeded = True
        elif policy == "ExitCode" and code >= 128:
            replica.replaced_after_failure += 1
            if self._past_backoff_limit():
                return
            self._event(f"operator replaces {replica.name}: exit {code} is retryable")
            self._remove_pod(replica)
        else:
            self._finish("Failed", f"{replica.name} exited {code} ({policy}): the job fails")

    def _check_hosts_mounted(self, replica: Replica) -> None:
        """Fails the run if the container does not see its pod's hosts file as /etc/hosts."""
        pod = replica.pod
        try:
            mounted = os.path.samefile(
                f"/proc/{pod.process.pid}/root/etc/hosts", f"/etc/netns/{pod.namespace}/hosts"
            )
        except OSError:
            return  # the process is gone already; its exit is handled next time
        if not mounted:
            self._finish("Error", f"{replica.name} does not see its pod's hosts file")

    def _past_backoff_limit(self) -> bool:
        limit = self.job.backoff_limit
        restarts = sum(r.restart_count + r.replaced_after_failure for r in self.replicas.values())
        if limit is None or restarts < max(limit, 1):
            return False
        self._finish("Failed", f"{restarts} restarts reached the backoff limit {limit}")
        for replica in self.replicas.values():
            if replica.pod and not replica.pod.deleting:
                self._start_delete(replica, recreate=False)
        self._cleaned = True
        return True

    def _decide_success(self) -> None:
        types = {r.type for r in self.job.replicas}
        leader = next((t for t in ("Chief", "Master") if t in types), None)
        slots = [r for r in self.replicas.values() if r.spec.type == (leader or "Worker")]
        if not slots:
            return
        if leader or self.job.success_policy == "AllWorkers":
            done = all(r.succeeded for r in slots)
        else:
            done = slots[0].succeeded or all(r.succeeded for r in slots)
        if done:
            self._finish("Succeeded", f"{leader or 'worker 0'} completed")

    def _publish(self) -> None:
        """Service names resolve to the pods that are running and not being deleted: the
        operator's services are headless and do not publish addresses of pods not ready."""
        ready = [
            r for r in self.replicas.values() if r.pod and not (r.pod.deleting or r.pod.exited)
        ]
        self._network.write_hosts({r.host: r.pod.address for r in ready})

    def _remove_pod(self, replica: Replica) -> None:
        pod, replica.pod = replica.pod, None
        self._remove_sandbox(pod)

    def _start_delete(self, replica: Replica, recreate: bool) -> threading.Thread:
        replica.pod.deleting = True
        self._publish()
        return self._spawn(self._delete, replica, recreate)

    def _delete(self, replica: Replica, recreate: bool) -> None:
        pod = replica.pod
        code = self._terminate(replica.name, pod.process, replica.spec.grace_secs)
        with self._lock:
            if not pod.exited:
                replica.exit_codes.append(code)
            self._event(f"{replica.name} gone after deletion, exit {replica.exit_codes[-1]}")
            self._remove_pod(replica)
            if recreate:
                replica.recreated_after_delete += 1

    def delete_pod(self, name: str) -> None:
        """`kubectl delete pod NAME`: returns once the pod is gone; the operator recreates it."""
        with self._lock:
            replica = self.replicas[name]
            if replica.pod is None or replica.pod.deleting:
                raise RuntimeError(f"pod {name} does not exist or is already being deleted")
            thread = self._start_delete(replica, recreate=True)
        thread.join()

    def wait_for_exit(self, name: str, timeout: float) -> int:
        """Waits for the current process of pod `name` to end and the operator to see it.

        Returns:
          Its exit code, as the container runtime reports it.
        """
        with self._lock:
            replica = self.replicas[name]
            pod = replica.pod
            seen = self._changed.wait_for(lambda: pod.exited or replica.pod is not pod, timeout)
        if not seen:
            raise AssertionError(report(f"pod {name} still running after {timeout} s", self.logs()))
        return exit_code(pod.process.wait())

    def wait_for_line(self, name: str, pattern: str, timeout: float, since: float = 0.0) -> tuple:
        """Waits for a line of pod `name` matching `pattern`, logged at or after `since`.

        Returns:
          (the monotonic time it was read, the match).
        """
        regex = re.compile(pattern)
        lines = self.replicas[name].lines
        checked = 0

        def find() -> Optional[tuple]:
            nonlocal checked
            for when, line in lines[checked:]:
                checked += 1
                match = when >= since and regex.search(line)
                if match:
                    return when, match
            return None

        return self._wait_until(
            find, timeout, f"no line of {name} matching {pattern!r} in {timeout} s"
        )

    def resolve(self, name: str, host: str) -> str:
        """The address `host` resolves to inside pod `name` ('' if it does not resolve)."""
        namespace = self.replicas[name].pod.namespace
        result = subprocess.run(
            ["ip", "netns", "exec", namespace, "getent", "ahostsv4", host],
            capture_output=True,
            text=True,
        )
        return result.stdout.split()[0] if result.returncode == 0 else ""

    def peers(self, name: str) -> set:
        """Addresses pod `name` has established TCP connections with."""
        namespace = self.replicas[name].pod.namespace
        result = subprocess.run(
            ["ip", "netns", "exec", namespace, "ss", "-Htn", "state", "established"],
            capture_output=True,
            text=True,
            check=True,
        )
        peers = (line.split()[-1].rsplit(":", 1)[0] for line in result.stdout.splitlines())
        return {peer.strip("[]").removeprefix("::ffff:") for peer in peers}


def _environ(pid: int) -> Optional[Dict[str, str]]:
    """The environment a container's command started with; None while it is still `ip`."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as stream:
            if os.path.basename(stream.read().split(b"\0")[0]) == b"ip":
                return None
        with open(f"/proc/{pid}/environ", "rb") as stream:
            entries = stream.read().split(b"\0")
    except OSError:
        return None
    pairs = (entry.decode(errors="replace").partition("=") for entry in entries if entry)
    return {key: value for key, _, value in pairs}
