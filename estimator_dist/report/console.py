"""What a person sees of a job: progress, the package's own lines, warnings, the metrics.

Each task writes a full log: all that TensorFlow, absl, Python's `warnings`
and TensorFlow's C++ runtime print. A person at a console needs a small part
of it, which `ConsoleFilter` picks line by line from the text:

* one progress line every N steps of each training task (`format_progress`),
  `[ 50%] loss = 0.2320, step = 200/400, 6,830 examples/s, ~2 s left`, with
  `learning_rate = 0.1` after the loss when the model_fn tracks its rate;
* the package's lines meant for people, which start with `estimator_dist`
  (start-up time, first step, preemption, a task's failure), and the metrics
  of each evaluation (Estimator's `Saving dict for global step ...`);
* warnings logged by the package or the user's code, not TensorFlow's;
* what is printed that is not a log line: the final metrics, errors, tracebacks.

Where the rest goes:

* Under the launcher, a task prints everything to the launcher's pipe, and
  `estimator_dist.launcher.supervise` writes it all to `model_dir/logs/<task>.log` and
  echoes what the filter keeps. `start_task` prints `PROTOCOL_LINE`, which
  tells the launcher that its log lines follow the conventions the filter
  relies on (`LogFormatter`). The launcher accepts it among the task's first
  20 lines (`supervise.PROTOCOL_LINES`: a warning Python prints at start-up
  may come first) and echoes whole what came before it; the output of a task
  that does not say so is echoed whole. The launcher shows the chief's
  progress lines only, and decides nothing from any line (`report.status`).
* A single process (`python -m estimator_dist.train` without TF_CONFIG) and
  the launcher itself keep their full log aside from the start (`start_task`,
  `start_launcher`) and move it to `model_dir/logs/<task>.log` once the job is
  valid and model_dir exists (`keep_log`): a usage error writes nothing.
* A task on a cluster platform (TF_CONFIG set, no launcher) keeps everything
  on its output, the task log the platform collects; so does `--verbose`.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import io
import logging
import os
import re
import site
import statistics
import sys
import sysconfig
import tempfile
from typing import IO, Optional, Tuple

from absl import logging as absl_logging

#: Directory of `model_dir` where the launcher writes each task's log.
LOG_DIR = "logs"
#: Set by the launcher in each task's environment: the task's output goes to its pipe.
SUPERVISED_ENV = "ESTIMATOR_DIST_SUPERVISED"
#: The first line of a task whose output the launcher may filter for the console.
PROTOCOL_LINE = (
    "estimator_dist.report.console: the launcher's console shows the lines meant for people; "
    "this log keeps everything (--verbose on the launcher shows everything)"
)

#: A progress line, as `format_progress` writes it (`[ 50%] loss = ...`).
PROGRESS = re.compile(r"^\[ *\d+%\] ")
#: The lines a worker prints that repeat the chief's for a person: its progress and its first
#: step (the launcher says where the first step came; a lagging worker gets a line of its own).
REPEATS_THE_CHIEF = re.compile(r"^(\[ *\d+%\] |estimator_dist: task \S+ ran its first step)")
#: A line of a Python log record, with absl's prefix; TensorFlow 2.16+'s C++ log has the same
#: prefix, its seconds counted from 1970 before its clock is set up (`I0000 00:00:1795804501.69`).
_RECORD = re.compile(
    r"^(?P<prefix>(?P<level>[IWEF])\d{4} \d\d:\d\d:\d+\.\d+ +\d+ (?P<file>[^\s:]+):\d+\]) ?"
    r"(?P<message>.*)$"
)
#: A line of TensorFlow's C++ log.
_NATIVE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+: (?P<level>[IWEF]) \S+\] ")
#: The later lines of TensorFlow's multi-line C++ messages: the start-up's, and a failed
#: remote call's raw gRPC details (kept in the task log; the task's own line says the cause).
_NATIVE_CONTINUATIONS = (
    "To enable the following instructions:",
    "Additional GRPC error information from remote target",
    ':{"created":"@',
    "The error could be from a previous operation.",
)
#: What TensorFlow 2.16+'s C++ logging prints once before its own set-up, on every task.
_ABSL_PREINIT = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
)
#: The first line of a Python warning that `logging.captureWarnings` did not catch.
_WARNING = re.compile(r"^\S.*:\d+: [A-Z]\w*Warning: ")
_SHOWN = ("estimator_dist", "Saving dict for global step")  # Shown, though not warnings.
#: The log record of `watchdog.fail`, which prints the same line on its own too.
_FAILURE_RECORD = re.compile(r"^estimator_dist: task \S+ failed \(exit \d+\)")
#: Where the package's modules are: their log records are the package's own.
_OWN_ROOTS = tuple(
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), name) + os.sep
    for name in ("estimator_dist", "input_fns", "model_fns", "run_config")
)
#: Where Python's own library and installed packages are: not the user's code.
_LIBRARY_ROOTS = tuple(
    os.path.abspath(path) + os.sep
    for key, path in {**sysconfig.get_paths(), "user": site.getusersitepackages()}.items()
    if path and key in ("stdlib", "platstdlib", "purelib", "platlib", "user")
)


def format_progress(
    step: int,
    last_step: Optional[int],
    loss: Optional[float],
    examples_per_sec: Optional[float],
    seconds_left: Optional[float],
    learning_rate: Optional[float] = None,
) -> str:
    """One progress line, with Estimator's `loss = ..., step = ...` at its core.

    >>> format_progress(200, 400, 0.23203, 6830.4, 2.4, learning_rate=0.1)
    '[ 50%] loss = 0.2320, learning_rate = 0.1, step = 200/400, 6,830 examples/s, ~2 s left'
    >>> format_progress(400, 400, None, None, 0.0)
    '[100%] step = 400/400, done'
    >>> format_progress(30, None, 0.5, None, None)  # Until the input ends: no end known.
    'loss = 0.5000, step = 30'
    """
    parts = [] if loss is None else [f"loss = {loss:.4f}"]
    if learning_rate is not None:
        parts.append(f"learning_rate = {learning_rate:.4g}")
    parts.append(f"step = {step}" if last_step is None else f"step = {step}/{last_step}")
    if examples_per_sec is not None:
        parts.append(f"{examples_per_sec:,.0f} examples/s")
    if last_step is None:
        return ", ".join(parts)
    if step >= last_step:
        parts.append("done")
    elif seconds_left is not None:
        left = _duration(seconds_left)
        parts.append(f"{'' if left.startswith('<') else '~'}{left} left")
    percent = min(100, 100 * step // last_step) if last_step > 0 else 100
    return f"[{percent:3d}%] " + ", ".join(parts)


def _duration(seconds: float) -> str:
    """Seconds as a short duration.

    >>> _duration(0.3), _duration(42.4), _duration(600), _duration(7200)
    ('<1 s', '42 s', '10 min', '2.0 h')
    """
    if seconds < 1:
        return "<1 s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class StepRate:
    """Training speed for a progress line: its interval's, unless that interval was a gap.

    A progress line's rate and time left come from the interval since the
    previous line. After a network cut of a few seconds that healed, one
    interval of 10 steps took 3 s instead of 0.07 s, and the line said
    "59 examples/s, ~47 min left". An interval whose seconds per step exceed
    `gap_factor` times the median of the recent intervals' is a gap (a healed
    cut, a pause, a long save): its line shows the rate of the latest interval
    that was not. Two gaps in a row are the new pace (a slower machine), which
    then counts.

    Args:
      window: Recent intervals whose median is the usual pace.
      gap_factor: How much slower per step than usual an interval is a gap.

    >>> rate = StepRate()
    >>> rate.add(10, 0.1), rate.add(20, 0.1), rate.add(10, 0.1)
    (100.0, 200.0, 100.0)
    >>> rate.add(10, 3.0)  # A healed cut: the rate before it.
    100.0
    >>> round(rate.add(10, 3.0), 2), round(rate.add(10, 2.0), 2)  # Slower since: the new pace.
    (3.33, 5.0)
    """

    def __init__(self, window: int = 5, gap_factor: float = 5.0) -> None:
        self._gap_factor = gap_factor
        self._recent: collections.deque = collections.deque(maxlen=window)
        self._gaps: list = []

    def add(self, steps: float, seconds: float) -> Optional[float]:
        """Records an interval of `steps` steps in `seconds`; returns the steps a second to show.

        None when no interval with steps and time has been recorded yet.
        """
        if steps > 0 and seconds > 0:
            usual = statistics.median(s / n for n, s in self._recent) if self._recent else None
            if usual is None or seconds / steps <= self._gap_factor * usual:
                self._recent.append((steps, seconds))
                self._gaps = []
            else:
                self._gaps.append((steps, seconds))
                if len(self._gaps) > 1:
                    self._recent.clear()
                    self._recent.extend(self._gaps)
                    self._gaps = []
        if not self._recent:
            return None
        steps, seconds = self._recent[-1]
        return steps / seconds


class ConsoleFilter:
    """Decides, line by line, what of a task's full output a person sees.

    Log lines must come as `LogFormatter` writes them: every line of a record
    carries the record's prefix. One filter reads one stream.

    >>> keep = ConsoleFilter()
    >>> keep("W1124 02:17:54.144277 1396 deprecation.py:50] From x.py:1: f is deprecated")
    >>> keep("I1124 02:18:03.626438 1404 startup.py:107] estimator_dist: task up")
    'estimator_dist: task up'
    >>> keep("W1124 02:18:01.251578 1405 input_fns/pipeline.py:313] no eval_files given")
    'WARNING: no eval_files given'
    >>> keep("Final evaluation: global_step=400, accuracy=0.9630, loss=0.1291")
    'Final evaluation: global_step=400, accuracy=0.9630, loss=0.1291'
    """

    def __init__(self) -> None:
        self._record: Optional[str] = None
        self._shown_record = False
        self._continuations: Tuple[str, ...] = ()

    def __call__(self, line: str) -> Optional[str]:
        """The line as a person sees it, or None to keep it in the log only."""
        line = line.rstrip("\r\n")
        if self._continuations and line.startswith(self._continuations):
            return None  # The rest of a hidden Python warning or C++ message.
        self._continuations = ()
        record = _RECORD.match(line)
        if record is not None:
            return self._record_line(record)
        self._record = None
        if line == _ABSL_PREINIT:
            return None
        native = _NATIVE.match(line)
        if native is not None:
            self._continuations = _NATIVE_CONTINUATIONS
            return line if native.group("level") == "F" else None
        if _WARNING.match(line):
            self._continuations = ("  ",)  # Its source line.
            return None
        return line

    def _record_line(self, record: re.Match) -> Optional[str]:
        message = record.group("message")
        if record.group("prefix") == self._record:  # A later line of the same record.
            return message if self._shown_record else None
        self._record = record.group("prefix")
        shown = _shown_message(record.group("level"), record.group("file"), message)
        self._shown_record = shown is not None
        return shown


def _shown_message(level: str, source: str, message: str) -> Optional[str]:
    """What a person sees of a log record's first line, or None."""
    if _FAILURE_RECORD.match(message):
        return None
    if PROGRESS.match(message) or message.startswith(_SHOWN):
        return message
    if level == "W" and "/" in source:  # `LogFormatter` names own files by path.
        return f"WARNING: {message}"
    if level == "F":
        return f"FATAL: {message}"
    return None


def is_own_code(path: str) -> bool:
    """Whether a log record from the file `path` comes from the package or the user's code.

    Python's library and installed packages (TensorFlow, absl, TFDS) are not;
    the package's own modules are, wherever it is installed.
    """
    if path.startswith("<"):
        return False
    path = os.path.abspath(path)
    if path.startswith(_OWN_ROOTS):
        return True
    parts = path.split(os.sep)
    return not path.startswith(_LIBRARY_ROOTS) and not (
        "site-packages" in parts or "dist-packages" in parts
    )


class LogFormatter(absl_logging.PythonFormatter):
    """absl's log format, with two conventions `ConsoleFilter` relies on.

    Every line of a record carries the record's prefix (a traceback or a
    multi-line message included), and records of the package's and the
    user's code name their file with its directory
    (`estimator_dist/task/driver.py:120]`), other records by its name only, as
    absl does.
    """

    def format(self, record: logging.LogRecord) -> str:
        named = copy.copy(record)
        if is_own_code(record.pathname):
            directory = os.path.basename(os.path.dirname(os.path.abspath(record.pathname)))
            named.filename = f"{directory}/{record.filename}"
        prefix = absl_logging.get_absl_log_prefix(named)
        body = logging.Formatter.format(self, record).rstrip("\n")
        return "\n".join(prefix + line for line in body.split("\n"))


@dataclasses.dataclass
class _Quiet:
    """A process whose full log goes to a file, and whose console shows the filtered lines."""

    console: IO[str]
    label: str
    log_fd: int
    path: Optional[str] = None
    wanted: Optional[str] = None
    handler: Optional[logging.Handler] = None

    def say(self, message: str) -> None:
        self.console.write(f"{self.label}{message}\n")


_quiet: Optional[_Quiet] = None


class _LogSink(io.TextIOBase):
    """The stream absl's handler writes the full log to: the file on descriptor 2."""

    def write(self, text: str) -> int:
        quiet = _quiet
        if quiet is None:
            return sys.stderr.write(text)
        data = text.encode("utf-8", "backslashreplace")
        try:
            while data:
                data = data[os.write(quiet.log_fd, data) :]
        except OSError as error:
            _give_up_log(quiet, error)
            return sys.stderr.write(text)
        return len(text)


class _ConsoleHandler(logging.Handler):
    """Writes the lines of each record that `ConsoleFilter` keeps to the console."""

    def __init__(self, quiet: _Quiet, formatter: logging.Formatter) -> None:
        super().__init__()
        self._quiet = quiet
        self._filter = ConsoleFilter()
        self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            for line in self.format(record).split("\n"):
                shown = self._filter(line)
                if shown is not None:
                    self._quiet.console.write(f"{self._quiet.label}{shown}\n")
        except Exception:  # As logging.StreamHandler does.
            self.handleError(record)


def _install_formatter() -> LogFormatter:
    formatter = LogFormatter()
    absl_logging.get_absl_handler().setFormatter(formatter)
    logging.captureWarnings(True)
    return formatter


def start_task(verbose: bool) -> None:
    """Sets up the console of a training task; call it first, before TensorFlow is imported.

    Under the launcher, it prints `PROTOCOL_LINE` (unless `verbose`) and
    leaves the output whole: the launcher filters it. In a single process
    without TF_CONFIG (or CLUSTER_SPEC), it keeps the full log aside (`keep_log` moves it to
    model_dir) and shows what `ConsoleFilter` keeps. A task of a cluster
    platform keeps everything on its output, as with `verbose`.

    Args:
      verbose: Keep everything on the console (`--verbose`).
    """
    _install_formatter()
    if os.environ.get(SUPERVISED_ENV):
        from estimator_dist.report import status

        # Its heartbeat starts before TensorFlow's import, which takes seconds (12 s measured
        # beside two training tasks): the launcher tells a frozen task from a slow start.
        status.connect()
        if not verbose:
            sys.stderr.write(PROTOCOL_LINE + "\n")
            sys.stderr.flush()
    elif not verbose and not _on_a_platform():
        _start_quiet("")


def _on_a_platform() -> bool:
    """Whether a platform gave this task its cluster: TF_CONFIG, or Vertex AI's CLUSTER_SPEC."""
    return any(os.environ.get(name, "").strip() for name in ("TF_CONFIG", "CLUSTER_SPEC"))


def start_launcher(verbose: bool) -> None:
    """Sets up the launcher's own console; call it first, before TensorFlow is imported.

    Its own log (TensorFlow's start-up, the pre-flight) is kept aside until
    `supervise.Launcher.start` moves it to `model_dir/logs/launcher.log`.

    Args:
      verbose: Keep everything on the console (`--verbose`).
    """
    formatter = _install_formatter()
    if not verbose:
        _start_quiet("[launcher] ", formatter)


def _start_quiet(label: str, formatter: Optional[LogFormatter] = None) -> None:
    """Sends descriptor 2 and absl's log to a temporary file; the console gets filtered lines."""
    global _quiet
    if _quiet is not None:
        return
    sys.stderr.flush()
    console_fd = os.dup(2)
    buffer = tempfile.TemporaryFile()
    log_fd = os.dup(buffer.fileno())
    buffer.close()
    os.dup2(log_fd, 2)  # TensorFlow's C++ log, and anything else written there.
    console = io.TextIOWrapper(
        io.FileIO(console_fd, "w"),
        encoding=getattr(sys.stderr, "encoding", None) or "utf-8",
        errors="backslashreplace",
        line_buffering=True,
    )
    sys.stderr = console
    _quiet = _Quiet(console, label, log_fd)
    absl_logging.get_absl_handler().python_handler.stream = _LogSink()
    _quiet.handler = _ConsoleHandler(_quiet, formatter or LogFormatter())
    logging.getLogger().addHandler(_quiet.handler)


def keep_log(model_dir: str, role: str) -> Optional[str]:
    """Moves the log kept aside to `model_dir/logs/<role>.log`, where it goes on.

    Call it once the job is valid and model_dir exists; it does nothing in a
    process that shows everything (under the launcher, on a platform, or
    verbose). A remote or unwritable model_dir gets a local file instead,
    which the console names.

    Returns:
      The log's path, or None when this process keeps no log aside.
    """
    quiet = _quiet
    if quiet is None:
        return None
    path = os.path.join(model_dir, LOG_DIR, f"{role}.log")
    if quiet.wanted == path:
        return quiet.path
    quiet.wanted = path
    try:
        if "://" in model_dir:
            raise OSError(0, "a remote model_dir")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as error:
        log_fd, local = tempfile.mkstemp(prefix=f"estimator_dist-{role}-", suffix=".log")
        quiet.say(f"cannot write {path} ({error.strerror}); the full log goes to {local}")
        path = local
    try:
        if quiet.path is None:  # Until now in the temporary file: copy what it holds.
            os.lseek(quiet.log_fd, 0, os.SEEK_SET)
            while chunk := os.read(quiet.log_fd, 1 << 20):
                os.write(log_fd, chunk)
        os.dup2(log_fd, 2)
    except OSError as error:
        os.close(log_fd)
        _give_up_log(quiet, error)
        return None
    os.close(quiet.log_fd)
    quiet.log_fd, quiet.path = log_fd, path
    return path


def _give_up_log(quiet: _Quiet, error: OSError) -> None:
    """After a failed write to the log, shows everything on the console from then on."""
    global _quiet
    _quiet = None
    logging.getLogger().removeHandler(quiet.handler)
    absl_logging.get_absl_handler().python_handler.stream = quiet.console
    with contextlib.suppress(OSError):
        os.dup2(quiet.console.fileno(), 2)
    quiet.say(
        f"cannot write {quiet.path or 'the log'} ({error.strerror}); the full log goes on here"
    )
