"""One task on a Ray node: the actor that runs it there, and the launcher's proxy of it.

`TaskHost` is the body of the Ray actor (`ray_engine` makes it one with
`ray.remote`, so this module imports Ray only inside the actor's methods).
Created on its node, it binds the task's port at once and holds it until the
actor ends: a socket with `SO_REUSEADDR` bound to port 0 and not listening,
which plain binds and the kernel's ephemeral picks (`bind` to port 0) do not
take, while TensorFlow's gRPC server (which sets `SO_REUSEADDR` too) binds it
when the task starts. There is no window between choosing the port and
TensorFlow binding it, as there is when a free port is found and released;
only a program that binds this very port with `SO_REUSEADDR` can still take
it (docs/ray.md#ports). It then starts the task's command as its child, with the
parent death signal and a status channel (`estimator_dist.report.status`), and
streams its output lines and its status lines to the launcher, each tagged,
then the task's exit code: once the task exited (its output ended), its
status channel is read for at most `STATUS_DRAIN_SECS` more, as the local
launcher does (a process the task started may hold the channel open).

`ActorProcess` is what the launcher holds of such a task: the interface of
`task_start.TaskProcess`, its output and status lines read from the actor's
streaming generator, its signals sent to the actor, which sends them to the process on
its node. When the actor dies (with its node, or killed), the process counts
as killed by SIGKILL, and `lost` says why, naming the node.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import (
    IO,
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from estimator_dist.hardware.cpus import task_process_setup
from estimator_dist.report.status import DRAIN_SECS as STATUS_DRAIN_SECS
from estimator_dist.report.status import STATUS_FD_ENV

#: Seconds a signal, a start or a kill may take to reach the actor.
CALL_TIMEOUT_SECS = 10.0
#: The most lines the actor sends in one item of its stream.
_BATCH_LINES = 500
#: The tags of the lines in the actor's stream: the task's output, its status channel.
OUTPUT, STATUS = "output", "status"


def hold_port(ip: str) -> socket.socket:
    """Binds a free port of this node for a task's gRPC server, and keeps it bound.

    >>> sock = hold_port("127.0.0.1")
    >>> sock.getsockname()[1] > 0
    True
    >>> sock.close()
    """
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
    return sock


class TaskHost:
    """The Ray actor of one task: its node, its port, its process.

    Args:
      needs_port: Hold a port for the task (every task but the evaluator).
    """

    def __init__(self, needs_port: bool) -> None:
        import ray

        self._ip = ray.util.get_node_ip_address()
        self._node_id = ray.get_runtime_context().get_node_id()
        self._socket = hold_port(self._ip) if needs_port else None
        self._process: Optional[subprocess.Popen] = None
        self._status: Optional[IO[str]] = None
        # The parent death signal fires when the thread that started the child ends, and
        # Ray runs a threaded actor's methods on threads of its own: one thread that lives
        # as long as the actor starts every process.
        self._requests: queue.Queue = queue.Queue()
        threading.Thread(target=self._start_processes, daemon=True).start()

    def location(self) -> Dict[str, Any]:
        """The node's address and id, the held port (or None), the host's name."""
        port = self._socket.getsockname()[1] if self._socket is not None else None
        return {
            "ip": self._ip,
            "node_id": self._node_id,
            "port": port,
            "host": socket.gethostname(),
            "cores": sorted(os.sched_getaffinity(0)),
        }

    def start(
        self,
        module: str,
        args: Sequence[str],
        environment: Dict[str, str],
        cwd: str,
        cores: Optional[Sequence[int]] = None,
    ) -> int:
        """Starts `python -m module args...` on this node; returns its pid.

        Args:
          module: The task's module.
          args: Its arguments.
          environment: Variables added to this actor's environment.
          cwd: The launcher's working directory, used when it exists here.
          cores: The cores to pin the task to (its share of a host that runs
            several training tasks), or None for every core.
        """
        command = [sys.executable, "-m", module, *args]
        reply: queue.Queue = queue.Queue()
        directory = cwd if os.path.isdir(cwd) else None
        pinned = frozenset(cores) if cores else None
        read_fd, write_fd = os.pipe()
        environment = {**environment, STATUS_FD_ENV: str(write_fd)}
        self._requests.put((command, environment, directory, pinned, write_fd, reply))
        started = reply.get()
        os.close(write_fd)  # The task holds it: the channel ends when the task does.
        if isinstance(started, BaseException):
            os.close(read_fd)
            raise started
        self._process = started
        self._status = open(read_fd, encoding="utf-8", errors="replace")
        return started.pid

    def _start_processes(self) -> None:
        while True:
            command, environment, cwd, cores, status_fd, reply = self._requests.get()
            try:
                reply.put(
                    subprocess.Popen(
                        command,
                        cwd=cwd,
                        env=dict(os.environ, **environment),
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                        pass_fds=(status_fd,),
                        preexec_fn=task_process_setup(cores, os.getpid()),
                    )
                )
            except OSError as error:
                reply.put(error)

    def output(self) -> Iterator[Union[List[Tuple[str, str]], int]]:
        """A streaming generator: the task's lines as they come, then its exit code.

        Each item but the last is a list of `(OUTPUT, line)` (its output) and
        `(STATUS, line)` (its status channel) in the order they were read.
        Once the output ended and the process exited, the status channel is
        read for at most `STATUS_DRAIN_SECS` more before the exit code comes.
        """
        lines: queue.Queue = queue.Queue()
        process = self._process

        def read(tag: str, stream: Iterable[str]) -> None:
            for line in stream:
                lines.put((tag, line))
            lines.put(tag)  # The stream ended.

        for tag, stream in ((OUTPUT, process.stdout), (STATUS, self._status or ())):
            threading.Thread(target=read, args=(tag, stream), daemon=True).start()
        ended: set = set()
        drain_until: Optional[float] = None
        while len(ended) < 2:
            wait = None if drain_until is None else max(0.0, drain_until - time.monotonic())
            try:
                item = lines.get(timeout=wait)
            except queue.Empty:
                break  # The channel outlived the task by STATUS_DRAIN_SECS: a child holds it.
            batch = []
            while True:
                if isinstance(item, str):
                    ended.add(item)
                else:
                    batch.append(item)
                if len(ended) == 2 or len(batch) >= _BATCH_LINES or lines.empty():
                    break
                item = lines.get()
            if batch:
                yield batch
            if OUTPUT in ended and drain_until is None:
                process.wait()
                drain_until = time.monotonic() + STATUS_DRAIN_SECS
        yield process.wait()

    def signal(self, signum: int) -> None:
        """Sends `signum` to the task's process, if it still runs."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signum)


class ActorProcess:
    """A task process in a `TaskHost` actor, as the launcher's `TaskProcess`.

    Args:
      actor: The `TaskHost` actor handle, or None for a task that could not
        start (then `lost` must say why).
      pid: The task's pid on its node.
      where: ` on Ray node IP (node ID)`, for the launcher's line.
      explain_loss: Says why the actor is gone, given Ray's error.
      lost: Why the task never started, for an actor that is gone already.
    """

    def __init__(
        self,
        actor: Any,
        pid: int,
        where: str,
        explain_loss: Callable[[BaseException], str],
        lost: Optional[str] = None,
    ) -> None:
        self.pid = pid
        self.where = where
        self.lost = lost
        self.returncode: Optional[int] = None
        self._actor = actor
        self._explain_loss = explain_loss
        self._lines: queue.Queue = queue.Queue()
        self._status: queue.Queue = queue.Queue()
        self._done = threading.Event()
        self.stdout = self._read(self._lines)
        self.status = self._read(self._status)
        stream = actor.output.remote() if actor is not None else None
        threading.Thread(target=self._receive, args=(stream,), daemon=True).start()

    def _receive(self, stream: Any) -> None:
        import ray

        code = -signal.SIGKILL
        try:
            for ref in stream or ():
                item = ray.get(ref)
                if isinstance(item, int):
                    code = item
                else:
                    for tag, line in item:
                        (self._status if tag == STATUS else self._lines).put(line)
        except ray.exceptions.RayError as error:
            self.lost = self._explain_loss(error)
        finally:
            self.returncode = code
            self._lines.put(None)
            self._status.put(None)
            self._done.set()

    @staticmethod
    def _read(lines: queue.Queue) -> Iterator[str]:
        while True:
            line = lines.get()
            if line is None:
                return
            yield line

    def poll(self) -> Optional[int]:
        return self.returncode if self._done.is_set() else None

    def wait(self, timeout: Optional[float] = None) -> int:
        if not self._done.wait(timeout):
            raise subprocess.TimeoutExpired(f"task pid {self.pid}{self.where}", timeout)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """Has the actor send `signum` to the task; a gone actor is left alone."""
        if self._actor is None or self._done.is_set():
            return
        import ray

        try:
            ray.get(self._actor.signal.remote(signum), timeout=CALL_TIMEOUT_SECS)
        except ray.exceptions.RayError:
            if signum == signal.SIGKILL:  # Unreachable: end the actor, and its task with it.
                ray.kill(self._actor, no_restart=True)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
