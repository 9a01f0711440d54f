"""The suite's *engines* section: the same job on Ray (`--engine=ray`) and with the local launcher.

Issue 17 asks that a job run through Ray keep the local launcher's speed
(ratio >= 0.98). Both contenders run the same launcher command, 2 workers x 64
of `mnist_cnn` on the suite's random images in memory, with no evaluator, and
are timed the same way: the chief's steady `global_step/sec` after a warm-up
(`common.step_rate`), so start-up (Ray's placement group and actors, the
local launcher's network namespace) is left out.

The Ray cluster is `ray.cluster_utils.Cluster` on this machine: a head and a
second node of one CPU each, so that the default `STRICT_SPREAD` placement
puts each worker on a node of its own. Ray does not pin a task to a core; the
local launcher does by default (`--pin_cores`), so the local launcher is
measured both ways, and the section reports Ray against each.

>>> [run.label() for run in runs()]
['local', 'local --nopin_cores', 'ray']
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Callable, List, Optional

from benchmarks import common
from benchmarks.contenders import STEPS, Config, package_args
from benchmarks.groups import Rounds, ratio, run_groups, run_record

#: The job every contender runs: the overhead section's configuration.
JOB = Config(workers=2, per_worker_batch=64)
#: The issue's target for Ray against the local launcher.
TARGET = 0.98


@dataclasses.dataclass(frozen=True)
class EngineRun:
    """One contender: the launcher with an engine.

    Attributes:
      engine: `local` or `ray`.
      pin_cores: The local launcher's `--pin_cores`.
    """

    engine: str
    pin_cores: bool = True

    def label(self) -> str:
        """A short unique name, for tables and logs."""
        return self.engine + ("" if self.pin_cores or self.engine == "ray" else " --nopin_cores")


def runs() -> List[EngineRun]:
    """The local launcher, pinned and not, and the Ray engine."""
    return [EngineRun("local"), EngineRun("local", pin_cores=False), EngineRun("ray")]


def launcher_args(run: EngineRun, ray_address: Optional[str], model_dir: str) -> List[str]:
    """The launcher command line of `run`, the training flags after `--`.

    >>> launcher_args(EngineRun("ray"), "127.0.0.1:6379", "/tmp/m")[:3]
    ['--engine=ray', '--ray_address=127.0.0.1:6379', '--num_workers=2']
    """
    steps, warmup = JOB.steps()
    engine = [f"--engine={run.engine}"]
    if run.engine == "ray":
        engine.append(f"--ray_address={ray_address}")
    else:
        engine.append("--pin_cores" if run.pin_cores else "--nopin_cores")
    return [
        *engine,
        f"--num_workers={JOB.workers}",
        "--noevaluator",
        "--max_restarts=0",
        "--",
        *package_args(JOB, model_dir, steps, warmup),
    ]


def measure(run: EngineRun, ray_address: Optional[str], timeout: float = 900) -> float:
    """Runs the launcher once; returns the job's steady global examples per second.

    Raises:
      BenchmarkError: if the launcher fails or the time runs out.
    """
    with tempfile.TemporaryDirectory(prefix="bench-engines-") as directory:
        model_dir = os.path.join(directory, "model")
        command = common.python_module(
            "estimator_dist.launch", *launcher_args(run, ray_address, model_dir)
        )
        env = {"TF_ENABLE_ONEDNN_OPTS": "1"}
        common.run_tasks([command], [env], [None], directory, timeout)
        return common.step_rate(model_dir, JOB.steps()[1]) * JOB.global_batch


def section(settings: Rounds, measure_fn: Callable[[EngineRun, str], float]) -> dict:
    """Starts a 2-node Ray cluster, measures every contender round by round, stops the cluster.

    Returns:
      Each contender's samples (`runs`) and `comparisons`: Ray against the
      local launcher pinned and not, per-round ratios with their summary.
    """
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        group = runs()
        (samples,) = run_groups([group], settings, lambda run: measure_fn(run, cluster.address))
    finally:
        cluster.shutdown()
    ray_run = group[2]
    return {
        "job": dataclasses.asdict(JOB),
        "steps": STEPS[JOB.model],
        "runs": run_record([samples]),
        "comparisons": [
            {"name": f"ray / {local.label()}", "target": TARGET, **ratio(samples, ray_run, local)}
            for local in group[:2]
        ],
    }


def table(results: dict) -> List[str]:
    """The markdown table of the comparisons."""
    lines = [
        "2 workers x 64 of `mnist_cnn`, no evaluator, the same launcher command; Ray on a "
        "2-node `ray.cluster_utils.Cluster` on this machine (one CPU per node).",
        "",
        "| comparison | goal | median (range) | rounds |",
        "|---|---|---|---|",
    ]
    for c in results["comparisons"]:
        lines.append(
            f"| {c['name']} | >= {c['target']:g} | {c['median']:.3f} "
            f"({c['min']:.3f}-{c['max']:.3f}) | {len(c['samples'])} |"
        )
    return lines
