"""Make a stuck or diverging task fail fast with a distinct exit code.

TensorFlow 2.15 multi-worker Estimator training does not end by itself when
something goes wrong (tests/estimator_dist/faults_test.py shows each case).
`Watchdog` runs a thread beside training and ends the process, with a
message naming the task, the step and the cause, when:

* no training step completes before the start-up deadline (exit 151), naming
  the peers that cannot be reached;
* session creation (restore, `init_op`, `local_init_op`, the hooks'
  `after_create_session`) and the first step, which meets every peer in its
  first collective, take longer than the stall timeout from the graph's
  completion (exit 157); every `rendezvous.WAIT_NOTICE_SECS` of it, a line
  names the peers that cannot be reached (or says every peer accepts
  connections);
* no training step completes for the stall timeout (exit 152);
* after the training loop ended, the end of training (the final checkpoint,
  the session's close, in one process the final evaluation and the export)
  makes no progress for the stall timeout (exit 158): an evaluation batch is
  progress, as it is during training;
* TensorFlow re-creates the session after training started (exit 153);
* this task's training loop ends before the last step, as when its input
  runs out (exit 6, not retried): the others would wait for its share of
  every later step. It fails before its session closes (on the chief, before
  the end-of-training checkpoint), so the others see a lost peer. A single
  process, with no one waiting for it, only warns, as Estimator stops too.

In a single process evaluation batches count as progress (a slow evaluation
is no stall); one still reading after 1, 2, 4 ... stall timeouts is warned
about, naming --eval_steps, but not ended: large inputs take long.

`estimator_dist.guards.evaluator_watchdog` watches the evaluator (exit 8 or 152);
it uses `fail`, `unreachable` and `EVAL_UNENDING_MESSAGE` from here. `arm_fail_fast()` makes
MonitoredSession treat the errors it would silently recover from
(AbortedError, UnavailableError) as fatal once the first step is done; they
reach `estimator_dist.train`, which exits 150. Before the first step the
recovery stays, so a peer that starts late is still waited for, within the
bound of session creation.

The process ends with `os._exit`: the main thread may be blocked inside a
collective op and would never see an exception. Training steps pay nothing:
the hook fetches the global step only on the first step and on the first
step after each check of the thread (every 0.5-5 s); an evaluation batch
only bumps a counter and sets a flag the thread reads.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import threading
import time
from typing import Any, Callable, Mapping, Optional, Tuple

import tensorflow as tf
from absl import logging

from estimator_dist.base import exit_codes, files
from estimator_dist.guards.rendezvous import WaitNotice
from estimator_dist.guards.watchdog_hooks import EvaluationHook, StepHook
from estimator_dist.report import status
from estimator_dist.storage.task import flush_before_exit
from estimator_dist.tf_runtime import patches

FAILURE_PREFIX = exit_codes.FAILURE_PREFIX
#: Why a cluster task whose training loop ended early fails, and the fix. `last` names the
#: last step as the user set it (`LastStep.named`), `fix` how to make the input last.
INPUT_EXHAUSTED_MESSAGE = (
    "training on this task ended at global step {step}, before {last}: its input ran out, "
    "and the other tasks cannot finish a step without it. A restart would run out at the same "
    "place, so the job is not retried. {fix}"
)
#: Logged by a single process whose training loop ended early.
INPUT_ENDED_ALONE = (
    "Training ended at global step {step}, before {last}: the training input ran out. One "
    "process stops there, as TensorFlow does; on several workers the job would fail (exit 6). "
    "{fix}"
)


@dataclasses.dataclass(frozen=True)
class LastStep:
    """The step training ends at, and how messages name it to the user who set it.

    Attributes:
      step: The global step.
      named: The setting it came from, as the user wrote it (`--train_steps=400`,
        `TrainSpec's max_steps=1578.125`).
      fix: How to make an input that ran out before it last.

    >>> LastStep(400, "--train_steps=400", "Make the input repeat.").step
    400
    """

    step: int
    named: str
    fix: str


#: Why the evaluator fails when an evaluation is still reading after training ended.
EVAL_UNENDING_MESSAGE = (
    "the evaluation of {checkpoint} has run {seconds:.0f} s and read {batches} batches without "
    "ending, while no new checkpoint came for {stall:g} s and the chief ({chief}) is "
    "unreachable: training has ended, and the evaluation input does not end (it repeats, or "
    "its size is unknown). Pass --eval_steps to bound each evaluation."
)
#: Warned in a single process when an evaluation is still reading after the stall timeout.
EVAL_LONG_ALONE = (
    "estimator_dist: the evaluation of the checkpoint of global step {step} has run "
    "{seconds:.0f} s and read {batches} batches, and training waits for it to end. If its "
    "input never ends (a generator or a loop with no end), no evaluation ends: pass "
    "--eval_steps to bound each evaluation."
)
#: Why a task fails when its session creation or first step does not end (exit 157).
SESSION_HUNG_MESSAGE = (
    "{what} within {bound:g} s (--stall_timeout) after its graph was built{step} ({where}). "
    "A hang there does not end by itself; restart the whole job from its latest checkpoint. "
    "Raise --stall_timeout if restoring the checkpoint takes longer."
)
#: Said every WAIT_NOTICE_SECS of session creation when every peer accepts connections.
SESSION_WAIT_IDLE = (
    "estimator_dist: task {role} in session creation and its first step for {waited:.0f} s of "
    "at most {bound:g} s; every peer accepts connections"
)
#: Why a task fails when the end of training makes no progress (exit 158).
FINAL_PHASE_MESSAGE = (
    "the end of training made no progress for {seconds:.0f} s (stall timeout {stall:g} s) "
    "after the training loop ended at global step {step}: {phase}. A hung collective or a "
    "frozen peer does not end by itself; restart the job from its latest checkpoint. Raise "
    "--stall_timeout if this phase is this slow on purpose."
)


def fail(role: str, code: int, cause: str, reason: Optional[str] = None) -> None:
    """Logs one line naming the task and cause, tells the launcher, ends the process with `code`.

    Args:
      role: The task, e.g. `worker-1`.
      code: Its exit code.
      cause: The line for people.
      reason: The failure's kind, for the launcher's decisions (the error's
        class name); by default the exit code's name.
    """
    message = f"{FAILURE_PREFIX.format(role=role)} (exit {code}): {cause}"
    logging.error(message)
    sys.stderr.write(message + "\n")
    sys.stderr.flush()
    sys.stdout.flush()
    kind = reason or exit_codes.name_of(code)
    status.emit(status.Exiting(exit_code=code, cause=cause, reason=kind))
    flush_before_exit()  # A job's storage URL gets the checkpoint saved before this exit.
    os._exit(code)


def arm_fail_fast() -> None:
    """Stops MonitoredSession from silently re-creating a session after a peer error."""
    patches.stop_session_recovery()


def unreachable(peers: Mapping[str, str], timeout: float = 2.0) -> list:
    """Returns the names of the peers whose address refuses or ignores a TCP connect."""
    missing = []
    for name, address in peers.items():
        host, _, port = address.rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                pass
        except OSError:
            missing.append(f"{name} ({address})")
    return missing


class Watchdog:
    """Ends this task when training does not start, stalls, silently recovers, or evaluates forever.

    Args:
      role: This task's name, e.g. `worker-1`.
      peers: Name to address of the other tasks, probed when start-up fails.
      startup_timeout: Seconds from `start()` to the first completed step.
      stall_timeout: Seconds without a completed step afterwards; also
        the bound of session creation and the first step (from the graph's
        completion), and of the end of training without progress.
      last_step: The step every task trains to; a training loop that ends
        below it is fatal. None when a task may stop alone.
      alone: This is a single process: a loop ending below `last_step` is
        only a warning, and no peers are probed.
      stopped_on_purpose: Returns whether training is being stopped on
        purpose (a preemption, early stopping, a hook of the program), which
        ends the loop below `last_step`.
      exit_fn: Called as `exit_fn(role, code, cause)`; `fail` by default.
      clock: Monotonic clock, replaceable in tests.
      model_dir: The job's model_dir: a stall names at least its latest
        checkpoint's step (`files.latest_known_step`).

    Attributes:
      due: Whether the hook fetches the global step at its next step: set by
        each `check`, cleared by `progress`, a plain flag with no lock.
    """

    def __init__(
        self,
        role: str,
        peers: Mapping[str, str],
        startup_timeout: float,
        stall_timeout: float,
        last_step: Optional[LastStep] = None,
        exit_fn: Callable[[str, int, str], None] = fail,
        clock: Callable[[], float] = time.monotonic,
        alone: bool = False,
        stopped_on_purpose: Callable[[], bool] = lambda: False,
        model_dir: Optional[str] = None,
    ) -> None:
        self._role = role
        self._model_dir = model_dir
        self._alone = alone
        self._stopped_on_purpose = stopped_on_purpose
        self._peers = dict(peers)
        self._startup_timeout = startup_timeout
        self._stall_timeout = stall_timeout
        self._last_step = last_step
        self._exit = exit_fn
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._started_at = clock()
        self._last_progress: Optional[float] = None
        self._step: Optional[int] = None
        self._sessions = 0
        # Plain flags, set and cleared without the lock: `due`, and whether an
        # evaluation batch (or a step in flight) ran since the last check.
        self.due = True
        self._alive = False
        self._evaluations = EvaluationHook(clock, self.alive)
        self._eval_warning = (0.0, 0.0)  # (start of the evaluation warned about, next warning)
        # The phases after start-up, with when each began: session creation (from the
        # graph's completion), the first step, the end of training.
        self._session_began: Optional[float] = None
        self._first_run: Optional[float] = None
        self._session_notice: Optional[WaitNotice] = None
        self._final_began: Optional[float] = None
        self._restored: Optional[int] = None  # The global step the first session began at.
        self._final_step = 0
        self._evaluations_before_end = 0

    @property
    def step(self) -> Optional[int]:
        """The last global step seen (once per check), or None before the first step."""
        return self._step

    def start(self) -> None:
        """Starts the checking thread; the start-up deadline counts from now."""
        self._started_at = self._clock()
        interval = max(0.5, min(5.0, self._startup_timeout / 10, self._stall_timeout / 10))
        self._thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops the checking thread and waits for it (a daemon thread inside TensorFlow's
        file functions when the interpreter exits aborts the process)."""
        self._stop.set()
        _join(self._thread)

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            self.check()

    def check(self) -> None:
        """Ends the process if a deadline has passed, then asks the hook for a fresh step.

        Called by the thread. The stall timer counts from when a fetched step
        last completed (or an evaluation batch last ran), so it sees progress up to
        one check interval and two steps late: far below any stall timeout.
        """
        now = self._clock()
        evaluation = self._evaluations.running()
        with self._lock:
            reading = self._alive
            if self._alive and self._last_progress is not None:
                self._last_progress = now
            self._alive = False
            last, step = self._last_progress, self._step
        if last is None:
            if not self._check_session(now) and now - self._started_at > self._startup_timeout:
                self._fail_startup()
        elif now - last > self._stall_timeout and self._final_began is not None:
            self._exit(
                self._role,
                exit_codes.FINAL_PHASE_HUNG,
                FINAL_PHASE_MESSAGE.format(
                    seconds=now - last,
                    stall=self._stall_timeout,
                    step=self._final_step,
                    phase=self._final_phase(evaluation),
                ),
            )
        elif now - last > self._stall_timeout:
            self._exit(
                self._role,
                exit_codes.STALLED,
                f"the global step stayed at {files.latest_known_step(step, self._model_dir)} "
                f"for {now - last:.0f} s (stall timeout "
                f"{self._stall_timeout:g} s); "
                + (
                    "training or evaluation is stuck. "
                    if self._alone
                    else "a peer is stuck or gone. Restart the job from its latest checkpoint. "
                )
                + "Raise --stall_timeout for very slow steps.",
            )
        elif reading and evaluation:
            self._warn_long_evaluation(now, *evaluation)
        self.due = True

    def _fail_startup(self) -> None:
        """Exit 151: no step within the start-up timeout; names the peers it cannot reach."""
        missing = unreachable(self._peers)
        if missing:
            where = f"unreachable: {', '.join(missing)}"
        elif self._alone:
            where = "a single process: its input or graph building is stuck"
        else:
            where = "every peer accepts connections, but no step ran"
        self._exit(
            self._role,
            exit_codes.CLUSTER_TIMEOUT,
            f"no training step within the start-up timeout of {self._startup_timeout:g} s "
            f"({where}). Start every task of the cluster, or raise --startup_timeout.",
        )

    def _check_session(self, now: float) -> bool:
        """Before the first step: ends the process when session creation outlasts its bound.

        Says every `rendezvous.WAIT_NOTICE_SECS` which peers cannot be reached. Returns
        whether it ended the process (or, with a test's `exit_fn`, would have).
        """
        with self._lock:
            began, first, notice = self._session_began, self._first_run, self._session_notice
        if began is None or notice is None:
            return False
        if now - began <= self._stall_timeout:
            if notice.due_in() == 0:
                notice.update([] if self._alone else unreachable(self._peers))
            return False
        missing = [] if self._alone else unreachable(self._peers)
        if first is None:
            what = (
                "session creation (restore or init_op, local_init_op, the hooks' "
                "after_create_session) did not end"
            )
        else:
            what = (
                f"the session was ready {now - first:.0f} s ago, but the first step (which "
                "meets every peer in its first collective) did not end"
            )
        if missing:
            where = f"unreachable: {', '.join(missing)}"
        elif self._alone:
            where = "a single process"
        else:
            where = "every peer accepts connections"
        # The step the session began at, or before it was read, the latest checkpoint's.
        restored = files.latest_known_step(self._restored, self._model_dir)
        step = "" if restored is None else f", at global step {restored}"
        self._exit(
            self._role,
            exit_codes.SESSION_HUNG,
            SESSION_HUNG_MESSAGE.format(
                what=what, bound=self._stall_timeout, step=step, where=where
            ),
        )
        return True

    def _final_phase(self, evaluation: Optional[Tuple[float, Any, int]]) -> str:
        """What the end of training was doing, for the exit 158 message."""
        if evaluation is not None:
            _, checkpoint, batches = evaluation
            return (
                f"the final evaluation of the checkpoint of step {checkpoint} has read "
                f"{batches} batches, none since"
            )
        if self._evaluations.begun > self._evaluations_before_end:
            return "the final evaluation ended; the export after it (or the session's close)"
        if self._alone:
            return "saving the final checkpoint or closing the session"
        return "saving the final checkpoint or closing the session, which waits for the peers"

    def _warn_long_evaluation(self, now: float, began: float, step: Any, batches: int) -> None:
        """Warns once an evaluation has read for the stall timeout, again at 2x, 4x ..."""
        warned, after = self._eval_warning
        warned, after = (warned, after) if warned == began else (began, self._stall_timeout)
        if now - began > after:
            logging.warning(EVAL_LONG_ALONE.format(step=step, seconds=now - began, batches=batches))
            after *= 2
        self._eval_warning = (warned, after)

    def session_begins(self) -> None:
        """Records that the graph is built and the session is being created (before the first step).

        Session creation and the first step are bounded by the stall timeout from now.
        """
        with self._lock:
            if self._step is None and self._session_began is None:
                self._session_began = self._clock()
                self._session_notice = WaitNotice(
                    self._role,
                    "in session creation",
                    self._stall_timeout,
                    idle=None if self._alone else SESSION_WAIT_IDLE,
                    clock=self._clock,
                )

    def first_step_runs(self) -> None:
        """Records that session creation ended (its hooks' `after_create_session` included)."""
        with self._lock:
            if self._step is None and self._first_run is None:
                self._first_run = self._clock()

    def session_created(self, step: Optional[int] = None) -> None:
        """Records a (re-)created session; a second one after training started is fatal.

        Args:
          step: The global step the session begins at (restored or initialised), if read.
        """
        with self._lock:
            self._sessions += 1
            if step is not None and self._step is None:
                self._restored = step
            recovered = self._sessions > 1 and self._step is not None
        if recovered:
            self._exit(
                self._role,
                exit_codes.SESSION_RECOVERY,
                f"TensorFlow re-created this task's session at step {self._step}, which would "
                "restore the last checkpoint on this task alone and diverge from the others. "
                "Restart the whole job from its latest checkpoint instead.",
            )

    def progress(self, step: int) -> None:
        """Records a completed step, fetched when `due`; the first one arms fail-fast.

        A completed step is progress even when the global step did not move (a
        train_op that never steps it): its collectives with the other tasks ended.
        """
        self.due = False
        with self._lock:
            first = self._last_progress is None
            self._last_progress = self._clock()
            self._step = step
        if first:
            arm_fail_fast()
            status.emit(status.FirstStep(step=step))
            logging.info(
                "estimator_dist: task %s ran its first step (global step %d).", self._role, step
            )

    def alive(self) -> None:
        """Records progress without a global step: an evaluation batch, or a step in flight.

        Only sets a flag; the next `check` counts it as progress at that time.
        """
        self._alive = True

    def training_ended(self, step: int) -> None:
        """Ends the process when this task's training loop ended before the last step.

        Otherwise the end of training begins: its stall timeout counts from now.
        """
        with self._lock:
            self._final_began = self._last_progress = self._clock()
            self._final_step = step
            self._evaluations_before_end = self._evaluations.begun
        last = self._last_step
        if last is None or step >= last.step or self._stopped_on_purpose():
            return
        if self._alone:
            logging.warning(INPUT_ENDED_ALONE.format(step=step, last=last.named, fix=last.fix))
            return
        self._exit(
            self._role,
            exit_codes.INPUT_EXHAUSTED,
            INPUT_EXHAUSTED_MESSAGE.format(step=step, last=last.named, fix=last.fix),
        )

    def hook(self) -> tf.compat.v1.train.SessionRunHook:
        """Returns the hook that reports sessions and steps to this watchdog."""
        return StepHook(self)

    def eval_hook(self) -> tf.compat.v1.train.SessionRunHook:
        """Returns the hook that reports evaluations, each batch counting as progress."""
        return self._evaluations


def _join(thread: Optional[threading.Thread]) -> None:
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout=10)
