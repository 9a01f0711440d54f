"""The status channel: typed events from each task to the launcher that supervises it.

A task's output is for people; what the launcher decides on (the first step,
the steps reached, the step training ends at, why a task failed) comes from
typed events instead, written as JSON lines to a pipe the launcher gives the
task: its write end is an inherited descriptor whose number is in the
environment variable `STATUS_FD_ENV`. Nothing a model_fn or a script prints
can pass for an event.

`emit(event)` in a task writes one line, `{"v": 1, "kind": "progress", ...}`,
and never blocks or fails training: the descriptor is non-blocking, an event
that does not fit into the pipe at once is dropped (the first drop, and the
count at exit, are logged as warnings), and once the launcher is gone (EPIPE)
the channel closes. A line longer than `PIPE_BUF` would not be written
atomically: `encode` shortens its long strings (an `Exiting` cause keeps its
first lines and ends with '…'), so a failure's cause is never lost to its
length. A child forked by the task (multiprocessing's 'fork', `os.fork`)
closes its copy of the descriptor at once and emits nothing, so the channel
ends, and the launcher sees its end, when the task does. Without a supervisor (a single process, a
task on Kubernetes or Vertex AI) `emit` does nothing. `EventReader` on the
launcher's side turns lines back into events and skips, counting them, lines
that are not events of this version.

Example:
  >>> line = encode(Progress(step=200, last_step=400, loss=0.23, examples_per_sec=6830.0,
  ...                        interval_steps=100, interval_secs=0.9))
  >>> line
  '{"v": 1, "kind": "progress", "step": 200, "last_step": 400, "loss": 0.23, \
"examples_per_sec": 6830.0, "interval_steps": 100, "interval_secs": 0.9}\\n'
  >>> reader = EventReader()
  >>> list(reader.read([line, "global step 999\\n"]))
  [Progress(step=200, last_step=400, loss=0.23, examples_per_sec=6830.0, interval_steps=100, \
interval_secs=0.9)]
  >>> reader.malformed
  1
"""

from __future__ import annotations

import atexit
import dataclasses
import errno
import fcntl
import json
import os
import select
import threading
import time
from typing import (
    Any,
    Callable,
    ClassVar,
    Dict,
    Iterable,
    Iterator,
    Optional,
    Tuple,
    Type,
    Union,
)

from absl import logging

#: The version of the events' format; a reader skips lines of any other.
VERSION = 1
#: Names the task's inherited descriptor of the channel's write end.
STATUS_FD_ENV = "ESTIMATOR_DIST_STATUS_FD"
#: The longest line one write sends whole into a pipe (POSIX's PIPE_BUF).
MAX_LINE_BYTES = select.PIPE_BUF

#: Seconds between two `Heartbeat` events of a connected task.
HEARTBEAT_SECS = 2.0

#: Seconds the launcher's side reads a channel after its task exited (a process the task
#: started may hold the channel open): the events before the exit decide what it means.
DRAIN_SECS = 5.0

#: `StopStep.how`: the values it takes.
MAX_STEPS = "max_steps"
INPUTS_COUNTED = "inputs_counted"
INPUT_ENDED = "input_ended"
EARLY_STOPPING = "early_stopping"
PREEMPTION = "preemption"
STOP_HOWS = (MAX_STEPS, INPUTS_COUNTED, INPUT_ENDED, EARLY_STOPPING, PREEMPTION)
#: Ends a string `encode` shortened to fit the line into `MAX_LINE_BYTES`.
ELLIPSIS = "\u2026"


@dataclasses.dataclass(frozen=True)
class Started:
    """The task runs (before any user code): its name and pid."""

    kind: ClassVar[str] = "started"
    task: str
    pid: int


@dataclasses.dataclass(frozen=True)
class Heartbeat:
    """The task is alive: a daemon thread sends one every `HEARTBEAT_SECS` from `connect` on.

    A frozen task (SIGSTOP, a paused VM) sends none, whatever it was doing,
    so its silence tells the launcher what no exit would.
    """

    kind: ClassVar[str] = "heartbeat"


@dataclasses.dataclass(frozen=True)
class RendezvousMet:
    """Every task of the cluster agreed on the job; `secs`: how long this task waited."""

    kind: ClassVar[str] = "rendezvous_met"
    tasks: int
    secs: float


@dataclasses.dataclass(frozen=True)
class FirstStep:
    """This training task completed its first step; `step`: the global step it read."""

    kind: ClassVar[str] = "first_step"
    step: int


@dataclasses.dataclass(frozen=True)
class Progress:
    """A progress line's figures: the step reached, the loss and rate over the interval."""

    kind: ClassVar[str] = "progress"
    step: int
    last_step: int
    loss: Optional[float]
    examples_per_sec: Optional[float]
    interval_steps: int
    interval_secs: Optional[float]


@dataclasses.dataclass(frozen=True)
class StopStep:
    """The step training ends at, and how it was decided (one of `STOP_HOWS`).

    `model_dir` is where that training's checkpoints go, for a program whose
    estimator trains below the job's model_dir (or None: the job's).
    """

    kind: ClassVar[str] = "stop_step"
    step: int
    how: str
    model_dir: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Evaluated:
    """An evaluation of the checkpoint of `step` ended with `metrics`; `final` for the last."""

    kind: ClassVar[str] = "evaluated"
    step: int
    metrics: Dict[str, float]
    final: bool = False


#: `Exiting.reason` of an evaluator that has no part in its program's job (a program that
#: trains with `train()` and evaluates, if at all, with `evaluate()` on the chief).
NO_EVALUATION = "no_evaluation"
#: `Exiting.reason` of a training task whose program trained nothing (it only evaluated,
#: exported or predicted from a checkpoint it found).
NO_TRAINING = "no_training"


@dataclasses.dataclass(frozen=True)
class Exiting:
    """The task ends with `exit_code`; `cause` says why, for a failure on purpose.

    `reason` is a code for what the launcher decides on (`NO_EVALUATION`), or None.
    """

    kind: ClassVar[str] = "exiting"
    exit_code: int
    cause: Optional[str] = None
    reason: Optional[str] = None


Event = Union[Started, Heartbeat, RendezvousMet, FirstStep, Progress, StopStep, Evaluated, Exiting]
#: Every kind of event by its name.
KINDS: Dict[str, Type] = {
    cls.kind: cls
    for cls in (
        Started,
        Heartbeat,
        RendezvousMet,
        FirstStep,
        Progress,
        StopStep,
        Evaluated,
        Exiting,
    )
}
#: The JSON types each field annotation accepts (bool is no int here).
_ACCEPTS: Dict[str, Tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "Optional[str]": (str, type(None)),
    "Optional[float]": (int, float, type(None)),
    "Dict[str, float]": (dict,),
}


def _line(kind: str, fields: Dict[str, Any]) -> str:
    return json.dumps({"v": VERSION, "kind": kind, **fields}) + "\n"


def _fits(line: str) -> bool:
    return len(line.encode("utf-8")) <= MAX_LINE_BYTES


def shorten(text: str, chars: int) -> str:
    """`text` cut to at most `chars` characters (its whole first lines if they fit), then '…'.

    >>> shorten("first line\\nsecond line\\nthird", 24)
    'first line\\nsecond line…'
    >>> shorten("a single long line", 8)
    'a single…'
    """
    if len(text) <= chars:
        return text
    kept = text[:chars]
    cut = kept.rfind("\n")
    if cut > 0:  # Whole lines, when at least the first fits.
        kept = kept[:cut]
    return kept.rstrip() + ELLIPSIS


def encode(event: Event) -> str:
    """One event as its JSON line, newline included.

    A line longer than `MAX_LINE_BYTES` has its strings (the longest first)
    shortened until it fits; only an event whose other fields are too long
    (a great many metrics) stays longer, and `emit` drops it.
    """
    fields = dataclasses.asdict(event)
    line = _line(event.kind, fields)
    if _fits(line):
        return line
    texts = sorted(
        (k for k, v in fields.items() if isinstance(v, str)), key=lambda k: -len(fields[k])
    )
    for name in texts:
        text = fields[name]
        low, high = 0, len(text)  # The most characters of `text` that still fit.
        while low < high:
            middle = (low + high + 1) // 2
            if _fits(_line(event.kind, {**fields, name: shorten(text, middle)})):
                low = middle
            else:
                high = middle - 1
        fields[name] = shorten(text, low)
        line = _line(event.kind, fields)
        if _fits(line):
            break
    return line


def decode(line: str) -> Event:
    """The event of one JSON line.

    Raises:
      ValueError: for a line that is not an event of this version.

    >>> decode('{"v": 1, "kind": "first_step", "step": 1}')
    FirstStep(step=1)
    >>> decode('{"v": 1, "kind": "first_step", "step": "1"}')
    Traceback (most recent call last):
    ...
    ValueError: first_step.step is not a int: '1'
    """
    try:
        fields = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON: {error}") from None
    if not isinstance(fields, dict) or fields.pop("v", None) != VERSION:
        raise ValueError(f"not an event of version {VERSION}")
    cls = KINDS.get(fields.pop("kind", None))
    if cls is None:
        raise ValueError("no known kind")
    for field in dataclasses.fields(cls):
        if field.name not in fields:
            if field.default is dataclasses.MISSING:
                raise ValueError(f"{cls.kind} lacks {field.name}")
            continue
        value = fields[field.name]
        accepted = _ACCEPTS[field.type]
        if (isinstance(value, bool) and bool not in accepted) or not isinstance(value, accepted):
            raise ValueError(f"{cls.kind}.{field.name} is not a {field.type}: {value!r}")
    if cls is StopStep and fields.get("how") not in STOP_HOWS:
        raise ValueError(f"stop_step.how is not one of {', '.join(STOP_HOWS)}: {fields['how']!r}")
    try:
        return cls(**fields)
    except TypeError as error:  # A field this version does not know.
        raise ValueError(str(error)) from None


class EventReader:
    """The launcher's side: turns a channel's lines into events, skipping malformed ones.

    Args:
      on_malformed: Called once, with the first malformed line and why.

    Attributes:
      malformed: How many lines were skipped.
    """

    def __init__(self, on_malformed: Callable[[str, str], None] = lambda line, why: None) -> None:
        self.malformed = 0
        self._on_malformed = on_malformed

    def read(self, lines: Iterable[str]) -> Iterator[Event]:
        """Yields the event of each line, until `lines` ends."""
        for line in lines:
            try:
                event = decode(line)
            except ValueError as error:
                self.malformed += 1
                if self.malformed == 1:
                    self._on_malformed(line.rstrip("\n")[:200], str(error))
                continue
            yield event


class _Channel:
    """The task's write end, opened from the environment at the first event."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._fd: Optional[int] = None
        self._pid: Optional[int] = None
        self.dropped = 0
        self._reported = 0
        self._beating: Optional[int] = None  # The pid whose heartbeat thread runs.

    def _open(self) -> Optional[int]:
        if self._pid != os.getpid():  # First use, or a forked child: that one has no channel.
            self._pid, self._fd = os.getpid(), None
            named = os.environ.pop(STATUS_FD_ENV, "")
            if named.isdigit():
                fd = int(named)
                try:
                    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)
                    os.set_inheritable(fd, False)
                    self._fd = fd
                except OSError:
                    pass
        return self._fd

    def forked(self) -> None:
        """In a forked child: closes its copy of the write end, which only the task may hold.

        Otherwise the child would keep the channel open after the task exits,
        and the launcher would never see it end. The child emits nothing.
        """
        self._lock = threading.Lock()  # Another thread of the parent may have held it.
        if self._pid is None:  # The parent had not taken the channel yet: take it from here.
            named = os.environ.pop(STATUS_FD_ENV, "")
            self._fd = int(named) if named.isdigit() else None
        fd, self._fd, self._pid = self._fd, None, os.getpid()
        self.dropped = self._reported = 0
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass

    def connect(self) -> bool:
        """Takes the channel from the environment and starts its heartbeat; True if there is one."""
        with self._lock:
            connected = self._open() is not None
            beat = connected and self._beating != os.getpid()
            if beat:
                self._beating = os.getpid()
        if beat:
            threading.Thread(target=self._beat, name="status-heartbeat", daemon=True).start()
        return connected

    def _beat(self) -> None:
        """Sends a `Heartbeat` every `HEARTBEAT_SECS` until the channel closes."""
        data = encode(Heartbeat()).encode("utf-8")
        while True:
            with self._lock:
                fd = self._fd if self._pid == os.getpid() else None
                if fd is None:
                    return
                try:
                    os.write(fd, data)
                except BlockingIOError:
                    pass  # The launcher is behind; the next heartbeat says the same.
                except OSError as error:
                    if error.errno in (errno.EPIPE, errno.EBADF):
                        self._fd = None  # The launcher is gone.
            time.sleep(HEARTBEAT_SECS)

    def write(self, line: str, kind: str = "") -> None:
        data = line.encode("utf-8")
        with self._lock:
            fd = self._open()
            if fd is None:
                return
            dropped = self.dropped
            if len(data) > MAX_LINE_BYTES:
                self.dropped += 1  # Only an event of too many metrics: `encode` shortens strings.
            else:
                try:
                    # Whole or not at all: a pipe writes PIPE_BUF bytes atomically.
                    os.write(fd, data)
                except BlockingIOError:
                    self.dropped += (
                        1  # The launcher is behind: the event is lost, training goes on.
                    )
                except OSError as error:
                    if error.errno in (errno.EPIPE, errno.EBADF):
                        self._fd = None  # The launcher is gone.
                    else:
                        self.dropped += 1
            first = dropped == 0 and self.dropped == 1
            if first:
                self._reported = 1
        if first:  # Outside the lock: logging may take a while.
            logging.warning(
                "estimator_dist: the status channel dropped a %s event (the launcher's pipe was "
                "full, or the event too long); the launcher may miss what it said. Later drops "
                "are counted, and the count logged at exit.",
                kind or "status",
            )

    def report(self) -> None:
        """Logs how many events were dropped, if any was since the first drop's warning."""
        if self._pid == os.getpid() and self.dropped > self._reported:
            self._reported = self.dropped
            logging.warning(
                "estimator_dist: the status channel dropped %d event(s) in all; the launcher "
                "missed them.",
                self.dropped,
            )


_channel = _Channel()
os.register_at_fork(after_in_child=_channel.forked)
atexit.register(_channel.report)


def connect() -> bool:
    """Takes this process's channel from the environment; call it first in a task.

    The variable is removed, so the task's own child processes (which do not
    inherit the descriptor) never write to a descriptor of that number. A
    daemon thread then sends a `Heartbeat` every `HEARTBEAT_SECS` (never
    blocking: one the pipe has no room for is skipped), until the channel
    closes.

    Returns:
      Whether a launcher supervises this task.
    """
    return _channel.connect()


def emit(event: Event) -> None:
    """Sends `event` to the launcher; does nothing without one, never blocks, never raises.

    >>> emit(FirstStep(step=1))  # Unsupervised here: nothing happens.
    """
    _channel.write(encode(event), event.kind)
