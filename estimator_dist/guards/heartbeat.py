"""Notice within seconds a training peer that stops answering: frozen, or cut off.

A peer that dies is noticed at once: its connections are reset and the
collective fails (exit 150). A peer that freezes (SIGSTOP, a paused VM, a
host swapping) or that the network cuts off resets nothing: the others wait
in their collectives until the stall watchdog's `--stall_timeout` (120 s).

`Heartbeat` notices it in `--heartbeat_timeout` (15 s). Every training task
(chief and workers of a collective job) runs a daemon thread that sends a
small UDP datagram to every other training task every second, and answers
each one it receives. It uses the port number of the task's gRPC port in
TF_CONFIG: UDP's ports are not TCP's, so nothing new is allocated, and what
reaches a task's gRPC port (pod IPs on Kubernetes, hosts on one network)
reaches its heartbeat. A frozen peer's kernel still queues the datagrams,
but nothing answers them; a cut network carries none.

Once this task has run its first step, a peer that has answered at least
once and then nothing for the timeout ends this task with exit 156
(`PEER_UNRESPONSIVE`, retryable) and one line naming the peer, its address,
its silence and the latest global step known. Every datagram says its
sender's phase, so a peer whose training has ended (its final checkpoint,
evaluation or export follow, or it stopped for a preemption) is not judged;
judging stops too when this task's own training ends or it stops for a
preemption. A thread that did not run for a while (this process was frozen
itself, or starved of CPU) restarts every peer's count rather than blaming
them.

Datagrams carry a job id, a hash of the cluster, model_dir and the attempt
id the chief gave at the rendezvous: a datagram of another job or an earlier
attempt on the same ports, from a task not in the cluster, or not in this
format, is ignored. Nothing more is authenticated: a datagram says only that
its sender is alive. A port that cannot be bound leaves the task without a
heartbeat, after one warning; the stall watchdog still works.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import socket
import threading
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import tensorflow as tf
from absl import logging

from estimator_dist.base import exit_codes
from estimator_dist.cluster.tf_config import CHIEF, WORKER, ClusterConfig
from estimator_dist.guards.preemption import Preemption
from estimator_dist.guards.watchdog import fail

#: What the peers know of this task's training: not begun, running, ended, stopping.
STARTING, TRAINING, FINISHED, STOPPING = "starting", "training", "finished", "stopping"
#: Phases in which a peer may stop answering: its training is over.
_DONE = (FINISHED, STOPPING)
#: Starts every datagram, before its JSON body.
MAGIC = b"estimator_dist.heartbeat/1 "
#: Seconds between two datagrams to each peer, at most.
INTERVAL = 1.0

#: Why a training task fails when a peer stops answering.
UNRESPONSIVE_MESSAGE = (
    "peer {peer} ({address}) has not answered the heartbeat for {silent:.0f} s "
    "(--heartbeat_timeout={timeout:g}); the latest global step known is {step}. It is frozen "
    "(stopped, a paused VM, a host out of memory) or the network between the tasks is cut. "
    "Restart the whole job from its latest checkpoint; if tasks may pause this long, raise "
    "--heartbeat_timeout (0 turns the heartbeat off)."
)
#: Warned when the heartbeat's port cannot be bound.
UNBOUND_MESSAGE = (
    "estimator_dist: task {role} runs without a heartbeat: UDP port {port} (its gRPC port's "
    "number) cannot be bound ({error}). A frozen or cut-off peer is then noticed only after "
    "--stall_timeout."
)
#: Warned once per peer that never answered within the timeout of training.
NEVER_ANSWERED_MESSAGE = (
    "estimator_dist: peer {peer} ({address}) has not answered the heartbeat since training "
    "began {seconds:.0f} s ago: UDP to its port is blocked, or it runs without a heartbeat. "
    "Losing it is noticed only after --stall_timeout."
)


def job_id(cluster: ClusterConfig, model_dir: str, attempt: Optional[str]) -> str:
    """The id every task of one attempt of one job computes alike.

    >>> cluster = ClusterConfig({"chief": ["h:1"], "worker": ["h:2"]}, "chief")
    >>> job_id(cluster, "/m", "a") == job_id(cluster, "/m", "a") != job_id(cluster, "/m", "b")
    True
    """
    jobs = {name: list(addresses) for name, addresses in cluster.jobs.items()}
    text = json.dumps([jobs, model_dir, attempt], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def encode(job: str, sender: str, kind: str, phase: str, step: Optional[int]) -> bytes:
    """One datagram: `kind` is "ping" (answer me) or "pong" (an answer).

    >>> decode(encode("j", "chief-0", "ping", TRAINING, 7))
    {'job': 'j', 'from': 'chief-0', 'kind': 'ping', 'phase': 'training', 'step': 7}
    """
    body = {"job": job, "from": sender, "kind": kind, "phase": phase, "step": step}
    return MAGIC + json.dumps(body, separators=(",", ":")).encode()


def decode(data: bytes) -> Optional[Dict[str, Any]]:
    """The body of a datagram, or None when it is not one of ours.

    >>> decode(b"hello"), decode(MAGIC + b"{"), decode(MAGIC + b'{"kind": "ping"}')
    (None, None, None)
    """
    if not data.startswith(MAGIC):
        return None
    try:
        body = json.loads(data[len(MAGIC) :])
    except ValueError:
        return None
    valid = (
        isinstance(body, dict)
        and isinstance(body.get("job"), str)
        and isinstance(body.get("from"), str)
        and body.get("kind") in ("ping", "pong")
        and body.get("phase") in (STARTING, TRAINING, FINISHED, STOPPING)
        and (body.get("step") is None or isinstance(body.get("step"), int))
    )
    return body if valid else None


@dataclasses.dataclass
class _Peer:
    """What this task knows of one peer."""

    address: str
    target: Optional[tuple] = None  # Resolved socket address, once resolution worked.
    heard: Optional[float] = None  # When it last said anything (this clock).
    phase: str = STARTING
    step: Optional[int] = None
    warned: bool = False


class Heartbeat:
    """Sends and answers heartbeats on a UDP port; ends this task when a peer falls silent.

    Args:
      role: This task's name, e.g. `worker-1`.
      port: The UDP port to bind, on every interface.
      peers: Name to `host:port` of every other training task.
      job: The id of this attempt of the job (`job_id`), in every datagram.
      timeout: Seconds of silence after which a peer is judged unresponsive.
      preempted: Returns whether a preemption is stopping this task.
      exit_fn: Called as `exit_fn(role, code, cause)`; `watchdog.fail` by default.
      clock: Monotonic clock, replaceable in tests.
      interval: Seconds between two pings to each peer; at most `INTERVAL`, and a
        tenth of the timeout when that is less.
    """

    def __init__(
        self,
        role: str,
        port: int,
        peers: Mapping[str, str],
        job: str,
        timeout: float,
        preempted: Callable[[], bool] = lambda: False,
        exit_fn: Callable[[str, int, str], None] = fail,
        clock: Callable[[], float] = time.monotonic,
        interval: Optional[float] = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"Heartbeat needs a positive timeout, received {timeout}.")
        self._role = role
        self._port = port
        self._peers = {name: _Peer(address) for name, address in peers.items()}
        self._job = job
        self._timeout = timeout
        #: Whether the hook fetches the global step at its next run: set by each round of
        #: pings, cleared by `progress`, a plain flag with no lock.
        self.due = True
        # The global step last fetched, the runs since, and the global steps a run adds.
        self._fetched: Optional[int] = None
        self._runs, self._per_run = 0, 1.0
        self._preempted = preempted
        self._exit = exit_fn
        self._clock = clock
        self._interval = interval or min(INTERVAL, timeout / 10)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socket: Optional[socket.socket] = None
        self._thread: Optional[threading.Thread] = None
        self._training_since: Optional[float] = None
        self._finished = False

    @property
    def running(self) -> bool:
        """Whether the port is bound and the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def phase_of(self, peer: str) -> Optional[str]:
        """The phase `peer` last said it was in; None before it answered."""
        with self._lock:
            known = self._peers[peer]
            return None if known.heard is None else known.phase

    def start(self) -> bool:
        """Binds the port and starts the thread; returns False, after one warning, if it cannot."""
        try:
            self._socket = _bind(self._port)
        except OSError as error:
            logging.warning(
                UNBOUND_MESSAGE.format(role=self._role, port=self._port, error=error.strerror)
            )
            return False
        self._socket.settimeout(self._interval)
        self._thread = threading.Thread(target=self._run, name="heartbeat", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        """Stops the thread and closes the port."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        if self._socket is not None:
            self._socket.close()

    def training(self) -> None:
        """This task ran its first step of a training run: peers are judged from now on."""
        with self._lock:
            if self._training_since is None:
                self._training_since = self._clock()
            self._finished = False

    def rearm(self, preempted: Callable[[], bool]) -> None:
        """Follows a new training run of this process, with its own preemption."""
        with self._lock:
            self._preempted = preempted
            self._training_since, self._finished = None, False

    def progress(self, step: Optional[int]) -> None:
        """Records a completed run, with the global step fetched when `due` (else None)."""
        if step is None:
            self._runs += 1
            return
        self.due = False
        if self._fetched is not None and self._runs and step > self._fetched:
            self._per_run = (step - self._fetched) / (self._runs + 1)
        self._fetched, self._runs = step, 0

    @property
    def step(self) -> Optional[int]:
        """This task's latest global step: the one last fetched, plus the runs since.

        Fetched once a second; each run since adds the global steps a run added
        between the last two fetches (1 in synchronous training, 1/k with k
        gradient accumulation steps), so it is a run late at most.
        """
        if self._fetched is None:
            return None
        return self._fetched + int(self._runs * self._per_run)

    def finished(self) -> None:
        """This task's training run ended: it judges no peer, and they judge it no more."""
        with self._lock:
            self._finished = True
            self._training_since = None

    def phase(self) -> str:
        """This task's phase, as its datagrams tell the peers."""
        if self._preempted():
            return STOPPING
        with self._lock:
            if self._finished:
                return FINISHED
            return STARTING if self._training_since is None else TRAINING

    def hook(self) -> tf.compat.v1.train.SessionRunHook:
        """The hook that tells this heartbeat when training runs and when it ended."""
        return _TrainingHook(self)

    def _run(self) -> None:
        last_tick = next_ping = self._clock()
        while not self._stop.is_set():
            now = self._clock()
            if now - last_tick > 3 * self._interval + 1:
                self._forgive(now)  # This thread did not run: the silence may be its own.
            last_tick = now
            if now >= next_ping:
                self._ping_all()
                next_ping = now + self._interval
            self._judge(now)
            self._receive()

    def _forgive(self, now: float) -> None:
        with self._lock:
            for peer in self._peers.values():
                if peer.heard is not None:
                    peer.heard = now

    def _send(self, data: bytes, target: tuple) -> None:
        try:
            self._socket.sendto(data, target)
        except OSError:  # Unreachable for now (a cut link, a peer not yet up): silence counts.
            pass

    def _ping_all(self) -> None:
        data = encode(self._job, self._role, "ping", self.phase(), self.step)
        self.due = True
        for peer in self._peers.values():
            if peer.target is None:
                peer.target = _resolve(peer.address, self._socket.family)
            if peer.target is not None:
                self._send(data, peer.target)

    def _receive(self) -> None:
        try:
            data, source = self._socket.recvfrom(4096)
        except OSError:  # The timeout, or an ICMP error of an earlier datagram.
            return
        body = decode(data)
        if body is None or body["job"] != self._job or body["from"] not in self._peers:
            return
        with self._lock:
            peer = self._peers[body["from"]]
            peer.heard, peer.phase = self._clock(), body["phase"]
            if body["step"] is not None:
                peer.step = body["step"]
        if body["kind"] == "ping":
            self._send(encode(self._job, self._role, "pong", self.phase(), self.step), source)

    def _judge(self, now: float) -> None:
        if self.phase() != TRAINING:
            return
        with self._lock:
            since = self._training_since
            silent = [
                (name, peer, now - peer.heard)
                for name, peer in self._peers.items()
                if peer.heard is not None and peer.phase not in _DONE
            ]
            never = [
                (name, peer)
                for name, peer in self._peers.items()
                if peer.heard is None and not peer.warned
            ]
        if since is not None and now - since > self._timeout:
            for name, peer in never:
                peer.warned = True
                logging.warning(
                    NEVER_ANSWERED_MESSAGE.format(
                        peer=name, address=peer.address, seconds=now - since
                    )
                )
        for name, peer, seconds in silent:
            if seconds > self._timeout:
                known = [s for s in (peer.step, self.step) if s is not None]
                self._exit(
                    self._role,
                    exit_codes.PEER_UNRESPONSIVE,
                    UNRESPONSIVE_MESSAGE.format(
                        peer=name,
                        address=peer.address,
                        silent=seconds,
                        timeout=self._timeout,
                        step=max(known) if known else "unknown",
                    ),
                )
                return


class _TrainingHook(tf.compat.v1.train.SessionRunHook):
    """Tells the heartbeat of the first step of a training run, of its global step, of its end.

    A training step pays nothing but the calls: the global step is fetched only
    at the first run after each round of pings (once a second).
    """

    def __init__(self, heartbeat: Heartbeat) -> None:
        self._heartbeat = heartbeat
        self._ran = False
        self._fetch: Optional[tf.compat.v1.train.SessionRunArgs] = None

    def begin(self) -> None:
        self._fetch = tf.compat.v1.train.SessionRunArgs(tf.compat.v1.train.get_global_step())

    def after_create_session(self, session: tf.compat.v1.Session, coord: object) -> None:
        self._ran = False

    def before_run(self, run_context: object) -> Optional[tf.compat.v1.train.SessionRunArgs]:
        return self._fetch if self._heartbeat.due else None

    def after_run(self, run_context: object, run_values: Any) -> None:
        if not self._ran:
            self._ran = True
            self._heartbeat.training()
        results = run_values.results
        self._heartbeat.progress(None if results is None else int(results))

    def end(self, session: tf.compat.v1.Session) -> None:
        self._heartbeat.finished()


def _bind(port: int) -> socket.socket:
    """A UDP socket on `port` of every interface, IPv4 and IPv6 where the host has both."""
    if socket.has_dualstack_ipv6():
        sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("", port))
        except OSError:
            sock.close()
            raise
        return sock
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind(("", port))
    except OSError:
        sock.close()
        raise
    return sock


def _resolve(address: str, family: int) -> Optional[tuple]:
    """`host:port` as a socket address of `family` (IPv4 mapped into IPv6), or None."""
    try:
        infos = socket.getaddrinfo(*_split(address), type=socket.SOCK_DGRAM)
    except (OSError, ValueError):
        return None
    for info_family, _, _, _, target in infos:
        if info_family == family:
            return target
    for info_family, _, _, _, target in infos:
        if family == socket.AF_INET6 and info_family == socket.AF_INET:
            return (f"::ffff:{target[0]}", target[1], 0, 0)
    return None


def training_peers(cluster: ClusterConfig) -> Dict[str, str]:
    """Name to address of the chief and workers other than this task."""
    return {
        f"{name}-{index}": address
        for name in (CHIEF, WORKER)
        for index, address in enumerate(cluster.jobs.get(name, ()))
        if (name, index) != (cluster.task_type, cluster.task_index)
    }


def start_heartbeat(
    cluster: ClusterConfig,
    model_dir: str,
    attempt: Optional[str],
    timeout: float,
    preemption: Preemption,
    running: Optional[Heartbeat] = None,
) -> Optional[Heartbeat]:
    """Starts this task's heartbeat, or None where it takes no part or cannot bind its port.

    Only the chief and workers of a job without parameter servers take part:
    there every step needs every one of them. The evaluator has its own
    watchdog; with parameter servers a worker may pause without stopping the
    others.

    Args:
      cluster: This task's cluster configuration.
      model_dir: The job's model_dir, part of the job id.
      attempt: The attempt id from the rendezvous, part of the job id.
      timeout: `--heartbeat_timeout`; 0 turns the heartbeat off.
      preemption: A stop it decided (a signal, early stopping) ends the judging.
      running: The heartbeat an earlier training call of this process started,
        which goes on for this one (a script may train more than once).

    Returns:
      The running heartbeat; its `hook()` goes into the training hooks.
    """

    def preempted() -> bool:
        return preemption.requested or preemption.stop_at is not None

    if running is not None:
        running.rearm(preempted)
        return running
    training = cluster.task_type in (CHIEF, WORKER) and not cluster.num_ps
    if not timeout or not training:
        return None
    address = cluster.jobs[cluster.task_type][cluster.task_index]
    heartbeat = Heartbeat(
        cluster.role,
        _split(address)[1],
        training_peers(cluster),
        job_id(cluster, model_dir, attempt),
        timeout,
        preempted=preempted,
    )
    return heartbeat if heartbeat.start() else None


def _split(address: str) -> Tuple[str, int]:
    """`host:port` as (host, port), brackets of an IPv6 host removed.

    >>> _split("[::1]:2222")
    ('::1', 2222)
    """
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)
