"""Run entry points as real subprocesses, always bounded, never left behind.

Each command runs in a new session; on timeout its whole process group is
killed. A failed run raises with the command's output and every task log
found under `model_dir/logs`, so a red test shows what each worker said.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import glob
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass
class Run:
    """A finished command."""

    args: Sequence[str]
    returncode: int
    output: str
    model_dir: Optional[str]

    def logs(self) -> str:
        """Returns the task logs the launcher wrote, each under a header."""
        if not self.model_dir:
            return ""
        parts = []
        for path in sorted(glob.glob(os.path.join(self.model_dir, "logs", "*.log"))):
            with open(path, errors="replace") as stream:
                parts.append(f"===== {os.path.basename(path)} =====\n{stream.read()}")
        return "\n".join(parts)

    def describe(self) -> str:
        return (
            f"command {' '.join(self.args)} exited {self.returncode}\n"
            f"----- output -----\n{self.output}\n{self.logs()}"
        )

    def json(self, name: str) -> dict:
        with open(os.path.join(self.model_dir, name)) as stream:
            return json.load(stream)


def start_module(
    module: str, args: Sequence[str], env: Optional[dict] = None, prefix: Sequence[str] = ()
) -> subprocess.Popen:
    """Starts `python -m module args...` from the repository root in a new session.

    TF_CONFIG is removed from the environment unless `env` gives it; `prefix`
    runs the command under another one, such as `ip netns exec NAME`.
    """
    environ = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    environ.update({"TF_CPP_MIN_LOG_LEVEL": "1", "PYTHONUNBUFFERED": "1"})
    environ.update(env or {})
    return subprocess.Popen(
        [*prefix, sys.executable, "-m", module, *args],
        cwd=REPO,
        env=environ,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        # A shell starts background jobs with SIGINT ignored, and children inherit
        # that; the tasks under test get SIGINT's default, as from a terminal.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def run_module(
    module: str,
    args: Sequence[str],
    timeout: float,
    env: Optional[dict] = None,
    model_dir: Optional[str] = None,
    check: bool = True,
) -> Run:
    """Runs `python -m module args...` in its own process group.

    Args:
      module: e.g. `estimator_dist.launch`.
      args: Command-line arguments.
      timeout: Seconds before the whole process group is killed.
      env: Extra environment variables; TF_CONFIG is removed unless given.
      model_dir: Where to look for task logs when reporting a failure.
      check: Raise AssertionError with all logs unless the exit code is 0.

    Returns:
      The finished `Run`.
    """
    process = start_module(module, args, env)
    command = process.args
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        output, _ = process.communicate()
        run = Run(command, process.returncode, output, model_dir)
        raise AssertionError(f"timed out after {timeout} s; killed.\n{run.describe()}") from None
    finally:
        _kill_group(process.pid)
    run = Run(command, process.returncode, output, model_dir)
    if check and run.returncode != 0:
        raise AssertionError(run.describe())
    return run


def run_modules(
    commands: Sequence[tuple], timeout: float, start_after: Optional[Callable[[], bool]] = None
) -> list:
    """Runs several `(module, args, model_dir)` commands at once; fails if any fails.

    Each command gets `timeout` and its own process group. With
    `start_after`, the first command starts alone and the others once the
    condition holds (checked every 0.2 s, failing if the first command ends
    or `timeout` passes first). When any run fails, the error shows every
    run's output and task logs.
    """
    with concurrent.futures.ThreadPoolExecutor(len(commands)) as pool:

        def submit(module: str, args: Sequence[str], model_dir: Optional[str]) -> Any:
            return pool.submit(run_module, module, args, timeout, model_dir=model_dir, check=False)

        futures = [submit(*commands[0])]
        if start_after is not None:
            deadline = time.monotonic() + timeout
            while not start_after():
                if futures[0].done() or time.monotonic() > deadline:
                    run = futures[0].result()
                    raise AssertionError(f"the condition to go on never held.\n{run.describe()}")
                time.sleep(0.2)
        futures += [submit(*command) for command in commands[1:]]
        runs = [future.result() for future in futures]
    if any(run.returncode != 0 for run in runs):
        raise AssertionError("\n\n".join(run.describe() for run in runs))
    return runs


def _kill_group(pgid: int) -> None:
    """Kills whatever is left of the group: nothing, unless something leaked."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Background:
    """A module run in the background in its own process group, read line by line.

    Use as a context manager: on exit the whole group is killed, whatever
    happened, and the output so far is kept in `lines`.
    """

    def __init__(
        self,
        module: str,
        args: Sequence[str],
        env: Optional[dict] = None,
        prefix: Sequence[str] = (),
    ) -> None:
        self.lines: list = []
        self._queue: queue.Queue[Optional[str]] = queue.Queue()
        self.process = start_module(module, args, env, prefix)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self._queue.put(line)
        self._queue.put(None)

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match:
        """Returns the first match of `pattern` in a new output line; fails at timeout or EOF."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self._queue.get(timeout=max(0.0, remaining))
            except queue.Empty:
                raise AssertionError(
                    f"no line matching {pattern!r} in {timeout} s:\n" + "".join(self.lines)
                ) from None
            if line is None:
                raise AssertionError(
                    f"output ended before a line matching {pattern!r}:\n" + "".join(self.lines)
                )
            self.lines.append(line)
            match = re.search(pattern, line)
            if match:
                return match

    def wait(self, timeout: float) -> int:
        """Waits for the process to exit and drains its output; returns the exit code."""
        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"still running after {timeout} s:\n{self.output}") from None
        while (line := self._queue.get(timeout=timeout)) is not None:
            self.lines.append(line)
        return code

    @property
    def output(self) -> str:
        """Everything read so far."""
        return "".join(self.lines)

    def __enter__(self) -> Background:
        return self

    def __exit__(self, *exc_info: object) -> None:
        _kill_group(self.process.pid)
        self.process.wait()
