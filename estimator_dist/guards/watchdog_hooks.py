"""The session hooks that report training and evaluation to `estimator_dist.guards.watchdog`.

They cost a training step nothing beyond the hook calls themselves:
`StepHook.before_run` returns None unless the watchdog is `due` (on the first
step, then once per check of its thread), so the global step is fetched
about once a second or less, never every step (and once per session, when
it is created: the step it begins at); `EvaluationHook` reads the global step
once per evaluation, and per batch only bumps a count and calls a function
that sets a flag. `StepHook` also marks the phases before the first step:
`begin` (the graph is built: session creation begins) and the first
`before_run` (session creation is over: the first step begins).
"""

from __future__ import annotations

import threading
from typing import Callable, Optional, Protocol, Tuple

import tensorflow as tf


class StepWatcher(Protocol):
    """What `StepHook` reports to: `estimator_dist.guards.watchdog.Watchdog`."""

    due: bool

    def session_begins(self) -> None: ...

    def session_created(self, step: Optional[int] = None) -> None: ...

    def first_step_runs(self) -> None: ...

    def progress(self, step: int) -> None: ...

    def training_ended(self, step: int) -> None: ...

    def alive(self) -> None: ...


class EvaluationHook(tf.compat.v1.train.SessionRunHook):
    """Tracks the evaluation running in this process: since when, of which step, batches read.

    Args:
      clock: Monotonic clock, replaceable in tests.
      on_batch: Called after each evaluation batch.
    """

    def __init__(self, clock: Callable[[], float], on_batch: Callable[[], None]) -> None:
        self._clock, self._on_batch = clock, on_batch
        self._lock = threading.Lock()
        self._global_step: Optional[tf.Tensor] = None
        self._running: Optional[Tuple[float, Optional[int]]] = None
        self._batches = 0  # Only the evaluation thread writes it: no lock.
        #: The checkpoint step of the latest evaluation begun, or None before the first.
        self.evaluated: Optional[int] = None
        #: How many evaluations have begun.
        self.begun = 0

    def running(self) -> Optional[Tuple[float, Optional[int], int]]:
        """(start time, checkpoint step or None, batches read), or None between evaluations."""
        with self._lock:
            return None if self._running is None else (*self._running, self._batches)

    def begin(self) -> None:
        self._global_step = tf.compat.v1.train.get_global_step()

    def after_create_session(self, session: tf.compat.v1.Session, coord: object) -> None:
        # One read per evaluation: the step of the checkpoint just restored.
        step = None if self._global_step is None else int(session.run(self._global_step))
        with self._lock:
            self._running, self._batches = (self._clock(), step), 0
            self.evaluated = step
            self.begun += 1

    def after_run(self, run_context: object, run_values: object) -> None:
        self._batches += 1
        self._on_batch()

    def end(self, session: tf.compat.v1.Session) -> None:
        with self._lock:
            self._running = None


class StepHook(tf.compat.v1.train.SessionRunHook):
    """Reports sessions and fetched global steps; fetches only when the watcher is `due`.

    Args:
      watcher: Told when session creation begins (`begin`, the graph built),
        of each session, of the first step's start (session creation over),
        of each fetched step, and of the step the training loop ended at.
    """

    def __init__(self, watcher: StepWatcher) -> None:
        self._watcher = watcher
        self._global_step: Optional[tf.Tensor] = None
        self._fetch: Optional[tf.compat.v1.train.SessionRunArgs] = None
        self._ran = False

    def begin(self) -> None:
        self._global_step = tf.compat.v1.train.get_global_step()
        self._fetch = tf.compat.v1.train.SessionRunArgs(self._global_step)
        self._watcher.session_begins()

    def after_create_session(self, session: tf.compat.v1.Session, coord: object) -> None:
        # One read per session: the step it begins at (restored or initialised), for messages.
        step = None if self._global_step is None else int(session.run(self._global_step))
        self._watcher.session_created(step)

    def before_run(self, run_context: object) -> Optional[tf.compat.v1.train.SessionRunArgs]:
        if not self._ran:
            self._ran = True
            self._watcher.first_step_runs()
        return self._fetch if self._watcher.due else None

    def after_run(self, run_context: object, run_values: object) -> None:
        if run_values.results is not None:
            self._watcher.progress(int(run_values.results))
        elif self._watcher.due:
            # The step that was running when the watcher asked: progress too, so
            # that a slow step is not seen a whole step late.
            self._watcher.alive()

    def end(self, session: tf.compat.v1.Session) -> None:
        # MonitoredSession calls this when the loop ends without an error (an
        # exhausted input included), before it closes the session.
        self._watcher.training_ended(int(session.run(self._global_step)))
