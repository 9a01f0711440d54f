"""What every benchmark shares: cores, clusters of real processes, statistics.

Each measurement runs in fresh processes, each pinned to its own core when
cores allow (`contenders.one_core_each`), so a figure never depends on what an earlier
measurement left behind in the process. Contenders are interleaved round by
round (`interleave`), so a slow spell of the machine hits them alike, and
ratios are taken per round (`paired_ratios`) before their median.

>>> summarize([3.0, 1.0, 2.0])["median"]
2.0
>>> paired_ratios([2.0, 4.0], [1.0, 2.0])
[2.0, 2.0]
"""

from __future__ import annotations

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from typing import AbstractSet, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import portpicker

#: Version of the results file's layout.
SCHEMA = "estimator_dist.benchmarks/1"


class BenchmarkError(RuntimeError):
    """A measurement failed; the message carries every process's log tail."""


def summarize(samples: Sequence[float]) -> Dict[str, float]:
    """Median, min and max of `samples` (at least one)."""
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
    }


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> List[float]:
    """Ratio per round: the i-th numerator over the i-th denominator."""
    if len(numerators) != len(denominators):
        raise ValueError(
            f"paired ratios need as many numerators as denominators, received "
            f"{len(numerators)} and {len(denominators)}."
        )
    return [a / b for a, b in zip(numerators, denominators)]


def interleave(contenders: Sequence[str], rounds: int, seed: int = 0) -> Iterator[Tuple[int, str]]:
    """Yields (round, contender), every contender once a round, in a shuffled order.

    >>> sorted(c for r, c in interleave(["a", "b"], 2))
    ['a', 'a', 'b', 'b']
    """
    rng = random.Random(seed)
    for round_index in range(rounds):
        order = list(contenders)
        rng.shuffle(order)
        for contender in order:
            yield round_index, contender


def load_average() -> float:
    """The 1-minute load average, recorded next to each measurement."""
    with open("/proc/loadavg", encoding="ascii") as f:
        return float(f.read().split()[0])


def tf_configs(num_workers: int, host: str = "localhost") -> List[str]:
    """TF_CONFIG of each task of a cluster of one chief and `num_workers - 1` workers."""
    addresses = [f"{host}:{portpicker.pick_unused_port()}" for _ in range(num_workers)]
    cluster = {"chief": addresses[:1]}
    if num_workers > 1:
        cluster["worker"] = addresses[1:]
    tasks = [("chief", 0)] + [("worker", i) for i in range(num_workers - 1)]
    return [
        json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})
        for kind, index in tasks
    ]


def _tail(path: str, lines: int = 30) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def run_tasks(
    commands: Sequence[Sequence[str]],
    envs: Sequence[Mapping[str, str]],
    cores: Sequence[Optional[AbstractSet[int]]],
    log_dir: str,
    timeout: float,
) -> List[float]:
    """Runs one process per command, each pinned to its cores (None: not pinned), until all end.

    Every process gets its own session so that one kill reaches its
    children. On a failure or after `timeout` seconds every process is
    killed.

    Returns:
      Seconds from start to exit of each process.

    Raises:
      BenchmarkError: when a process fails or the time runs out, with each
        process's last log lines.
    """
    os.makedirs(log_dir, exist_ok=True)
    procs, logs = [], []
    started = time.monotonic()
    for index, (command, env, core) in enumerate(zip(commands, envs, cores)):
        log = os.path.join(log_dir, f"task-{index}.log")
        logs.append(log)
        with open(log, "wb") as out:
            procs.append(
                subprocess.Popen(
                    list(command),
                    env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **env},
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=None
                    if core is None
                    else lambda core=core: os.sched_setaffinity(0, core),
                )
            )
    ended: Dict[int, float] = {}
    failure = None
    while len(ended) < len(procs) and failure is None:
        for index, proc in enumerate(procs):
            if index in ended or proc.poll() is None:
                continue
            ended[index] = time.monotonic() - started
            if proc.returncode != 0:
                failure = f"task {index} exited with {proc.returncode}"
        if time.monotonic() - started > timeout:
            failure = f"timed out after {timeout:.0f} s"
        elif len(ended) < len(procs):
            try:
                procs[min(set(range(len(procs))) - set(ended))].wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
    if failure is not None:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        tails = "\n".join(
            f"--- task {i} ({logs[i]}) ---\n{_tail(logs[i])}" for i in range(len(logs))
        )
        raise BenchmarkError(f"{' '.join(commands[0][:4])}...: {failure}\n{tails}")
    return [ended[i] for i in range(len(procs))]


def python_module(module: str, *args: str) -> List[str]:
    """The command that runs `python -m module args...` with this interpreter."""
    return [sys.executable, "-m", module, *args]


def step_rate(model_dir: str, skip_steps: int) -> float:
    """Global steps per second of a finished Estimator training, from its events.

    Uses the chief's `global_step/sec` summaries (written every
    `log_step_count_steps`): steps between the first summary at or after
    `skip_steps` and the last one, over the wall time between them. Timed from
    outside the model_fn and the hooks, the same way for every Estimator
    contender.

    Raises:
      BenchmarkError: if fewer than two summaries lie after `skip_steps`.
    """
    import glob

    import tensorflow as tf

    points = []
    for path in glob.glob(os.path.join(model_dir, "events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            if any(v.tag == "global_step/sec" for v in event.summary.value):
                points.append((event.step, event.wall_time))
    points = sorted(p for p in points if p[0] >= skip_steps)
    if len(points) < 2:
        raise BenchmarkError(
            f"{model_dir} has {len(points)} global_step/sec summaries after step {skip_steps}; "
            "train more steps or log them more often."
        )
    (first_step, first_time), (last_step, last_time) = points[0], points[-1]
    return (last_step - first_step) / (last_time - first_time)
