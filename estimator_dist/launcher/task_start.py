"""How one task's process starts: what it is given, and what the launcher holds of it.

`supervise.Launcher` does not start processes itself: it builds a
`TaskSpec` for each task and calls a start function, which returns a
`TaskProcess`. `start_local_task` is the local launcher's: a child process of
the launcher, pinned to its cores, holding the kernel's parent death signal.
`estimator_dist.launcher.ray.engine` starts the same command in a Ray actor on another
node and returns a proxy with the same interface. Either way the task gets the
write end of a pipe, its status channel (`estimator_dist.report.status`), and
the launcher reads its events from `TaskProcess.status`.

Example:
  >>> from estimator_dist.cluster.tf_config import make_local_cluster
  >>> config = make_local_cluster(1, [2001]).tasks[0]
  >>> spec = TaskSpec("estimator_dist.train", ("--train_steps=10",), config, None)
  >>> process = start_local_task(spec)  # doctest: +SKIP
  >>> for line in process.stdout:  # doctest: +SKIP
  ...     print(line, end="")
  >>> list(status.EventReader().read(process.status))  # doctest: +SKIP
  [Started(task='chief-0', pid=...), RendezvousMet(...), FirstStep(step=0), ...]
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from typing import Dict, FrozenSet, Iterable, Optional, Protocol, Tuple

from estimator_dist.cluster.tf_config import EVALUATOR_ENV, ClusterConfig
from estimator_dist.hardware.cpus import task_process_setup
from estimator_dist.report import console, status


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """What one task runs.

    Attributes:
      module: The module the task runs with `python -m`.
      args: Its arguments, the same on every task.
      config: The task's TF_CONFIG.
      cores: The cores to pin the task to, or None for every core.
      evaluator: Whether the job has an evaluator (told to every task:
        `tf_config.EVALUATOR_ENV`).
    """

    module: str
    args: Tuple[str, ...]
    config: ClusterConfig
    cores: Optional[FrozenSet[int]]
    evaluator: bool = False

    def environment(self) -> Dict[str, str]:
        """The variables the task gets on top of its host's environment.

        >>> from estimator_dist.cluster.tf_config import make_local_cluster
        >>> config = make_local_cluster(1, [2001]).tasks[0]
        >>> sorted(TaskSpec("m", (), config, None).environment())
        ['ESTIMATOR_DIST_SUPERVISED', 'PYTHONUNBUFFERED', 'TF_CONFIG']
        >>> TaskSpec("m", (), config, None, evaluator=True).environment()[EVALUATOR_ENV]
        '1'
        """
        return {
            "TF_CONFIG": self.config.to_json(),
            "PYTHONUNBUFFERED": "1",
            console.SUPERVISED_ENV: "1",
            **({EVALUATOR_ENV: "1"} if self.evaluator else {}),
        }


class TaskProcess(Protocol):
    """What the launcher needs of a started task: `subprocess.Popen`'s part it uses.

    `stdout` yields the task's output lines (stderr included) until it
    exits, for people; `status` yields the lines of its status channel, one
    JSON event each (`status.EventReader` reads them), for the launcher's
    decisions. `wait` raises `subprocess.TimeoutExpired` on timeout. A process
    may also have `where` (text after `started <task> (pid N)`, such as
    ` on Ray node 10.0.0.2 (node 3f2a1c0d)`) and `lost` (why it ended without
    an exit of its own, such as its node's death), which the launcher shows.
    """

    pid: int
    stdout: Iterable[str]
    status: Iterable[str]

    def poll(self) -> Optional[int]: ...

    def wait(self, timeout: Optional[float] = None) -> int: ...

    def terminate(self) -> None: ...

    def kill(self) -> None: ...

    def send_signal(self, signum: int) -> None: ...


def start_local_task(spec: TaskSpec) -> subprocess.Popen:
    """Starts the task as a child of this process: its cores, its parent death signal.

    The task inherits the write end of a pipe, named by `status.STATUS_FD_ENV`;
    the returned process's `status` reads the other end.

    Call it from the main thread: the parent death signal follows the thread
    that started the child (see `cpus.task_process_setup`).
    """
    read_fd, write_fd = os.pipe()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", spec.module, *spec.args],
            env=dict(os.environ, **spec.environment(), **{status.STATUS_FD_ENV: str(write_fd)}),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            pass_fds=(write_fd,),
            preexec_fn=task_process_setup(spec.cores, os.getpid()),
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)  # The task holds it: the channel ends when the task does.
    process.status = open(read_fd, encoding="utf-8", errors="replace")
    return process
