"""The evaluator's watchdog: judged by what it waits for, and never idle after the last step.

TensorFlow's evaluator sleeps `EvalSpec.start_delay_secs` (120 s by default)
before its first evaluation and `throttle_secs` (600 s) after each, then
evaluates the newest checkpoint, and exits once it evaluated one at or past
the last step. `EvaluatorWatchdog`:

* ends those sleeps early once a checkpoint at or past the last step exists
  (through `patches.set_training_sleep`): the final checkpoint is
  evaluated at once, and the evaluator exits as TensorFlow does, with no idle
  tail; between earlier evaluations the throttle stays as written;
* judges the evaluator stalled (exit 152) only when it waits for a checkpoint
  newer than the last it evaluated, training has not reached its last step,
  no new checkpoint came for `stall_timeout` and the chief is unreachable
  (`judge`). A sleeping evaluator is never stalled; it is judged when a sleep
  begins and while it is awake;
* tells an evaluation that never ends (exit 8) from a stall: one still
  reading after `stall_timeout` without a new checkpoint, the chief gone.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Mapping, Optional, Tuple

import tensorflow as tf
from absl import logging

from estimator_dist.base import exit_codes, files
from estimator_dist.guards import preemption
from estimator_dist.guards.watchdog import EVAL_UNENDING_MESSAGE, fail, unreachable
from estimator_dist.guards.watchdog_hooks import EvaluationHook
from estimator_dist.tf_runtime import patches

#: Seconds between two looks for the final checkpoint while TensorFlow's evaluator sleeps.
POLL_SECS = 0.5
#: Why the evaluator fails when training stopped before its last step.
STALLED_MESSAGE = (
    "no new checkpoint in {model_dir} for {seconds:.0f} s (latest: {checkpoint}), training has "
    "not reached its last step {last}, and the chief ({chief}) is unreachable, with no "
    "evaluation running: training failed or was stopped before its last step. Restart the job "
    "from its latest checkpoint."
)


def _latest(model_dir: str) -> Tuple[Optional[str], Optional[int]]:
    path = tf.train.latest_checkpoint(model_dir)
    return path, (int(path.rsplit("-", 1)[1]) if path else None)


def reached(step: Optional[int], last_step: Optional[int]) -> bool:
    """Whether a checkpoint of global step `step` is at or past `last_step`."""
    return step is not None and last_step is not None and step >= last_step


def judge(
    sleeping: bool,
    evaluating: bool,
    latest_step: Optional[int],
    evaluated_step: Optional[int],
    last_step: Optional[int],
    since_checkpoint: float,
    stall_timeout: float,
    chief_gone: Callable[[], bool],
) -> Optional[int]:
    """The exit code the evaluator's state calls for, or None while it is fine.

    Args:
      sleeping: It sleeps as TensorFlow told it (start delay, throttle).
      evaluating: An evaluation is running.
      latest_step: The newest checkpoint's global step, or None.
      evaluated_step: The step of the last evaluation begun, or None.
      last_step: The step training ends at, or None when unknown.
      since_checkpoint: Seconds since the newest checkpoint appeared (or
        since the watchdog started).
      stall_timeout: Seconds without a new checkpoint that may be a stall.
      chief_gone: Probes the chief; called last, only when it decides.
    """
    if sleeping or since_checkpoint <= stall_timeout:
        return None
    if evaluating:
        return exit_codes.EVAL_UNENDING if chief_gone() else None
    if reached(latest_step, last_step):
        return None
    newer = latest_step is not None and (evaluated_step is None or latest_step > evaluated_step)
    if newer:  # Not waiting: TensorFlow evaluates it next.
        return None
    return exit_codes.STALLED if chief_gone() else None


class EvaluatorWatchdog:
    """Ends TensorFlow's evaluator sleeps at the last step, and the evaluator when stalled.

    Args:
      role: This task's name.
      model_dir: Where the chief writes checkpoints.
      chief: Name to address of the chief.
      stall_timeout: Seconds without a new checkpoint before the chief is probed.
      last_step: The step training ends at; None when unknown (sleeps are
        then never cut short, and any wait may be a stall).
      exit_fn: Called as `exit_fn(role, code, cause)`; `fail` by default.
      clock: Monotonic clock, replaceable in tests.
    """

    def __init__(
        self,
        role: str,
        model_dir: str,
        chief: Mapping[str, str],
        stall_timeout: float,
        last_step: Optional[int] = None,
        exit_fn: Callable[[str, int, str], None] = fail,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._role = role
        self._model_dir = model_dir
        self._chief = dict(chief)
        self._stall_timeout = stall_timeout
        self.last_step = last_step
        self._exit = exit_fn
        self._clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._evaluations = EvaluationHook(clock, lambda: None)
        self._checkpoint: Optional[str] = None
        self._changed = clock()
        self._sleeping = False
        self._exited = False

    def eval_hook(self) -> tf.compat.v1.train.SessionRunHook:
        """Returns the hook that tells this watchdog when an evaluation runs."""
        return self._evaluations

    def start(self) -> None:
        """Starts watching in a daemon thread, and takes over TensorFlow's evaluator sleeps."""
        self._checkpoint, _ = _latest(self._model_dir)
        self._changed = self._clock()
        patches.set_training_sleep(self.sleep)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stops watching, and waits for the thread: a daemon thread inside TensorFlow's
        file functions when the interpreter exits aborts the process (SIGABRT)."""
        patches.set_training_sleep(None)
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(max(0.5, min(5.0, self._stall_timeout / 10))):
            self.check()

    def _observe(self) -> Tuple[Optional[str], Optional[int], float]:
        """The newest checkpoint, its step, and seconds since it appeared."""
        path, step = _latest(self._model_dir)
        with self._lock:
            if path != self._checkpoint:
                self._checkpoint, self._changed = path, self._clock()
            return path, step, self._clock() - self._changed

    def finished(self) -> bool:
        """Whether a checkpoint at or past the last step exists.

        Early stopping may end training sooner: the chief then writes the step
        it stopped at into `last_step.json`, which becomes the last step here.
        """
        stop = preemption.decided_stop(self._model_dir)
        if stop is not None:
            self.last_step = min(stop, self.last_step or sys.maxsize)
        return reached(_latest(self._model_dir)[1], self.last_step)

    def check(self, sleeping: Optional[bool] = None) -> None:
        """Ends the process when the evaluator is stalled or evaluates forever."""
        path, step, since = self._observe()
        evaluation = self._evaluations.running()
        code = judge(
            self._sleeping if sleeping is None else sleeping,
            evaluation is not None,
            step,
            self._evaluations.evaluated,
            self.last_step,
            since,
            self._stall_timeout,
            lambda: bool(unreachable(self._chief)),
        )
        if code is None or self._exited:
            return
        self._exited = True
        chief = ", ".join(self._chief.values())
        if code == exit_codes.EVAL_UNENDING:
            cause = EVAL_UNENDING_MESSAGE.format(
                checkpoint=path,
                seconds=self._clock() - evaluation[0],
                batches=evaluation[2],
                stall=self._stall_timeout,
                chief=chief,
            )
        else:
            cause = STALLED_MESSAGE.format(
                model_dir=self._model_dir,
                seconds=since,
                checkpoint=path,
                last=self.last_step if self.last_step is not None else "(unknown)",
                chief=chief,
            )
        self._exit(self._role, code, cause)

    def _end_if_evaluated(self) -> None:
        """Ends the evaluator when it already evaluated the step training stopped at early.

        The chief records such a stop once training ended; an evaluation of that
        checkpoint may have run before, when nobody could call it final, and
        TensorFlow's evaluator, waiting for its own last step, would never end.

        Raises:
          StoppedEarly: the latest evaluation was of the step training stopped at.
        """
        evaluated = self._evaluations.evaluated
        stop = preemption.decided_stop(self._model_dir)
        if stop is None or evaluated is None or evaluated < stop:
            return
        files.mark_final_metrics(self._model_dir)
        raise preemption.StoppedEarly(
            f"evaluated global step {evaluated}, where training stopped before its last step"
        )

    def sleep(self, seconds: float) -> None:
        """TensorFlow's evaluator sleep: judged as it begins, ended at the last step."""
        self.check(sleeping=False)
        end = self._clock() + seconds
        self._sleeping = True
        try:
            while (remaining := end - self._clock()) > 0:
                if self.finished():
                    self._end_if_evaluated()
                    logging.info(
                        "estimator_dist: a checkpoint at or past the last step %d exists: "
                        "TensorFlow's evaluator sleep (EvalSpec's start delay or throttle) ends "
                        "%.0f s early, to evaluate it now or exit.",
                        self.last_step,
                        remaining,
                    )
                    return
                time.sleep(min(POLL_SECS, remaining))
        finally:
            self._sleeping = False
