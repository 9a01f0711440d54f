"""Supervise the tasks of a cluster: start them, watch their exits, decide what failed.

`Launcher` starts one process per task, logs their whole output to
`model_dir/logs/<task>.log`, echoes to the console, with the task as prefix,
what `console.ConsoleFilter` keeps of it (everything with `verbose`, or from a
task that does not print `console.PROTOCOL_LINE` among its first
`PROTOCOL_LINES` lines, and every line before it; of the training
tasks' progress lines, the chief's only, which carry the job's figures), and
waits for one attempt to end. What it decides on (the chief's first step, the
steps reached, the last step, why a task failed) it learns from each task's
status events (`estimator_dist.report.status`), never from the output, where a
user's code may print anything; a worker that lags the chief is named once.
`exits.RestartPolicy` decides whether the whole cluster is restarted after a
failed attempt. Both are independent of where the
tasks run: `estimator_dist.launch` drives them for a local cluster and for a
Ray cluster.

Where a task's process starts is its engine's (`engine.Engine`): a child of
the launcher on this machine (`local.LocalEngine`, holding the kernel's parent
death signal, so even a SIGKILL of the launcher ends every task at once), or a
Ray actor's proxy (`ray.engine.RayEngine`). A failed evaluator is restarted
alone, from the latest checkpoint, while training goes on: it holds no
training state. So is a frozen one (SIGSTOP, a paused VM, a process that
stopped running): every task sends a `status.Heartbeat` every
`status.HEARTBEAT_SECS`, and an evaluator whose status channel stays silent
for `EVALUATOR_SILENCE_SECS` is killed (SIGKILL), which restarts it alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Callable, Dict, List, Optional, Sequence

from estimator_dist.base import exit_codes, files
from estimator_dist.cluster.tf_config import CHIEF, EVALUATOR, PS, WORKER, ClusterConfig
from estimator_dist.launcher.engine import Engine
from estimator_dist.launcher.exits import LOST_PEER, Failure, describe_exit, exit_code_of
from estimator_dist.launcher.plan import Plan
from estimator_dist.launcher.task_start import TaskProcess, TaskSpec
from estimator_dist.report import console, status

#: Stands in the exits queue for "the chief ran its first step: start the evaluator".
_RELEASE = object()
#: Seconds a task's status channel may stay open after its exit (a child of the task holding
#: it): the events before the exit decide what the exit means. The Ray actor waits as long.
STATUS_DRAIN_SECS = status.DRAIN_SECS
#: The lines of a task's output `console.PROTOCOL_LINE` may come among: a warning Python prints
#: at start-up (a deprecation, a site package's) may precede it.
PROTOCOL_LINES = 20
#: A worker whose examples/s at the chief's step is below this share of the chief's straggles.
SLOW_RATE_SHARE = 0.5


#: Seconds a task's lost-peer exit (150) waits for the exit of the peer it lost.
ROOT_CAUSE_SECS = 2.0
#: Seconds of silence on a running evaluator's status channel (no heartbeat, no event) after
#: which it is frozen: killed, then restarted alone. Its heartbeat comes every 2 s from the
#: start of the task's main, before TensorFlow's import (0.7-0.9 s after the process starts).
EVALUATOR_SILENCE_SECS = 30.0
#: Seconds between two looks for a silent evaluator.
SILENCE_CHECK_SECS = 1.0
#: Why a silent evaluator was killed: the cause of its exit.
SILENT_EVALUATOR = (
    "it sent nothing on its status channel for {seconds:.0f} s (no heartbeat, expected every "
    "{heartbeat:g} s): frozen (stopped by a signal, a paused machine) or hung in start-up; "
    "killed"
)


def lags(worker: status.Progress, chief: status.Progress) -> Optional[str]:
    """How a worker's progress lags the chief's, or None when it keeps up.

    It lags when its step is more than one progress interval behind the
    chief's, or when at the same step its examples/s are below
    `SLOW_RATE_SHARE` of the chief's.

    >>> chief = status.Progress(400, 400, 0.1, 8000.0, 100, 1.0)
    >>> lags(status.Progress(200, 400, 0.3, 8000.0, 100, 1.0), chief)
    'at step 200 while the chief is at step 400 (a progress line every 100 steps)'
    >>> lags(status.Progress(400, 400, 0.1, 3000.0, 100, 1.0), chief)
    'at step 400 at 3,000 examples/s, the chief at 8,000 examples/s'
    >>> lags(status.Progress(300, 400, 0.2, 7900.0, 100, 1.0), chief) is None
    True
    """
    if chief.step - worker.step > chief.interval_steps:
        return (
            f"at step {worker.step} while the chief is at step {chief.step} "
            f"(a progress line every {chief.interval_steps} steps)"
        )
    rates = (worker.examples_per_sec, chief.examples_per_sec)
    if worker.step == chief.step and None not in rates and rates[0] < SLOW_RATE_SHARE * rates[1]:
        return (
            f"at step {worker.step} at {rates[0]:,.0f} examples/s, the chief at "
            f"{rates[1]:,.0f} examples/s"
        )
    return None


@dataclasses.dataclass
class Task:
    """One task: its configuration, and its process and log file once started.

    Attributes:
      detail: The cause the task gave for its exit (`status.Exiting`), if any.
      progress: The task's latest progress event, if any.
      straggled: Whether the launcher said that this task lags the chief.
      heard: When (the launcher's clock) the task last sent an event, or was started.
      silenced: Whether the launcher killed it for its silence.
      exiting: Whether the task said it exits (`status.Exiting`): its heartbeat stops while
        the interpreter shuts TensorFlow down, which took over 30 s on a loaded machine.
      reason: The code the task gave with its exit (`status.Exiting.reason`), if any.
    """

    config: ClusterConfig
    process: Optional[TaskProcess]
    log: Optional[IO[str]]
    detail: Optional[str] = None
    progress: Optional[status.Progress] = None
    straggled: bool = False
    heard: float = 0.0
    silenced: bool = False
    exiting: bool = False
    reason: Optional[str] = None

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
      plan: What every task runs, the job's model_dir (where `logs/` goes) and
        how messages name its last step.
      engine: Where the tasks run: it starts each task's process.
      started: Monotonic time the launcher started, for the time to the
        first training step.
      out: Where prefixed task output is printed.
      verbose: Echo every line of every task, not only what a person needs.
      clock: Monotonic clock of the tasks' silences, replaceable in tests.

    Attributes:
      checkpoint_step: Returns the global step of the latest checkpoint.
    """

    def __init__(
        self,
        plan: Plan,
        engine: Engine,
        started: Optional[float] = None,
        out: IO[str] = sys.stdout,
        verbose: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._plan = plan
        self._clock = clock
        self._engine = engine
        self._verbose = verbose
        self.checkpoint_step: Callable[[], int] = plan.checkpoint_step
        #: The last step a task reported (a `StopStep` event), for jobs that do not name it.
        self.reported_steps: Optional[int] = None
        self._started = time.monotonic() if started is None else started
        self._out = out
        self._print_lock = threading.Lock()
        self._exits: queue.Queue = queue.Queue()
        self._spawn_lock = threading.Lock()
        self._held: List[Task] = []
        self._stopping = False
        self._attempt = 0
        self.tasks: List[Task] = []
        self.failed_at: Optional[float] = None
        #: The highest global step a training task reported (`FirstStep`, `Progress` events),
        #: for the steps a failure lost.
        self.last_step_seen = 0
        #: Evaluator restarts, in all attempts.
        self.evaluator_restarts: List[str] = []
        #: The chief's first step (its `FirstStep` event) in each attempt: where training resumed.
        self.resumed_steps: Dict[int, int] = {}

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
        logs = self._plan.results.local_dir  # model_dir, or a local directory for a URL.
        os.makedirs(os.path.join(logs, console.LOG_DIR), exist_ok=True)
        console.keep_log(logs, "launcher")
        self._attempt = attempt
        self._exits = queue.Queue()
        self._stopping = False
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
        plan = self._plan
        task.heard, task.silenced, task.exiting = self._clock(), False, False
        evaluator = any(t.config.task_type == EVALUATOR for t in self.tasks)
        spec = TaskSpec(plan.module, plan.args, config, None, evaluator=evaluator)
        task.process = self._engine.start_task(spec)
        path = os.path.join(plan.results.local_dir, console.LOG_DIR, f"{config.role}.log")
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
        on = getattr(task.process, "where", "")
        self.say(f"started {task.name} (pid {task.process.pid}){on} TF_CONFIG={config.to_json()}")

    def _pump(self, task: Task, exits: queue.Queue) -> None:
        """Logs and echoes the task's output; its status events, read beside, decide."""
        events = threading.Thread(target=self._follow, args=(task, exits), daemon=True)
        events.start()
        prefix = f"[{task.name}] "
        shown: Optional[console.ConsoleFilter] = None
        protocol = False  # Whether the task said its lines follow the console's conventions.
        try:
            for number, line in enumerate(task.process.stdout):
                self._log(task, line)
                if (
                    not protocol
                    and number < PROTOCOL_LINES
                    and line.rstrip("\n") == console.PROTOCOL_LINE
                ):
                    protocol = True  # Lines before it were shown whole; the filter starts here.
                    shown = None if self._verbose else console.ConsoleFilter()
                    continue
                echoed = line.rstrip("\n") if shown is None else shown(line)
                if echoed is not None and not (
                    shown is not None and self._repeats_the_chief(task, echoed)
                ):
                    with self._print_lock:
                        self._out.write(f"{prefix}{echoed}\n")
                        self._out.flush()
        finally:
            self._close_log(task)
            code = task.process.wait()
            events.join(STATUS_DRAIN_SECS)
            task.detail = getattr(task.process, "lost", None) or task.detail
            exits.put((task, code))

    @staticmethod
    def _repeats_the_chief(task: Task, shown: str) -> bool:
        """Whether `shown` is a worker's line that the chief's says for the job.

        Its progress line and its first step; a lagging worker gets a line of its own.
        """
        repeats = console.REPEATS_THE_CHIEF.match(shown) is not None
        return task.config.task_type == WORKER and repeats

    def _follow(self, task: Task, exits: queue.Queue) -> None:
        """Reads the task's status channel until it ends, acting on each event."""

        def malformed(line: str, why: str) -> None:
            self.say(f"{task.name} sent a status line that is no event ({why}), ignored: {line!r}")

        try:
            for event in status.EventReader(malformed).read(task.process.status):
                self._on_event(task, event, exits)
        finally:
            close = getattr(task.process.status, "close", None)
            if close is not None:
                close()

    def _on_event(self, task: Task, event: status.Event, exits: queue.Queue) -> None:
        """What the launcher learns from one of a task's events."""
        task.heard = self._clock()
        training = task.config.task_type in (CHIEF, WORKER)
        if isinstance(event, (status.FirstStep, status.Progress)) and training:
            self.last_step_seen = max(self.last_step_seen, event.step)
        if isinstance(event, status.FirstStep) and task.config.task_type == CHIEF:
            self.resumed_steps.setdefault(self._attempt, event.step)
            if self.failed_at is not None:
                self.say(
                    f"training resumed {time.monotonic() - self.failed_at:.1f} s after the "
                    "failure was detected"
                )
            else:
                self.say(
                    f"first training step {time.monotonic() - self._started:.1f} s after the "
                    "launcher started"
                )
            exits.put((_RELEASE, None))
        elif isinstance(event, status.Progress) and training:
            task.progress = event
            self._say_stragglers()
        elif isinstance(event, status.StopStep) and event.how != status.PREEMPTION:
            self.reported_steps = event.step
            # A program's estimator may train below the job's model_dir; a job on storage
            # keeps reading the URL's state (what the tasks restore), not a task's copy.
            reported = event.model_dir
            if reported and reported != self._plan.results.where and "://" not in reported:
                self.checkpoint_step = lambda: files.checkpoint_step(reported)
        elif isinstance(event, status.Exiting):
            task.exiting = True
            task.reason = event.reason
            if event.cause:
                task.detail = event.cause.strip()

    @property
    def nothing_evaluated(self) -> bool:
        """Whether the evaluator said the program evaluates nothing (`status.NO_EVALUATION`)."""
        return any(task.reason == status.NO_EVALUATION for task in self.tasks)

    def _say_stragglers(self) -> None:
        """Says, once each, which workers lag the chief (`lags`)."""
        chief = next((t for t in self.tasks if t.config.task_type == CHIEF), None)
        if chief is None or chief.progress is None:
            return
        for worker in self.tasks:
            if worker.config.task_type != WORKER or worker.progress is None or worker.straggled:
                continue
            lag = lags(worker.progress, chief.progress)
            if lag is not None:
                worker.straggled = True
                self.say(f"{worker.name} lags the chief: {lag}")

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
        silence_secs: float = EVALUATOR_SILENCE_SECS,
    ) -> Optional[Failure]:
        """Waits for this attempt to end.

        Args:
          deadline: `time.monotonic()` value to give up at, or None.
          train_steps: The last step; a training task ending below it failed.
            None: the step the tasks report in `StopStep` events (`reported_steps`).
          finish_timeout: Seconds the others may take after the first
            training task finished.
          root_cause_secs: Seconds a lost-peer exit (150) waits for the exit of
            the task whose loss it reports.
          evaluator_restarts: How many times, over all attempts, an evaluator
            that failed with a retryable code is restarted alone while training
            goes on; past that, or for a code of 1 to 127, its failure fails the
            attempt.
          silence_secs: Seconds a running evaluator may send nothing (no
            heartbeat) before it is killed, which counts as a retryable failure.

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
            if any(t.config.task_type == EVALUATOR for t in pending.values()):
                timeout = (
                    SILENCE_CHECK_SECS if timeout is None else min(timeout, SILENCE_CHECK_SECS)
                )
            try:
                task, code = self._exits.get(timeout=timeout)
            except queue.Empty:
                self._kill_silent_evaluator(silence_secs)
                if not limits or time.monotonic() < min(limits):
                    continue
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

    def _kill_silent_evaluator(self, silence_secs: float) -> None:
        """Kills a running evaluator silent for `silence_secs`; its exit then restarts it.

        A frozen process sends no heartbeat, and a stopped one would never
        exit: SIGKILL ends it even while stopped. One that said it exits is past
        its work; the bound after the training tasks finish covers its exit.
        """
        now = self._clock()
        for task in self.tasks:
            silent = now - task.heard
            if (
                task.config.task_type != EVALUATOR
                or task.process is None
                or task.silenced
                or task.exiting
                or silent < silence_secs
                or task.process.poll() is not None
            ):
                continue
            task.silenced = True
            task.detail = SILENT_EVALUATOR.format(seconds=silent, heartbeat=status.HEARTBEAT_SECS)
            task.process.kill()

    def _restart_evaluator(self, task: Task, failure: Failure) -> None:
        """Starts a failed evaluator again, alone; it resumes from the latest checkpoint."""
        step = self.checkpoint_step()
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
            reason = task.reason if code > 0 else describe_exit(code)
            cause = f"{task.name} {describe_exit(code)}{detail}"
            return Failure(cause, exit_code_of(code), task.name, reason)
        if task.config.task_type == PS:
            return Failure(
                f"{task.name} exited before training ended", exit_codes.STALLED, task.name
            )
        if task.config.task_type not in (CHIEF, WORKER):
            return None
        # A step the tasks reported (a script's max_steps, or where early stopping ended
        # training) comes before the job's own.
        last = self.reported_steps if self.reported_steps is not None else train_steps
        if last is None and task.reason == status.NO_TRAINING:
            return None  # Its program only evaluated, exported or predicted.
        if last is None:
            return Failure(
                f"{task.name} exited with code 0 without saying which step training ends at "
                "(it never called train_and_evaluate)",
                exit_codes.FAILURE,
                task.name,
            )
        step = self.checkpoint_step()
        if step < last:
            return Failure(
                f"{task.name} exited with code 0 while the latest checkpoint is at step {step}, "
                f"before {self._plan.steps_name}={last}: its training input ran out. Make the "
                f"training input repeat (dataset.repeat()) and let {self._plan.steps_name} end "
                "training; a restart would run out at the same place",
                exit_codes.INPUT_EXHAUSTED,
                task.name,
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
                return dataclasses.replace(
                    failure, cause=failure.cause + LOST_PEER.format(reporter=reporter.name)
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
