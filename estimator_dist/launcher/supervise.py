"""Supervise the tasks of a cluster: start them, watch their exits, decide what failed.

`Launcher` starts one process per task, logs their whole output to
`model_dir/logs/<task>.log`, echoes to the console, with the task as prefix,
what `console.ConsoleFilter` keeps of it (everything with `verbose`, or from a
task that does not print `console.PROTOCOL_LINE` first), and waits for one
attempt to end; `exits.RestartPolicy` decides whether the whole
cluster is restarted after a failed attempt. Both are independent of where the
tasks run: `estimator_dist.launch` drives them for a local cluster and for a
Ray cluster.

How a task's process starts is the caller's: `task_start.start_local_task`
by default (a child of the launcher, which holds the kernel's parent death
signal, so even a SIGKILL of the launcher ends every task at once), or a Ray
actor's proxy (`estimator_dist.launcher.ray.engine`). A failed evaluator is restarted
alone, from the latest checkpoint, while training goes on: it holds no
training state.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Callable, List, Optional, Sequence

from estimator_dist.base import console, exit_codes
from estimator_dist.base.cluster import CHIEF, EVALUATOR, PS, WORKER, ClusterConfig
from estimator_dist.base.cpus import split_cores
from estimator_dist.launcher.exits import LOST_PEER, Failure, describe_exit, exit_code_of
from estimator_dist.launcher.task_start import TaskProcess, TaskSpec, start_local_task

#: Stands in the exits queue for "the chief ran its first step: start the evaluator".
_RELEASE = object()
#: Training progress lines of a task: LoggingTensorHook's and the package's own; not a
#: preemption decision's step, which is ahead of every step run.
_STEP_LINE = re.compile(r"(?:\bstep = |(?<!stop at )(?<!stops at )global step )(\d+)")


#: What a task of an `estimator_dist.train` job runs.
TRAIN_MODULE = "estimator_dist.train"
#: Seconds a task's lost-peer exit (150) waits for the exit of the peer it lost.
ROOT_CAUSE_SECS = 2.0
#: The one line a task prints when it fails on purpose; its cause joins the launcher's.
_FAILURE_LINE = re.compile(
    r"(?:estimator_dist: task \S+ failed \(exit \d+\)|estimator_dist\.\w+: error): (.*)"
)
#: The line a script task prints with the step training ends at.
_MAX_STEPS_LINE = re.compile(re.escape(console.MAX_STEPS_MARKER) + r"(\d+)")


@dataclasses.dataclass
class Task:
    """One task: its configuration, and its process and log file once started.

    Attributes:
      detail: The cause in the last failure line the task printed, if any.
    """

    config: ClusterConfig
    process: Optional[TaskProcess]
    log: Optional[IO[str]]
    detail: Optional[str] = None

    @property
    def name(self) -> str:
        """`chief`, `evaluator`, or `worker-<i>` / `ps-<i>`."""
        config = self.config
        return config.task_type if config.task_type in (CHIEF, EVALUATOR) else config.role


class Launcher:
    """Starts the tasks of a cluster and supervises one attempt at a time.

    Local tasks stay in the launcher's process group, so Ctrl-C in a terminal,
    or a signal to the group, reaches every one of them too.

    Args:
      train_args: Arguments of `module`, the same on every task.
      model_dir: The job's model_dir, where `logs/` goes.
      checkpoint_step: Returns the global step of the latest checkpoint.
      pin_cores: Run each training task on its own share of the cores.
      started: Monotonic time the launcher started, for the time to the
        first training step.
      out: Where prefixed task output is printed.
      module: What each task runs: `estimator_dist.train`, or
        `estimator_dist.script` for a legacy script.
      steps_name: How messages name the setting of the last step.
      verbose: Echo every line of every task, not only what a person needs.
      start_task: Starts one task's process (`task_start.start_local_task`).
    """

    def __init__(
        self,
        train_args: Sequence[str],
        model_dir: str,
        checkpoint_step: Callable[[], int],
        pin_cores: bool = False,
        started: Optional[float] = None,
        out: IO[str] = sys.stdout,
        module: str = TRAIN_MODULE,
        steps_name: str = "--train_steps",
        verbose: bool = False,
        start_task: Callable[[TaskSpec], TaskProcess] = start_local_task,
    ) -> None:
        self._start_task = start_task
        self._module = module
        self._verbose = verbose
        self._steps_name = steps_name
        #: The last step a script task printed, for jobs that do not name it.
        self.reported_steps: Optional[int] = None
        self._train_args = list(train_args)
        self._model_dir = model_dir
        self._checkpoint_step = checkpoint_step
        self._pin_cores = pin_cores
        self._started = time.monotonic() if started is None else started
        self._out = out
        self._print_lock = threading.Lock()
        self._exits: queue.Queue = queue.Queue()
        self._spawn_lock = threading.Lock()
        self._held: List[Task] = []
        self._stopping = False
        self._attempt = 0
        self._cores: dict = {}
        self.tasks: List[Task] = []
        self.failed_at: Optional[float] = None
        #: The highest global step a training task printed, for the steps a failure lost.
        self.last_step_seen = 0
        #: Evaluator restarts, in all attempts.
        self.evaluator_restarts: List[str] = []

    def say(self, message: str) -> None:
        """Prints a launcher line."""
        with self._print_lock:
            self._out.write(f"[launcher] {message}\n")
            self._out.flush()

    def start(self, configs: Sequence[ClusterConfig], attempt: int) -> None:
        """Starts one process per task configuration, the evaluator's later.

        The evaluator has nothing to do before the first checkpoint, so it is
        held back until the chief has run its first step (or a training task
        finished), and does not compete for cores while the cluster starts.
        """
        os.makedirs(os.path.join(self._model_dir, console.LOG_DIR), exist_ok=True)
        console.keep_log(self._model_dir, "launcher")
        self._attempt = attempt
        self._exits = queue.Queue()
        self._stopping = False
        training = [c.role for c in configs if c.task_type in (CHIEF, WORKER)]
        self._cores = dict(zip(training, split_cores(len(training)))) if self._pin_cores else {}
        self.tasks = [Task(config, None, None) for config in configs]
        self._held = [t for t in self.tasks if t.config.task_type == EVALUATOR]
        for task in self.tasks:
            if task.config.task_type != EVALUATOR:
                self._spawn(task)

    def release(self) -> None:
        """Starts the tasks `start` held back (the evaluator), once, unless stopping.

        Called from the main thread only: see `cpus.task_process_setup`.
        """
        with self._spawn_lock:
            if self._stopping:
                return
            held, self._held = self._held, []
            for task in held:
                self._spawn(task)

    def _spawn(self, task: Task) -> None:
        config = task.config
        cores = self._cores.get(config.role)
        task.process = self._start_task(
            TaskSpec(self._module, tuple(self._train_args), config, cores)
        )
        path = os.path.join(self._model_dir, console.LOG_DIR, f"{config.role}.log")
        try:
            # Line-buffered: each line reaches the file when it is printed, so a refused write
            # is seen, and said, at the line it refused, not at close or never.
            task.log = open(path, "a", buffering=1)
        except OSError as error:
            self.say(
                f"cannot write {path} ({error.strerror}); the output of {task.name} "
                "goes on here only"
            )
        self._log(task, f"===== attempt {self._attempt} =====\n")
        threading.Thread(target=self._pump, args=(task, self._exits), daemon=True).start()
        on = f" on cores {','.join(map(str, sorted(cores)))}" if cores else ""
        on += getattr(task.process, "where", "")
        self.say(f"started {task.name} (pid {task.process.pid}){on} TF_CONFIG={config.to_json()}")

    def _pump(self, task: Task, exits: queue.Queue) -> None:
        prefix = f"[{task.name}] "
        shown: Optional[console.ConsoleFilter] = None
        try:
            for line in task.process.stdout:
                self._log(task, line)
                if line.rstrip("\n") == console.PROTOCOL_LINE and not self._verbose:
                    shown = console.ConsoleFilter()
                echoed = line.rstrip("\n") if shown is None else shown(line)
                if echoed is not None and echoed != console.PROTOCOL_LINE:
                    with self._print_lock:
                        self._out.write(f"{prefix}{echoed}\n")
                        self._out.flush()
                failed = _FAILURE_LINE.search(line)
                if failed:
                    task.detail = failed.group(1).strip()
                steps = _MAX_STEPS_LINE.search(line)
                if steps:
                    self.reported_steps = int(steps.group(1))
                first_step = task.config.task_type == CHIEF and exit_codes.FIRST_STEP_MARKER in line
                if first_step and self.failed_at is not None:
                    self.say(
                        f"training resumed {time.monotonic() - self.failed_at:.1f} s after the "
                        "failure was detected"
                    )
                elif first_step:
                    self.say(
                        f"first training step {time.monotonic() - self._started:.1f} s after the "
                        "launcher started"
                    )
                if first_step:
                    exits.put((_RELEASE, None))
                progress = _STEP_LINE.search(line)
                if progress and task.config.task_type in (CHIEF, WORKER):
                    self.last_step_seen = max(self.last_step_seen, int(progress.group(1)))
        finally:
            self._close_log(task)
            code = task.process.wait()
            task.detail = getattr(task.process, "lost", None) or task.detail
            exits.put((task, code))

    def _log(self, task: Task, line: str) -> None:
        """Appends `line` to the task's log file; after a failed write, says so once and stops."""
        if task.log is None:
            return
        try:
            task.log.write(line)
        except OSError as error:
            self._refused(task, error)

    def _refused(self, task: Task, error: OSError) -> None:
        """Says that the task's log refused a write, once, and stops writing it."""
        self.say(
            f"cannot write {task.log.name} ({error.strerror}); the output of {task.name} "
            "goes on here only"
        )
        with contextlib.suppress(OSError):  # The same refused line, flushed again.
            task.log.close()
        task.log = None

    def _close_log(self, task: Task) -> None:
        if task.log is not None:
            try:
                task.log.close()
            except OSError as error:  # A last line without a newline found no room.
                self._refused(task, error)
            task.log = None

    def supervise(
        self,
        deadline: Optional[float],
        train_steps: Optional[int],
        finish_timeout: float,
        root_cause_secs: float = ROOT_CAUSE_SECS,
        evaluator_restarts: int = 0,
    ) -> Optional[Failure]:
        """Waits for this attempt to end.

        Args:
          deadline: `time.monotonic()` value to give up at, or None.
          train_steps: The last step; a training task ending below it failed.
            None: the step the tasks print (`reported_steps`).
          finish_timeout: Seconds the others may take after the first
            training task finished.
          root_cause_secs: Seconds a lost-peer exit (150) waits for the exit of
            the task whose loss it reports.
          evaluator_restarts: How many times, over all attempts, an evaluator
            that failed with a retryable code is restarted alone while training
            goes on; past that, or for a code of 1 to 127, its failure fails the
            attempt.

        Returns:
          None when every training task and the evaluator finished after the
          last step; otherwise the first `Failure`, or the one behind a
          lost-peer exit.
        """
        pending = {id(t): t for t in self.tasks if t.config.task_type != PS}
        finish_by: Optional[float] = None
        while pending:
            limits = [t for t in (deadline, finish_by) if t is not None]
            timeout = max(0.0, min(limits) - time.monotonic()) if limits else None
            try:
                task, code = self._exits.get(timeout=timeout)
            except queue.Empty:
                waiting = ", ".join(t.name for t in pending.values())
                if finish_by is not None and time.monotonic() >= finish_by:
                    return Failure(
                        f"{waiting} did not finish within {finish_timeout:g} s after the "
                        "first training task finished",
                        exit_codes.STALLED,
                    )
                return Failure(
                    f"timed out (--timeout_secs) waiting for {waiting}", exit_codes.FAILURE
                )
            if task is _RELEASE:
                self.release()
                continue
            failure = self._failure_of(task, code, train_steps)
            evaluator = task.config.task_type == EVALUATOR
            if failure is not None and evaluator and failure.retryable:
                if len(self.evaluator_restarts) < evaluator_restarts:
                    self._restart_evaluator(task, failure)
                    continue
            elif failure is not None and code == exit_codes.PEER_FAILURE:
                return self._cause_behind(task, failure, train_steps, root_cause_secs)
            if failure is not None:
                return failure
            if task.config.task_type in (CHIEF, WORKER) and finish_by is None:
                finish_by = time.monotonic() + finish_timeout
                self.release()
            del pending[id(task)]
            self.say(f"{task.name} finished")
        return None

    def _restart_evaluator(self, task: Task, failure: Failure) -> None:
        """Starts a failed evaluator again, alone; it resumes from the latest checkpoint."""
        step = self._checkpoint_step()
        self.evaluator_restarts.append(f"{failure.cause} (checkpoint step {step})")
        self.say(
            f"{failure.cause}; restarting the evaluator alone from checkpoint step {step} "
            f"(evaluator restart {len(self.evaluator_restarts)}); training goes on"
        )
        task.detail = None
        self._spawn(task)

    def _failure_of(self, task: Task, code: int, train_steps: Optional[int]) -> Optional[Failure]:
        """The failure one task's exit means, or None if it finished its part."""
        if code != 0:
            detail = f": {task.detail.rstrip('.')}" if task.detail else ""
            return Failure(f"{task.name} {describe_exit(code)}{detail}", exit_code_of(code))
        if task.config.task_type == PS:
            return Failure(f"{task.name} exited before training ended", exit_codes.STALLED)
        if task.config.task_type not in (CHIEF, WORKER):
            return None
        # A step the tasks printed (a script's max_steps, or where early stopping ended training)
        # comes before the job's own.
        last = self.reported_steps if self.reported_steps is not None else train_steps
        if last is None:
            return Failure(
                f"{task.name} exited with code 0 without saying which step training ends at "
                "(it never called train_and_evaluate)",
                exit_codes.FAILURE,
            )
        step = self._checkpoint_step()
        if step < last:
            return Failure(
                f"{task.name} exited with code 0 while the latest checkpoint is at step {step}, "
                f"before {self._steps_name}={last}: its training input ran out. Make the "
                f"training input repeat (dataset.repeat()) and let {self._steps_name} end "
                "training; a restart would run out at the same place",
                exit_codes.INPUT_EXHAUSTED,
            )
        return None

    def _cause_behind(
        self, reporter: Task, lost_peer: Failure, train_steps: Optional[int], within: float
    ) -> Failure:
        """Waits up to `within` seconds for the failure that made `reporter` lose a peer.

        A task that leaves early aborts the collectives of the others, and one
        of them may exit 150 before the leaving task's own exit is seen.
        """
        end = time.monotonic() + within
        while True:
            try:
                task, code = self._exits.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                return lost_peer
            if task is _RELEASE or task.config.task_type == EVALUATOR:
                continue
            failure = self._failure_of(task, code, train_steps)
            if failure is not None and code != exit_codes.PEER_FAILURE:
                return Failure(
                    failure.cause + LOST_PEER.format(reporter=reporter.name), failure.exit_code
                )

    def stop(self, grace_secs: float) -> None:
        """Stops every task still running: SIGTERM, then SIGKILL after `grace_secs`."""
        with self._spawn_lock:
            self._stopping = True
        running = [t for t in self.tasks if t.process is not None and t.process.poll() is None]
        for task in running:
            task.process.terminate()
            # A stopped task (SIGSTOP, a paused VM) handles SIGTERM only once continued.
            task.process.send_signal(signal.SIGCONT)
        end = time.monotonic() + grace_secs
        for task in running:
            try:
                task.process.wait(timeout=max(0.0, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                task.process.kill()
                task.process.wait()
