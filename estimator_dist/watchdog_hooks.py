"""The session hooks that report training and evaluation to `estimator_dist.watchdog`.

They cost a training step nothing beyond the hook calls themselves:
`StepHook.before_run` returns None unless the watchdog is `due` (on the first
step, then once per check of its thread), so the global step is fetched
about once a second or less, never every step; `CallbackHook` calls plain
functions, which for evaluation batches only set or bump a value.
"""

from __future__ import annotations

from typing import Callable, Optional, Protocol

import tensorflow as tf


class StepWatcher(Protocol):
    """What `StepHook` reports to: `estimator_dist.watchdog.Watchdog`."""

    due: bool

    def session_created(self) -> None: ...

    def progress(self, step: int) -> None: ...

    def training_ended(self, step: int) -> None: ...

    def alive(self) -> None: ...


class CallbackHook(tf.compat.v1.train.SessionRunHook):
    """Calls plain functions at a session's start, after each run and at its end."""

    def __init__(
        self,
        begin: Callable[[], None] = lambda: None,
        after_run: Callable[[], None] = lambda: None,
        end: Callable[[], None] = lambda: None,
    ) -> None:
        self._begin, self._after_run, self._end = begin, after_run, end

    def after_create_session(self, session: tf.compat.v1.Session, coord: object) -> None:
        self._begin()

    def after_run(self, run_context: object, run_values: object) -> None:
        self._after_run()

    def end(self, session: tf.compat.v1.Session) -> None:
        self._end()


class StepHook(tf.compat.v1.train.SessionRunHook):
    """Reports sessions and fetched global steps; fetches only when the watcher is `due`.

    Args:
      watcher: Told of each session, of each fetched step, and of the step
        the training loop ended at.
    """

    def __init__(self, watcher: StepWatcher) -> None:
        self._watcher = watcher
        self._global_step: Optional[tf.Tensor] = None
        self._fetch: Optional[tf.compat.v1.train.SessionRunArgs] = None

    def begin(self) -> None:
        self._global_step = tf.compat.v1.train.get_global_step()
        self._fetch = tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_create_session(self, session: tf.compat.v1.Session, coord: object) -> None:
        self._watcher.session_created()

    def before_run(self, run_context: object) -> Optional[tf.compat.v1.train.SessionRunArgs]:
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
