"""Cross-task pre-flight: every task of a cluster agrees on the job before training.

TensorFlow never cross-checks TF_CONFIG between tasks: two tasks with the
same index, or workers given differently ordered cluster lists, hang
(tests/estimator_dist/faults_test.py runs both). Before TensorFlow starts its
servers, the chief listens on its own port; every other training and
parameter server task connects,
sends its view of the job (cluster list in order, model_dir, strategy and
collective settings, steps, batch, versions) and waits for the verdict:

* all views equal: everybody proceeds;
* any difference, or two tasks claiming the same role: everybody fails with
  a diff (exit 4);
* a task missing at the start-up deadline: everybody fails naming it (exit 151).

Each non-chief task holds its own port while it waits, so a port already in
use, or a second task with the same index on the same host, fails at once
(exit 154). The evaluator takes no part: it is outside the cluster.

Each task may also send a value of its own, which is not compared: the
verdict carries every task's value to every task (`exchange`), as the
batch counts of `estimator_dist.task.last_step` travel.

No task waits silently: every `WAIT_NOTICE_SECS` (30 s) of waiting, a line
shown on the console names the tasks not arrived yet, their addresses, the
time waited and the bound (`WaitNotice`). The chief knows who is missing; it
tells every task already checked in, at each arrival and each notice, so
they name the same tasks; a task that cannot reach the chief names it::

    estimator_dist: task chief-0 waiting for worker-0 (localhost:12345) at the rendezvous
    for 30 s of at most 600 s

Example, what a worker sends::

    {"role": "worker-0", "view": {"cluster": {...}, "model_dir": "/shared/run1", ...}}
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

from absl import logging

from estimator_dist.base.errors import ClusterMismatchError, ClusterTimeoutError, PortInUseError
from estimator_dist.cluster.tf_config import CHIEF, EVALUATOR, ClusterConfig
from estimator_dist.report import status

_RETRY_SECS = 0.5
_IO_TIMEOUT = 10.0
#: Seconds between two lines of a task that waits for named peers.
WAIT_NOTICE_SECS = 30.0
#: The line a waiting task shows every `WAIT_NOTICE_SECS`.
WAITING_MESSAGE = (
    "estimator_dist: task {role} waiting for {peers} {where} for {waited:.0f} s of at most "
    "{bound:g} s"
)


class WaitNotice:
    """Says which named peers this task still waits for, once every `every` seconds of waiting.

    The first line comes `every` seconds after the notice is made, the next
    `every` seconds later, and so on; a line that falls due while nobody is
    missing is skipped, not delayed.

    Args:
      role: This task's name, e.g. `chief-0`.
      where: The phase, as the line says it: `at the rendezvous`.
      bound: The seconds this wait may last before the task fails.
      idle: Said instead of the names when nobody named is missing; None says nothing.
      every: Seconds between two lines; `WAIT_NOTICE_SECS` when None.
      clock: Monotonic clock, replaceable in tests.
      say: Where a line goes (a log record shown on the console).

    >>> clock = iter([0.0, 30.0, 30.0]).__next__
    >>> notice = WaitNotice("chief-0", "at the rendezvous", 600, clock=clock, say=print)
    >>> notice.update(["w-0 (h:1)"])
    estimator_dist: task chief-0 waiting for w-0 (h:1) at the rendezvous for 30 s of at most 600 s
    True
    """

    def __init__(
        self,
        role: str,
        where: str,
        bound: float,
        idle: Optional[str] = None,
        every: Optional[float] = None,
        clock: Callable[[], float] = time.monotonic,
        say: Callable[[str], None] = lambda line: logging.info("%s", line),
    ) -> None:
        self._role, self._where, self._bound, self._idle = role, where, bound, idle
        self._every = WAIT_NOTICE_SECS if every is None else every
        self._clock, self._say = clock, say
        self._began = clock()
        self._next = self._began + self._every

    def due_in(self) -> float:
        """Seconds until the next line is due (0 when it is due now)."""
        return max(0.0, self._next - self._clock())

    def update(self, missing: Sequence[str]) -> bool:
        """Says who is `missing` (`name (address)` each) if a line is due; returns whether due."""
        now = self._clock()
        if now < self._next:
            return False
        while self._next <= now:
            self._next += self._every
        if missing:
            line = WAITING_MESSAGE.format(
                role=self._role,
                peers=", ".join(missing),
                where=self._where,
                waited=now - self._began,
                bound=self._bound,
            )
        elif self._idle is not None:
            line = self._idle.format(role=self._role, waited=now - self._began, bound=self._bound)
        else:
            return True
        self._say(line)
        return True


def _named(roles: Sequence[str], addresses: Mapping[str, str]) -> List[str]:
    return [f"{role} ({addresses.get(role, '?')})" for role in roles]


def _split(address: str) -> Tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _bind(cluster: ClusterConfig, address: str) -> socket.socket:
    """Binds this task's port on every interface, as TensorFlow's server will."""
    _, port = _split(address)
    try:
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        return socket.create_server(("", port))
    except OSError as error:
        raise PortInUseError(
            f"task {cluster.role} cannot listen on port {port} ({address} in TF_CONFIG): "
            f"{error.strerror}. Another process holds it: a stale task of an earlier job, "
            "another job, or a second task started with the same task index. Stop it or "
            "give this task another port."
        ) from None


def diff_views(reference: Mapping[str, Any], other: Mapping[str, Any], name: str) -> List[str]:
    """Returns one line per setting where `other` (task `name`) differs from the chief's.

    >>> diff_views({"model_dir": "/a"}, {"model_dir": "/b"}, "worker-0")
    ["model_dir: chief has '/a', worker-0 has '/b'"]
    """
    keys = sorted(set(reference) | set(other))
    return [
        f"{key}: chief has {reference.get(key)!r}, {name} has {other.get(key)!r}"
        for key in keys
        if reference.get(key) != other.get(key)
    ]


def _expected_roles(cluster: ClusterConfig) -> Dict[str, str]:
    return {
        f"{name}-{index}": address
        for name, addresses in cluster.jobs.items()
        for index, address in enumerate(addresses)
        if name != CHIEF
    }


def _read_message(conn: socket.socket, timeout: float) -> Optional[dict]:
    conn.settimeout(max(0.1, timeout))
    data = b""
    try:
        while not data.endswith(b"\n"):
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        return json.loads(data)
    except (OSError, ValueError):
        return None


def _send(conn: socket.socket, message: Mapping[str, Any]) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(message).encode() + b"\n")


def _tell_all(arrived: Mapping[str, Mapping[str, socket.socket]], message: Mapping) -> None:
    for conns in arrived.values():
        for conn in conns.values():
            _send(conn, message)


def _await_verdict(
    conn: socket.socket, until: float, notice: WaitNotice
) -> Optional[Mapping[str, Any]]:
    """Reads the chief's messages until its verdict; says whom the chief still waits for.

    Returns:
      The verdict, or None when the connection ends or nothing comes by `until`.
    """
    data, missing = b"", []
    while True:
        notice.update(missing)
        remaining = until - time.monotonic()
        if remaining <= 0:
            return None
        conn.settimeout(max(0.1, min(remaining, notice.due_in())))
        try:
            chunk = conn.recv(65536)
        except socket.timeout:
            continue
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
        while b"\n" in data:
            line, data = data.split(b"\n", 1)
            try:
                message = json.loads(line)
            except ValueError:
                return None
            if "waiting" not in message:
                return message
            missing = list(message["waiting"])


@contextlib.contextmanager
def _closing_all(connections: Dict[str, Dict[str, socket.socket]]) -> Iterator[None]:
    try:
        yield
    finally:
        for conns in connections.values():
            for conn in conns.values():
                # Wait for the peer to close first, so TIME_WAIT stays on its side and
                # TensorFlow can bind this port at once.
                conn.settimeout(2.0)
                with contextlib.suppress(OSError):
                    conn.recv(1)
                conn.close()


def _problems(
    view: Mapping[str, Any], views: Mapping[str, Mapping[str, dict]], expected: Mapping[str, str]
) -> List[str]:
    """Returns every disagreement among the views received so far."""
    problems = []
    for role, role_views in sorted(views.items()):
        if role not in expected:
            problems.append(f"{role}: not a task of the chief's cluster")
        if len(role_views) > 1:
            problems.append(f"{role}: {len(role_views)} tasks claim this role (same index)")
        for other in role_views.values():
            problems.extend(diff_views(view, other, role))
    return problems


def _serve(
    cluster: ClusterConfig, view: Mapping[str, Any], timeout: float, value: Any
) -> Tuple[str, Dict[str, Any]]:
    expected = _expected_roles(cluster)
    values: Dict[str, Any] = {cluster.role: value}
    deadline = time.monotonic() + timeout
    arrived: Dict[str, Dict[str, socket.socket]] = {}
    views: Dict[str, Dict[str, dict]] = {}
    notice = WaitNotice(cluster.role, "at the rendezvous", timeout)
    with _bind(cluster, cluster.jobs[CHIEF][0]) as server, _closing_all(arrived):
        while (
            set(arrived) < set(expected)
            and time.monotonic() < deadline
            and not _problems(view, views, expected)
        ):
            absent = _named(sorted(set(expected) - set(arrived)), expected)
            if notice.update(absent):
                _tell_all(arrived, {"waiting": absent})
            server.settimeout(max(0.1, min(deadline - time.monotonic(), notice.due_in())))
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            message = _read_message(conn, min(_IO_TIMEOUT, deadline - time.monotonic()))
            if not message or "role" not in message:
                conn.close()
                continue
            role, nonce = message["role"], message.get("nonce")
            previous = arrived.setdefault(role, {}).pop(nonce, None)
            if previous is not None:
                previous.close()
            arrived[role][nonce] = conn
            views.setdefault(role, {})[nonce] = message.get("view", {})
            values[role] = message.get("value")
            _tell_all(arrived, {"waiting": _named(sorted(set(expected) - set(arrived)), expected)})
        missing = sorted(set(expected) - set(arrived))
        problems = _problems(view, views, expected)
        if problems:
            reply = {"ok": False, "error": "mismatch", "problems": problems}
        elif missing:
            reply = {"ok": False, "error": "timeout", "missing": missing}
        else:
            reply = {"ok": True, "attempt": uuid.uuid4().hex, "values": values}
        _tell_all(arrived, reply)
    _raise_for(reply, cluster, timeout, expected)
    logging.info("Rendezvous: all %d other task(s) agree with the chief.", len(expected))
    return reply["attempt"], values


def _raise_for(
    reply: Mapping[str, Any], cluster: ClusterConfig, timeout: float, expected: Mapping[str, str]
) -> None:
    if reply.get("error") == "mismatch":
        raise ClusterMismatchError(
            f"the tasks of the cluster disagree (seen by {cluster.role}): "
            + "; ".join(reply["problems"])
            + ". Start every task with the same flags and the same TF_CONFIG cluster "
            "(same jobs, same order), each with its own task index."
        )
    if reply.get("error") == "timeout":
        names = [f"{role} ({expected.get(role, '?')})" for role in reply["missing"]]
        raise ClusterTimeoutError(
            f"task(s) {', '.join(names)} never reached the chief within the start-up timeout "
            f"of {timeout:g} s (seen by {cluster.role}). Start them, check that they can reach "
            "the chief's address, or raise --startup_timeout."
        )


def _join(
    cluster: ClusterConfig, view: Mapping[str, Any], timeout: float, value: Any
) -> Tuple[str, Dict[str, Any]]:
    own = cluster.jobs[cluster.task_type][cluster.task_index]
    chief = cluster.jobs[CHIEF][0]
    deadline = time.monotonic() + timeout
    nonce = uuid.uuid4().hex
    notice = WaitNotice(cluster.role, "at the rendezvous", timeout)
    with _bind(cluster, own):
        while time.monotonic() < deadline:
            try:
                conn = socket.create_connection(_split(chief), timeout=_IO_TIMEOUT)
            except OSError:
                notice.update(_named([f"{CHIEF}-0"], {f"{CHIEF}-0": chief}))
                time.sleep(_RETRY_SECS)
                continue
            with conn:
                message = {"role": cluster.role, "nonce": nonce, "view": dict(view), "value": value}
                _send(conn, message)
                reply = _await_verdict(conn, deadline + _IO_TIMEOUT, notice)
            if reply is None:
                time.sleep(_RETRY_SECS)
                continue
            _raise_for(reply, cluster, timeout, _expected_roles(cluster))
            return reply["attempt"], reply.get("values", {})
    raise ClusterTimeoutError(
        f"the chief ({chief}) did not answer {cluster.role} within the start-up timeout of "
        f"{timeout:g} s. Start the chief, check that this task can reach it, or raise "
        "--startup_timeout."
    )


def rendezvous(cluster: ClusterConfig, view: Mapping[str, Any], timeout: float) -> Optional[str]:
    """Waits until every task of the cluster has checked in with the same view.

    A no-op for a single process and for the evaluator.

    Args:
      cluster: This task's cluster configuration.
      view: Settings every task must share; JSON-serialisable.
      timeout: Seconds to wait for the whole cluster.

    Returns:
      The id the chief gave this attempt of the job, the same on every task
      of the cluster (fresh at each start); None for a single process and
      the evaluator.

    Raises:
      ClusterMismatchError: the tasks disagree, or two claim the same role.
      ClusterTimeoutError: a task (or the chief) did not arrive in time.
      PortInUseError: this task's port is taken.
    """
    return exchange(cluster, view, timeout)[0]


def exchange(
    cluster: ClusterConfig, view: Mapping[str, Any], timeout: float, value: Any = None
) -> Tuple[Optional[str], Dict[str, Any]]:
    """`rendezvous`, which also hands every task each task's `value` (not compared).

    Returns:
      The attempt id (None for a single process and the evaluator) and the
      value of every task of the cluster by role (`{role: value}` for a
      single process, `{}` for the evaluator).
    """
    if not cluster.is_distributed:
        return None, {cluster.role: value}
    if cluster.task_type == EVALUATOR:
        return None, {}
    started = time.monotonic()
    if cluster.task_type == CHIEF:
        met = _serve(cluster, view, timeout, value)
    else:
        met = _join(cluster, view, timeout, value)
    status.emit(status.RendezvousMet(tasks=len(met[1]), secs=time.monotonic() - started))
    return met
