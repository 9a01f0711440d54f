"""The suite's *startup* section: the launcher's start to the first training step, by phase.

Each task logs its start-up phases at its first step (`estimator_dist.guards.startup`)
and the launcher the time of the first step of any task; `parse_startup`
reads both from the launcher's output.

>>> parse_startup("[launcher] first training step 9.5 s after the launcher started")
{'first_step': 9.5, 'tasks': {}}
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time

from benchmarks import common
from benchmarks.groups import summary

_PHASES = re.compile(r"task (\S+) start-up ([\d.]+) s: (.*)$")
_FIRST_STEP = re.compile(r"\[launcher\] first training step ([\d.]+) s after the launcher started")


def parse_startup(output: str) -> dict:
    """The launcher's time to the first step, and each task's phases, from its output."""
    first = _FIRST_STEP.search(output)
    tasks = {}
    for line in output.splitlines():
        match = _PHASES.search(line)
        if match:
            phases = dict(part.rsplit(" ", 2)[:2] for part in match.group(3).split(", "))
            tasks[match.group(1)] = {
                "total": float(match.group(2)),
                "phases": {name: float(seconds) for name, seconds in phases.items()},
            }
    return {"first_step": float(first.group(1)) if first else None, "tasks": tasks}


def measure(rounds: int) -> dict:
    """Seconds from the launcher's start to the first training step, 2 workers + evaluator.

    The job is `make demo`'s, with its embedded dataset already written once,
    as on every run after a user's first.
    """
    from input_fns import prepare_input

    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-startup-data-") as data_dir:
        prepare_input("digits", {"data_dir": data_dir})
        for _ in range(rounds):
            with tempfile.TemporaryDirectory(prefix="bench-startup-") as model_dir:
                started = time.monotonic()
                output = subprocess.run(
                    [
                        *common.python_module("estimator_dist.launch"),
                        "--num_workers=2",
                        "--evaluator",
                        "--timeout_secs=600",
                        "--",
                        f"--model_dir={model_dir}",
                        f"--data_dir={data_dir}",
                        "--train_steps=50",
                        "--communication=RING",
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=900,
                    env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
                ).stdout
                runs.append({**parse_startup(output), "wall": time.monotonic() - started})
    first_steps = [run["first_step"] for run in runs]
    return {"runs": runs, "first_step": summary(first_steps)}
