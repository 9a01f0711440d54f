"""Where a task's start-up time goes, from process start to its first training step.

The driver marks the end of each phase with `Startup.mark`, and
`Startup.hook()` marks the phases inside Estimator (graph built, session
created, first step), then logs one line at the first step:

  estimator_dist: task chief-0 start-up 9.8 s: imports 4.3 s, pre-flight 1.3 s, strategies 0.2 s,
  rendezvous 0.6 s, graph 1.0 s, session 2.1 s, first step 0.3 s

where "imports" runs from the process's start (the interpreter included) to the
driver's first line.

The process start comes from `/proc/self/stat` where it exists, so the time
the interpreter takes to start is counted too; elsewhere the clock starts
when this module is imported.

>>> startup = Startup("chief-0", started=100.0, clock=lambda: 101.5)
>>> startup.mark("imports")
>>> startup.phases
{'imports': 1.5}
"""

from __future__ import annotations

import os
import time
from typing import Callable, Dict, Optional

import tensorflow as tf
from absl import logging

_IMPORTED = time.monotonic()


def process_started() -> float:
    """The monotonic time this process started (when this module was imported, off Linux)."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime", encoding="ascii") as uptime:
            since_boot = float(uptime.read().split()[0])
    except (OSError, ValueError, IndexError):
        return _IMPORTED
    age = since_boot - ticks / os.sysconf("SC_CLK_TCK")
    return time.monotonic() - max(0.0, age)


class Startup:
    """Records how long each start-up phase took, and logs them at the first step.

    Args:
      role: The task, for the log line.
      started: Monotonic time the process started.
      clock: Monotonic clock, replaceable in tests.
    """

    def __init__(
        self,
        role: str,
        started: Optional[float] = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._role = role
        self._clock = clock
        self._last = process_started() if started is None else started
        self._started = self._last
        self.phases: Dict[str, float] = {}

    def mark(self, phase: str) -> None:
        """Ends `phase` now; it took the time since the previous mark."""
        now = self._clock()
        self.phases[phase] = now - self._last
        self._last = now

    @property
    def total(self) -> float:
        """Seconds from process start to the last mark."""
        return self._last - self._started

    def describe(self) -> str:
        """One line: the task, the total, and each phase."""
        parts = ", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in self.phases.items())
        return f"estimator_dist: task {self._role} start-up {self.total:.1f} s: {parts}"

    def hook(self) -> tf.compat.v1.train.SessionRunHook:
        """A hook that marks graph, session and first step, then logs `describe()` once."""
        return _StartupHook(self)


class _StartupHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self, startup: Startup) -> None:
        self._startup = startup
        self._done = False

    def begin(self) -> None:
        if not self._done:
            self._startup.mark("graph")

    def after_create_session(self, session: tf.compat.v1.Session, coord: object) -> None:
        if not self._done:
            self._startup.mark("session")

    def after_run(self, run_context: object, run_values: object) -> None:
        if not self._done:
            self._done = True
            self._startup.mark("first step")
            logging.info("%s", self._startup.describe())
