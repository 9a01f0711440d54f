"""Run entry points as real subprocesses, always bounded, never left behind.

Each command runs in a new session; on timeout its whole process group is
killed. A failed run raises with the command's output and every task log
found under `model_dir/logs`, so a red test shows what each worker said.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import signal
import subprocess
import sys
from typing import Optional, Sequence

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
    environ = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    environ.update({"TF_CPP_MIN_LOG_LEVEL": "1", "PYTHONUNBUFFERED": "1"})
    environ.update(env or {})
    command = [sys.executable, "-m", module, *args]
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env=environ,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
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


def _kill_group(pgid: int) -> None:
    """Kills whatever is left of the group: nothing, unless something leaked."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
