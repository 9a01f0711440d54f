"""Preemption checkpoint: on SIGTERM, every task stops at one global step and the chief saves it.

Clusters stop pods on purpose: SIGTERM, a grace period, then SIGKILL.
TensorFlow saves on SIGTERM only for Keras and custom loops.

Here, any task that receives SIGTERM or SIGINT asks the chief, through a file
in the shared `model_dir/preemption/`, to stop the job. The chief is the one
decider: it picks a global step far enough ahead for every task to read its
decision first (`stop_at`, about `LEAD_SECS` of steps at the fastest speed it
measures; `storage.task.COORDINATION_SECS` when the files travel through
object storage), and writes it. Each training task's hook asks its session to stop
after that step, exactly as `max_steps` ends training, so every task leaves
the same step, the chief's `CheckpointSaverHook` writes the checkpoint of
that step on its way out, and each task exits `PREEMPTED` (155, retryable):
restarted, the job resumes from that step and loses none. If training reaches
its own end first (its last step, or the end of its input), the job is complete
and every task finishes as usual.

Per training step the hook does one increment and one compare (no fetch, no
clock, no lock); the polling thread measures the speed. The signal is noticed
by a thread (`signal.set_wakeup_fd`), so it is seen even while the main thread
waits inside a collective; if the job cannot stop within `grace_secs` (a peer
is gone), the task exits 155 anyway. The evaluator exits at once. With
parameter servers (no lockstep) the chief stops at the first step after the
decision, saves, and marks the decision done; workers stop when they see it,
ps tasks wait for the chief's mark. A task ignores a decision older than its
session's start step, or made by another attempt's chief (rendezvous id).
Early stopping (`request_stop`) stops the job the same way, and exits 0.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import socket
import sys
import threading
import time
from typing import Callable, List, Optional, Sequence, Tuple

import tensorflow as tf
from absl import logging

from estimator_dist.base import exit_codes, files
from estimator_dist.base.files import read_json, write_json
from estimator_dist.guards.watchdog import fail
from estimator_dist.report import status
from estimator_dist.storage.task import coordination_secs

#: Directory of `model_dir` where requests and the decision are written.
PREEMPTION_DIR = "preemption"
#: The chief's decision: `{"stop_at": step, "requested_by": role, "done": bool, "attempt": id}`.
DECISION_FILE = "decision.json"
#: Seconds of training between the decision and the step every task stops at.
LEAD_SECS = 1.0
#: Each training task's confirmation that it read the decision: `confirmed-<role>.json`.
CONFIRMED_PREFIX = "confirmed-"
#: Seconds of the grace the chief keeps for its checkpoint after waiting for confirmations.
SAVE_SECS = 10.0
#: At most this many steps between the decision and the stop step, however fast steps are.
MAX_LEAD_STEPS = 10_000
#: Signals that mean "stop now, keep what was trained".
SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: What a task does on a preemption, by its kind.
KINDS = ("chief", "worker", "ps", "evaluator")
#: Starts the reason of a stop that early stopping asked for (not a signal: no exit 155).
EARLY_STOP = "early stopping"
#: The training hook's step to stop at while there is no decision: never.
_NEVER = sys.maxsize


class StoppedEarly(Exception):
    """The evaluator evaluated the step at which training stopped before its last step."""


class Preemption:
    """Turns SIGTERM/SIGINT into a checkpoint at one step every task agrees on.

    Args:
      role: This task's name, e.g. `worker-1`.
      model_dir: The job's shared model_dir.
      kind: `chief` (decides the stop step and saves; also a single
        process), `worker`, `ps` (waits for the chief's save) or `evaluator`
        (exits at once, leaving training alone).
      lockstep: Training is synchronous (collectives): every task must stop
        at the same step. False with parameter servers.
      grace_secs: Seconds from the signal to a forced exit.
      poll_secs: How often the files are read.
      exit_fn: Called as `exit_fn(role, code, cause)`; `watchdog.fail` by default.
      enabled: False leaves signals to their defaults and adds no hook
        (`--nopreemption_checkpoint`).
      peers: On the chief of a lockstep job, the other training tasks' roles:
        before the step that reaches the decided stop step, the chief waits
        (within the grace) until each has confirmed it read the decision, so
        that none runs past it into a collective the chief no longer joins.
    """

    def __init__(
        self,
        role: str,
        model_dir: str,
        kind: str,
        lockstep: bool = True,
        grace_secs: float = 25.0,
        poll_secs: float = 0.1,
        exit_fn: Callable[[str, int, str], None] = fail,
        enabled: bool = True,
        peers: Sequence[str] = (),
    ) -> None:
        self._enabled = enabled
        # The chief's fellow training tasks, each of which confirms it read the decision.
        self._peers = tuple(peers)
        self._confirmed = False
        self._role = role
        self._dir = os.path.join(model_dir, PREEMPTION_DIR)
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, received {kind!r}.")
        self._kind = kind
        self._is_chief = kind == "chief"
        self._lockstep = lockstep
        self._grace_secs = grace_secs
        self._poll_secs = poll_secs
        self._exit = exit_fn
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._signalled_at: Optional[float] = None
        self._start_step: Optional[int] = None
        # Written by the training thread alone (`step_done`), read by the others.
        self._step: Optional[int] = None
        # The hook stops its session after the step that reaches this.
        self._stop_step = _NEVER
        self._step_secs: Optional[float] = None
        # (time, step) the polling thread last saw the step move, for `_step_secs`.
        self._sampled: Optional[Tuple[float, int]] = None
        self._threads: List[threading.Thread] = []
        # The id the chief gave this attempt of the job (`joined`); None: accept any decision.
        self._attempt: Optional[str] = None
        self.stop_at: Optional[int] = None
        #: Why the job stops at `stop_at`: a signal's name, or `EARLY_STOP` and what decided it.
        self.reason: Optional[str] = None

    @property
    def requested(self) -> bool:
        """Whether this job is stopping for a preemption."""
        stopping_early = self.reason is not None and self.reason.startswith(EARLY_STOP)
        return self._signalled_at is not None or (self.stop_at is not None and not stopping_early)

    @property
    def enabled(self) -> bool:
        """Whether the channel runs (not `--nopreemption_checkpoint`)."""
        return self._enabled

    @property
    def ended_at(self) -> Optional[int]:
        """The global step this task's training session ended at (None before its end)."""
        return self._step

    def request_stop(self, step: int, reason: str) -> None:
        """Asks to stop the job at one checkpointed step, as a signal does; tasks go on (exit 0)."""
        request = {"role": self._role, "step": step, "signal": f"{EARLY_STOP}: {reason}"}
        write_json(os.path.join(self._dir, f"request-{self._role}.json"), request)

    def install(self) -> None:
        """Catches SIGTERM and SIGINT and starts the thread that acts on them and on the files.

        Must be called from the main thread (Python installs signal handlers there).
        """
        if not self._enabled:
            return
        tf.io.gfile.makedirs(self._dir)
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        for number in SIGNALS:
            signal.signal(number, lambda signum, frame: None)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        self._wakeup = (reader, writer)
        self._threads = [
            threading.Thread(
                target=_one_line(self._role, "preemption signal handling", self._wait_for_signal),
                args=(reader,),
                daemon=True,
            ),
            threading.Thread(
                target=_one_line(self._role, "preemption polling", self._poll), daemon=True
            ),
        ]
        for thread in self._threads:
            thread.start()

    def uninstall(self) -> None:
        """Stops the threads and restores default signal handling."""
        if not self._enabled:
            return
        self._stop.set()
        signal.set_wakeup_fd(-1)
        for number in SIGNALS:
            signal.signal(number, signal.SIG_DFL)
        # Joined, not left as daemons: a daemon thread inside TensorFlow's file
        # functions when the interpreter exits aborts the process (SIGABRT).
        if self._threads:
            self._wakeup[1].send(b"\0")
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=10)

    def _wait_for_signal(self, reader: socket.socket) -> None:
        while not self._stop.is_set():
            data = reader.recv(1)
            if data and data[0] in [int(number) for number in SIGNALS]:
                self.signalled(signal.Signals(data[0]).name)

    def signalled(self, name: str = "SIGTERM") -> None:
        """Records a preemption signal and asks the chief to stop the job."""
        if self._kind == "evaluator":
            self._exit(
                self._role,
                exit_codes.PREEMPTED,
                f"received {name}; the evaluator holds no training state and exits at once "
                "(training goes on; a restarted evaluator resumes from the latest checkpoint).",
            )
            return
        with self._lock:
            if self._signalled_at is not None:
                return
            self._signalled_at = time.monotonic()
            step = self._step if self._step is not None else self._start_step
        logging.warning(
            "estimator_dist: task %s received %s at global step %s; stopping the job at a step "
            "every task agrees on, with a checkpoint (grace %g s).",
            self._role,
            name,
            step,
            self._grace_secs,
        )
        request = {"role": self._role, "step": step, "signal": name}
        path = os.path.join(self._dir, f"request-{self._role}.json")
        try:
            write_json(path, request)
        except (tf.errors.OpError, OSError) as error:  # A full disk, a lost mount.
            logging.error("Writing %s failed: %s", path, error)
            logging.warning(
                "estimator_dist: task %s cannot write its preemption request %s (%s): the other "
                "tasks do not learn of the signal, and this task exits 155 after the grace of "
                "%g s; the restart resumes from the latest checkpoint.",
                self._role,
                path,
                _first_line(error),
                self._grace_secs,
            )

    def _poll(self) -> None:
        refused = False
        while not self._stop.wait(self._poll_secs):
            try:
                self.poll_once()
            except (tf.errors.OpError, OSError) as error:  # A full disk, a lost mount.
                if not refused:  # Said once; the grace still ends the task.
                    refused = True
                    logging.error("Reading or writing %s failed: %s", self._dir, error)
                    logging.warning(
                        "estimator_dist: task %s cannot read or write the preemption files in "
                        "%s (%s); it goes on trying, and a signalled task exits 155 after the "
                        "grace.",
                        self._role,
                        self._dir,
                        _first_line(error),
                    )

    def poll_once(self) -> None:
        """Reads the files and acts: the polling thread's work, once."""
        with self._lock:
            signalled, start = self._signalled_at, self._start_step
        if signalled is not None and time.monotonic() - signalled > self._grace_secs:
            self._exit(
                self._role,
                exit_codes.PREEMPTED,
                f"the job did not stop within the preemption grace of {self._grace_secs:g} s "
                "(a peer may be gone); exiting so that the restart resumes from the latest "
                "checkpoint.",
            )
            self._stop.set()
        elif self._kind == "ps":
            self._wait_for_save(signalled)
        elif signalled is not None and start is None:
            self._exit(
                self._role,
                exit_codes.PREEMPTED,
                "received a preemption signal before its training session started: nothing to "
                "save; the restarted job starts from the latest checkpoint.",
            )
            self._stop.set()
        elif start is not None:
            self._measure_speed()
            if self.stop_at is None:
                self._read_decision(start)
            if self._is_chief and self.stop_at is None:
                self._decide(start)

    def _measure_speed(self) -> None:
        """Updates the fastest seconds per step from the step count (the polling thread's clock).

        The first move is skipped (the first step also warms up); a poll that
        saw no move keeps the earlier sample, so that slow steps are timed whole.
        """
        now, step = time.monotonic(), self._step
        if step is None or step == self._start_step:
            return
        sampled = self._sampled
        self._sampled = (now, step) if sampled is None or step > sampled[1] else sampled
        if sampled is None or step <= sampled[1]:
            return
        elapsed = (now - sampled[0]) / (step - sampled[1])
        with self._lock:
            before = self._step_secs
            # The fastest pace seen: the lead must outlast the decision's way to every task
            # even when the steps go fastest (an average still weighed by the slow first steps
            # gave a 5 s lead of 1.5 s at full pace, and a worker passed the stop step).
            self._step_secs = elapsed if before is None else min(before, elapsed)

    def _set_stop_at(self, stop_at: int) -> None:
        self.stop_at = stop_at
        if not (self.reason or "").startswith(EARLY_STOP):  # Early stopping's end comes later.
            status.emit(status.StopStep(step=stop_at, how=status.PREEMPTION))
        # Without lockstep each worker steps on its own: stop after its next step.
        self._stop_step = stop_at if self._lockstep else 0

    def _wait_for_save(self, signalled: Optional[float]) -> None:
        """A ps task leaves once the chief has saved, or the grace runs out."""
        decision = read_json(os.path.join(self._dir, DECISION_FILE))
        if signalled is not None and self._current(decision) and decision.get("done"):
            self._exit(
                self._role,
                exit_codes.PREEMPTED,
                "stopped for a preemption; the chief saved global step "
                f"{decision.get('saved_step')}.",
            )

    def joined(self, attempt: Optional[str]) -> None:
        """Records this attempt's id: another attempt's decisions are then ignored."""
        self._attempt = attempt

    def _current(self, decision: Optional[dict]) -> bool:
        """Whether `decision` was made in this attempt of the job."""
        return decision is not None and self._attempt in (None, decision.get("attempt"))

    def _read_decision(self, start: int) -> None:
        decision = read_json(os.path.join(self._dir, DECISION_FILE))
        if self._current(decision) and decision["stop_at"] > start:
            self.reason = decision.get("reason")
            self._set_stop_at(decision["stop_at"])
            confirmed = {"stop_at": decision["stop_at"], "attempt": decision.get("attempt")}
            write_json(os.path.join(self._dir, f"{CONFIRMED_PREFIX}{self._role}.json"), confirmed)
            logging.warning(
                "estimator_dist: task %s will stop at global step %d (preemption of %s).",
                self._role,
                self.stop_at,
                decision["requested_by"],
            )

    def _decide(self, start: int) -> None:
        requests = [
            read_json(os.path.join(self._dir, name))
            for name in tf.io.gfile.listdir(self._dir)
            if name.startswith("request-") and name.endswith(".json")
        ]
        current = [r for r in requests if r is not None]
        if not current:
            return
        with self._lock:
            step, seconds = self._step, self._step_secs
        step = start if step is None else step
        # Through object storage the decision reaches the others later (storage.task).
        lead_secs = max(LEAD_SECS, coordination_secs())
        lead = math.ceil(lead_secs / seconds) if self._lockstep and seconds else 0
        stop_at = step + min(max(lead, 2 if self._lockstep else 1), MAX_LEAD_STEPS)
        decision = {
            "stop_at": stop_at,
            "requested_by": current[0]["role"],
            "reason": current[0].get("signal"),
            "done": False,
            "attempt": self._attempt,
        }
        write_json(os.path.join(self._dir, DECISION_FILE), decision)
        self.reason = decision["reason"]
        self._set_stop_at(stop_at)
        logging.warning(
            "estimator_dist: preemption of %s: %s.",
            current[0]["role"],
            f"every task stops at global step {stop_at}"
            if self._lockstep
            else "every worker stops after its next step",
        )

    def session_started(self, step: int) -> None:
        """Records the session's start step; the chief first clears the previous requests."""
        if self._is_chief:
            with self._lock:
                signalled = self._signalled_at is not None
            for name in tf.io.gfile.listdir(self._dir):
                keep = ".tmp-" in name or (signalled and name == f"request-{self._role}.json")
                if not keep:
                    with contextlib.suppress(tf.errors.NotFoundError):
                        tf.io.gfile.remove(os.path.join(self._dir, name))
        with self._lock:
            self._start_step = self._step = step
            self._sampled = None

    def session_ended(self, step: int) -> None:
        """Records the global step the session ended at, for the exit message."""
        with self._lock:
            self._step = step

    def before_step(self) -> None:
        """On the chief, before the step that reaches the stop step: waits for every confirmation.

        The training thread's work per step is one compare; the wait happens
        once. Each peer's training thread then waits in that step's collective
        while its polling thread reads the decision (through object storage it
        can take seconds), and every task leaves after the same step. Past the
        grace (less what the save needs) the chief goes on, as it did before.
        """
        if self._confirmed or not self._peers or self._step + 1 < self._stop_step:
            return
        self._confirmed = True
        with self._lock:
            signalled = self._signalled_at
        deadline = (signalled or time.monotonic()) + max(self._grace_secs - SAVE_SECS, 0.0)
        waiting = set(self._peers)
        while waiting and time.monotonic() < deadline:
            for role in list(waiting):
                confirmed = read_json(os.path.join(self._dir, f"{CONFIRMED_PREFIX}{role}.json"))
                if confirmed and confirmed.get("stop_at") == self.stop_at:
                    waiting.discard(role)
            if waiting:
                time.sleep(self._poll_secs)
        if waiting:
            logging.warning(
                "estimator_dist: %s did not confirm the stop step %d within the grace; the chief "
                "stops there anyway.",
                ", ".join(sorted(waiting)),
                self.stop_at,
            )

    def step_done(self) -> bool:
        """Counts one training step; returns whether the session must stop after it.

        The training thread's work per step, after `session_started`: an
        increment and a compare, no lock (only this thread writes the count).
        """
        self._step += 1
        return self._step >= self._stop_step

    def finished(self, failed: bool = False) -> None:
        """After training ended (`failed`: with an error), exits `PREEMPTED` if one was asked.

        After an early stop the task goes on; the chief marks the decision done.
        """
        if self.stop_at is not None and not self.requested and not failed:
            if self._is_chief:
                decision = read_json(os.path.join(self._dir, DECISION_FILE)) or {}
                done = {**decision, "done": True, "saved_step": self.stop_at}
                write_json(os.path.join(self._dir, DECISION_FILE), done)
            logging.info("estimator_dist: %s stopped at global step %d.", self.reason, self.stop_at)
            return
        if not self.requested:
            return
        step = self._step
        if not failed and step is not None and step < self._stop_step:
            # Training reached its own end (its last step, or the end of its input) before
            # the stop step: the job is complete, and a restart would have nothing to train.
            logging.warning(
                "estimator_dist: task %s: training ended at global step %d before the "
                "preemption's stop step%s; nothing is left to resume, the task finishes.",
                self._role,
                step,
                "" if self.stop_at is None else f" {self.stop_at}",
            )
            return
        if self._is_chief:
            # With parameter servers the other workers move the global step too, and a
            # failed stop saved nothing: the latest checkpoint says which step was saved.
            latest = tf.train.latest_checkpoint(os.path.dirname(self._dir))
            saved = int(latest.rsplit("-", 1)[1]) if latest else None
            if failed or (saved is not None and not self._lockstep):
                step = saved or 0
            decision = read_json(os.path.join(self._dir, DECISION_FILE)) or {}
            done = {**decision, "done": True, "saved_step": step}
            write_json(os.path.join(self._dir, DECISION_FILE), done)
            where = f"at global step {step} with a checkpoint of that step"
            if failed:
                where = f"but training failed first; the latest checkpoint is at global step {step}"
        elif failed:
            where = "but training failed first (a peer was lost); the latest checkpoint stays"
        elif self._lockstep:
            where = f"at global step {step} (the chief saved it)"
        else:
            where = "after its step (the chief saved the job's global step)"
        self._exit(
            self._role,
            exit_codes.PREEMPTED,
            f"stopped for a preemption {where}; restart the job to resume from it.",
        )

    def hooks(self) -> List[tf.compat.v1.train.SessionRunHook]:
        """The training hook (reads the start step, counts steps, stops at `stop_at`), if on."""
        return [_PreemptionHook(self)] if self._enabled else []


class _PreemptionHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self, preemption: Preemption) -> None:
        self._preemption = preemption
        self._global_step: Optional[tf.Tensor] = None

    def begin(self) -> None:
        self._global_step = tf.compat.v1.train.get_global_step()

    def after_create_session(self, session: tf.compat.v1.Session, coord: object) -> None:
        self._preemption.session_started(int(session.run(self._global_step)))

    def before_run(self, run_context: tf.compat.v1.train.SessionRunContext) -> None:
        self._preemption.before_step()

    def after_run(
        self, run_context: tf.compat.v1.train.SessionRunContext, run_values: object
    ) -> None:
        if self._preemption.step_done():
            run_context.request_stop()

    def end(self, session: tf.compat.v1.Session) -> None:
        # With parameter servers the global step also counts the other workers' steps.
        self._preemption.session_ended(int(session.run(self._global_step)))


def _first_line(error: BaseException) -> str:
    """The error's type and the first line of its message, for a line on the console."""
    message = getattr(error, "message", None) or str(error)
    return f"{type(error).__name__}: {message.strip().splitlines()[0] if message.strip() else ''}"


def _one_line(role: str, what: str, target: Callable[..., None]) -> Callable[..., None]:
    """`target` for a thread of this task: what it raises becomes one line, not a traceback.

    Python prints an uncaught exception's traceback from a thread to stderr,
    the console; here the traceback goes to the task log (an error record,
    which the console leaves out) and the console gets one warning line.
    """

    def run(*args: object) -> None:
        try:
            target(*args)
        except Exception as error:  # The thread ends either way; only how it is said changes.
            logging.error("The %s thread of task %s ended:", what, role, exc_info=True)
            logging.warning(
                "estimator_dist: task %s: its %s thread ended on %s (the traceback is in the "
                "task log).",
                role,
                what,
                _first_line(error),
            )

    return run


def decided_stop(model_dir: str) -> Optional[int]:
    """The step early stopping chose, as the chief decided or recorded it, or None.

    The chief's stop decision names early stopping as its reason while training
    runs; once training ended, `last_step.json` records it.
    """
    decided = read_json(os.path.join(model_dir, PREEMPTION_DIR, DECISION_FILE)) or {}
    if str(decided.get("reason", "")).startswith(EARLY_STOP):
        return int(decided["stop_at"])
    recorded = read_json(os.path.join(model_dir, files.LAST_STEP_FILE)) or {}
    if str(recorded.get("how", "")).startswith(EARLY_STOP):
        return int(recorded["last_step"])
    return None
