"""Kubernetes pods as processes in network namespaces, shared by the emulated controllers.

`tests/tfjob_operator.py` (Kubeflow's TFJob) and `tests/jobset_controller.py`
(JobSet, Indexed Jobs) run their pods with what this module does as the kubelet
and the container runtime would: one network namespace per pod ("pod sandbox")
with its own address on a veth pair joined by a bridge that lives in a namespace
of its own (never the host's); every pod's `/etc/netns/<ns>/hosts` (which `ip
netns exec` mounts over `/etc/hosts`) holding the names the controller publishes;
the container's command as the pod's process in its own process group, its
output appended to `<log_dir>/<pod>.log` and its status channel
(`estimator_dist.report.status`) read as events; and a deleted pod's SIGTERM, grace
period, then SIGKILL. `PodRun` is the run both controllers extend: its lifecycle
(a control thread that reconciles every 0.1 s, clean-up of every process,
namespace, veth, bridge and /etc/netns directory when the context ends, whatever
happened), its event log and its waits. The controllers' own rules (which pods,
their env, restarts, success and failure) are theirs.

What it cannot show: no scheduler or kubelet (pods start at once, no image
pulls, no resource limits), no DNS server (hosts files instead; a name not in
them fails at once), no API server or informer delays between reconciles, no
storage driver, no image (this checkout and its venv).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import threading
import time
from typing import Callable, Dict, Iterable, List, Mapping, Optional, TextIO, Tuple, TypeVar

from estimator_dist.report import status
from tests.procs import _kill_group, report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUBNET = "10.244.0"
#: Numbers for namespaces and veths, unique in this process across every run.
SEQUENCE = iter(range(1, 1 << 30))


def namespaces_unavailable() -> Optional[str]:
    """Why network namespaces cannot be made here (not root, no `ip`), or None if they can."""
    probe = f"tfjprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (OSError, RuntimeError) as error:
        return str(error)
    _ip("netns", "del", probe)
    return None


def _ip(*args: str) -> None:
    result = subprocess.run(["ip", *args], capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(f"ip {' '.join(args)} failed: {result.stderr.strip()}")


class Network:
    """Pod sandboxes: namespaces on one bridge, which sits in a namespace of its own."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.node = f"{prefix}-node"
        self.pods: Dict[str, str] = {}  # pod namespace -> address
        self._next_host = 2
        _ip("netns", "add", self.node)
        try:
            _ip("-n", self.node, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.node, "link", "set", "br0", "up")
        except RuntimeError:
            self.close()
            raise

    def add(self, seq: int) -> Tuple[str, str]:
        """Creates a pod namespace with its own address; returns (namespace, address)."""
        if self._next_host > 254:
            raise RuntimeError(f"no addresses left in {SUBNET}.0/24 for another pod")
        namespace, address = f"{self.prefix}-p{seq}", f"{SUBNET}.{self._next_host}"
        self._next_host += 1
        _ip("netns", "add", namespace)
        self.pods[namespace] = address
        port = f"veth{seq}"
        _ip("-n", namespace, "link", "add", "eth0", "type", "veth", "peer", "name", port)
        _ip("-n", namespace, "link", "set", port, "netns", self.node)
        _ip("-n", self.node, "link", "set", port, "master", "br0", "up")
        _ip("-n", namespace, "addr", "add", f"{address}/24", "dev", "eth0")
        _ip("-n", namespace, "link", "set", "eth0", "up")
        _ip("-n", namespace, "link", "set", "lo", "up")
        return namespace, address

    def write_hosts(self, names: Mapping[str, str]) -> None:
        """Writes /etc/hosts of every pod: `names` (host -> address) and localhost.

        Written in place, not replaced: a running process sees the file `ip netns
        exec` mounted when it started, so a recreated pod's new address reaches it.
        """
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
        lines += [f"{address}\t{host}" for host, address in sorted(names.items())]
        for namespace in self.pods:
            os.makedirs(f"/etc/netns/{namespace}", exist_ok=True)
            with open(f"/etc/netns/{namespace}/hosts", "w") as stream:
                stream.write("\n".join(lines) + "\n")

    def remove(self, namespace: str) -> None:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        shutil.rmtree(f"/etc/netns/{namespace}", ignore_errors=True)
        self.pods.pop(namespace, None)

    def close(self) -> None:
        for namespace in list(self.pods):
            self.remove(namespace)
        subprocess.run(["ip", "netns", "del", self.node], capture_output=True)


@dataclasses.dataclass
class Sandbox:
    """One pod as created: its sandbox and its container's current process."""

    namespace: str
    address: str
    process: Optional[subprocess.Popen] = None
    deleting: bool = False
    exited: bool = False


T = TypeVar("T")
SandboxT = TypeVar("SandboxT", bound=Sandbox)
RunT = TypeVar("RunT", bound="PodRun")


def exit_code(returncode: int) -> int:
    """The exit code a container runtime reports: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


class PodRun:
    """A controller's run of pods: the network, the threads, events, start and deletion.

    Use as a context manager; on exit every process is killed and every
    namespace, veth, bridge and /etc/netns directory removed. Subclasses hold the
    controller's rules: `_reconcile` (called every 0.1 s with the lock held),
    `_publish` (the names in every pod's hosts file), `_pod_names`, `_sandboxes`
    and `_status_events`.

    Attributes:
      log_dir: Where each pod's log goes, as `<pod>.log` (appended on restarts).
      condition: None while the run goes on, then "Succeeded", "Failed" or "Error".
      message: Why it ended as it did.
      events: The controller's events, with the monotonic time of each.
    """

    #: The start of the run's namespace names (with this pid and a sequence number).
    NETNS_PREFIX = ""
    #: What `logs()` calls the controller's events.
    CONTROLLER = "controller"
    #: The event that ends the run, formatted with `condition` and `message`.
    FINISHED = "{condition}: {message}"

    def __init__(self, log_dir: str) -> None:
        self.log_dir = log_dir
        self.condition: Optional[str] = None
        self.message = ""
        self.events: List[Tuple[float, str]] = []
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._threads: List[threading.Thread] = []
        self._network: Optional[Network] = None

    def __enter__(self: RunT) -> RunT:
        os.makedirs(self.log_dir, exist_ok=True)
        try:
            self._network = Network(f"{self.NETNS_PREFIX}{os.getpid()}x{next(SEQUENCE)}")
            self._spawn(self._control)
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Kills every process at once and removes everything this run created."""
        self._stop.set()
        if self._threads:
            self._threads[0].join(timeout=30)  # the controller: no pod is created after this
        with self._lock:
            sandboxes = self._sandboxes()
        for sandbox in sandboxes:
            if sandbox.process:
                _kill_group(sandbox.process.pid)
                sandbox.process.wait()
        for thread in self._threads[1:]:
            if thread is not threading.current_thread():
                thread.join(timeout=30)
        if self._network:
            self._network.close()

    def _pod_names(self) -> Iterable[str]:
        """Every pod slot's name."""
        raise NotImplementedError

    def _sandboxes(self) -> List[Sandbox]:
        """The pods that exist now."""
        raise NotImplementedError

    def _status_events(self, name: str) -> List[Tuple[float, status.Event]]:
        """The status events read from pod `name`'s containers, with the time of each."""
        raise NotImplementedError

    def _reconcile(self) -> None:
        """One pass of the controller's rules."""
        raise NotImplementedError

    def _publish(self) -> None:
        """Writes the names the pods resolve into every pod's hosts file."""
        raise NotImplementedError

    def _spawn(self, target: Callable[..., None], *args: object) -> threading.Thread:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()
        return thread

    def _event(self, text: str) -> None:
        self.events.append((time.monotonic(), text))
        self._changed.notify_all()

    def _control(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                try:
                    self._reconcile()
                except Exception as error:  # reported by `wait`, with the pods' logs
                    self._finish("Error", f"the emulation failed: {error!r}")
                    return
            self._stop.wait(0.1)

    def _finish(self, condition: str, message: str) -> None:
        self.condition, self.message = condition, message
        self._event(self.FINISHED.format(condition=condition, message=message))

    def _new_sandbox(self, factory: Callable[[str, str], SandboxT]) -> SandboxT:
        """Creates a pod's sandbox: a namespace with its own address on the bridge."""
        namespace, address = self._network.add(next(SEQUENCE))
        return factory(namespace, address)

    def _start_container(
        self,
        name: str,
        sandbox: Sandbox,
        command: Iterable[str],
        cwd: str,
        env: Dict[str, str],
        started: str,
        lines: Optional[List[Tuple[float, str]]] = None,
    ) -> None:
        """Starts `command` as pod `name`'s process in its sandbox, then reads what it says.

        Call it after `_publish`: `ip netns exec` mounts the hosts file only if it
        exists when the process starts.

        Args:
          name: The pod's name; its log is `<log_dir>/<name>.log`.
          sandbox: The pod's sandbox; its `process` becomes the new process.
          command: The container's command and args.
          cwd: The container's working directory.
          env: The container's whole environment; the status channel's descriptor
            is added to it.
          started: The event to log, followed by ` (pid N)`.
          lines: If given, where each line of output goes, with the time it was read.
        """
        # Not Kubernetes': the tests learn what a task did (its first step, its progress)
        # from its status channel, as the launcher does, not from lines a model_fn could print.
        read_fd, write_fd = os.pipe()
        env[status.STATUS_FD_ENV] = str(write_fd)
        try:
            sandbox.process = subprocess.Popen(
                ["ip", "netns", "exec", sandbox.namespace, *command],
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                start_new_session=True,
                pass_fds=(write_fd,),
            )
        finally:
            os.close(write_fd)
        self._event(f"{started} (pid {sandbox.process.pid})")
        self._spawn(self._read, name, sandbox.process, lines)
        self._spawn(self._read_status, self._status_events(name), open(read_fd, errors="replace"))

    def _read(
        self, name: str, process: subprocess.Popen, lines: Optional[List[Tuple[float, str]]]
    ) -> None:
        path = os.path.join(self.log_dir, f"{name}.log")
        with open(path, "a") as log:
            log.write(f"===== {name}: container started (pid {process.pid}) =====\n")
            for line in process.stdout:
                log.write(line)
                log.flush()
                if lines is not None:
                    with self._lock:
                        lines.append((time.monotonic(), line.rstrip("\n")))
                        self._changed.notify_all()

    def _read_status(self, events: List[Tuple[float, status.Event]], channel: TextIO) -> None:
        with channel:
            for event in status.EventReader().read(channel):
                with self._lock:
                    events.append((time.monotonic(), event))
                    self._changed.notify_all()

    def _remove_sandbox(self, sandbox: Sandbox) -> None:
        """Removes a pod that is no longer the current one of its slot."""
        if sandbox.process:
            _kill_group(sandbox.process.pid)  # the runtime kills what is left in the container
        self._network.remove(sandbox.namespace)
        self._publish()

    def _terminate(self, name: str, process: subprocess.Popen, grace_secs: float) -> int:
        """What the kubelet does with a deleted pod: SIGTERM, the grace period, SIGKILL.

        Call it without the lock held.

        Returns:
          The process's exit code, as the container runtime reports it.
        """
        with self._lock:
            self._event(f"deleting {name}: SIGTERM")
        if process.poll() is None:
            os.kill(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=grace_secs)
            except subprocess.TimeoutExpired:
                with self._lock:
                    self._event(f"{name} outlived its grace period: SIGKILL")
                _kill_group(process.pid)
                process.wait()
        return exit_code(process.returncode)

    def wait(self, timeout: float) -> str:
        """Waits for the run to finish; returns "Succeeded" or "Failed"."""
        with self._lock:
            if not self._changed.wait_for(lambda: self.condition, timeout):
                raise AssertionError(report(f"the job did not finish in {timeout} s", self.logs()))
            return self.condition

    def wait_for_event(
        self, name: str, kind: type, timeout: float, since: float = 0.0
    ) -> Tuple[float, status.Event]:
        """Waits for an event of type `kind` from pod `name`, read at or after `since`.

        Returns:
          (the monotonic time it was read, the event).
        """
        events = self._status_events(name)

        def find() -> Optional[Tuple[float, status.Event]]:
            return next(((t, e) for t, e in events if t >= since and isinstance(e, kind)), None)

        return self._wait_until(
            find, timeout, f"no {kind.__name__} event from {name} in {timeout} s"
        )

    def _wait_until(self, find: Callable[[], T], timeout: float, cause: str) -> T:
        """Waits until `find()` returns something true, then returns it.

        Raises:
          AssertionError: with `cause` and every log, if `timeout` seconds pass first.
        """
        with self._lock:
            found = self._changed.wait_for(find, timeout)
        if not found:
            raise AssertionError(report(cause, self.logs()))
        return found

    def logs(self) -> Dict[str, str]:
        """Every pod's log so far, by pod name (for `tests.procs.report`)."""
        logs = {}
        for name in self._pod_names():
            path = os.path.join(self.log_dir, f"{name}.log")
            if os.path.exists(path):
                with open(path, errors="replace") as stream:
                    logs[name] = stream.read()
        logs[self.CONTROLLER] = "\n".join(f"{t:.1f} {text}" for t, text in self.events)
        return logs


def wait_for(condition: Callable[[], object], timeout: float, what: str, run: PodRun) -> None:
    """Waits until `condition()` holds, or fails after `timeout` s showing every pod's log."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(report(f"{what} not seen in {timeout} s", run.logs()))
        time.sleep(0.2)
