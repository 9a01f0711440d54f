"""The suite's *stacks* section: the same job on TensorFlow 2.21 and on TensorFlow 2.15.

Issue 33 asks what moving off TensorFlow 2.15 costs or gains. Both stacks are
installed side by side (`make test` builds `.venv` with TensorFlow 2.21,
`make test TF=2.15` builds `.venv-tf2.15`); each contender runs the same
launcher command with its venv's Python: 2 workers x 64 of `mnist_cnn` and of
`resnet_cifar` on the suite's random images in memory, cores pinned, no
evaluator. Each run gives two figures: the chief's steady global examples per
second after a warm-up (`common.step_rate`) and the launcher's time from its
start to the first training step of any task (start-up: imports, the
rendezvous, graph building, the servers). Contenders run interleaved round by
round, and each ratio TF 2.21 / TF 2.15 is taken within a round.

>>> [run.label() for run in runs(("mnist_cnn",))]
['mnist_cnn on TF 2.21', 'mnist_cnn on TF 2.15']
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Callable, Dict, List, Mapping, Sequence, Tuple

from benchmarks import common, startup_section
from benchmarks.contenders import Config, one_core_each, package_args
from benchmarks.groups import Rounds, summary

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Each stack's Python, as `make` builds their venvs.
PYTHONS = {
    "2.21": os.path.join(REPO, ".venv", "bin", "python"),
    "2.15": os.path.join(REPO, ".venv-tf2.15", "bin", "python"),
}
MODELS = ("mnist_cnn", "resnet_cifar")


@dataclasses.dataclass(frozen=True)
class StackRun:
    """One contender: a model on a TensorFlow stack."""

    stack: str
    model: str

    def label(self) -> str:
        """A short unique name, for tables and logs."""
        return f"{self.model} on TF {self.stack}"

    def config(self) -> Config:
        """The job: 2 workers x 64 of the model."""
        return Config(model=self.model, workers=2, per_worker_batch=64)


def runs(models: Sequence[str] = MODELS) -> List[StackRun]:
    """Every model on each stack, the newest stack first."""
    return [StackRun(stack, model) for model in models for stack in PYTHONS]


def launcher_command(run: StackRun, python: str, model_dir: str) -> List[str]:
    """The launcher command of `run` with `python`; only the Python differs between stacks.

    >>> launcher_command(StackRun("2.15", "mnist_cnn"), "py", "/tmp/m")[:6]
    ['py', '-m', 'estimator_dist.launch', '--num_workers=2', '--noevaluator', '--max_restarts=0']
    """
    config = run.config()
    steps, warmup = config.steps()
    return [
        python,
        "-m",
        "estimator_dist.launch",
        f"--num_workers={config.workers}",
        "--noevaluator",
        "--max_restarts=0",
        "--pin_cores",
        "--",
        *package_args(config, model_dir, steps, warmup),
    ]


def measure(run: StackRun, pythons: Mapping[str, str], timeout: float = 900) -> Tuple[float, float]:
    """Runs the job once; returns (steady global examples/s, seconds to the first step).

    Raises:
      BenchmarkError: if the stack's venv is missing, the launcher fails or the
        time runs out.
    """
    python = pythons[run.stack]
    if not os.path.exists(python):
        raise common.BenchmarkError(
            f"no Python for TensorFlow {run.stack} at {python}; build its venv first "
            f"(`make lint TF={run.stack}` in {REPO})."
        )
    config = run.config()
    with tempfile.TemporaryDirectory(prefix="bench-stacks-") as directory:
        model_dir = os.path.join(directory, "model")
        command = launcher_command(run, python, model_dir)
        env = {"TF_ENABLE_ONEDNN_OPTS": "1"}
        common.run_tasks([command], [env], [None], directory, timeout)
        with open(os.path.join(directory, "task-0.log"), encoding="utf-8") as log:
            first_step = startup_section.parse_startup(log.read())["first_step"]
        if first_step is None:
            raise common.BenchmarkError(f"{run.label()}: the launcher logged no first step")
        rate = common.step_rate(model_dir, config.steps()[1]) * config.global_batch
    return rate, first_step


def section(
    settings: Rounds,
    measure_fn: Callable[[StackRun], Tuple[float, float]],
    models: Sequence[str] = MODELS,
) -> dict:
    """Measures every contender round by round, interleaved.

    Returns:
      Each contender's samples of both figures (`runs`), and per model the
      ratios TF 2.21 / TF 2.15 of throughput and of start-up (`comparisons`).
    """
    contenders = {run.label(): run for run in runs(models)}
    rates: Dict[str, List[float]] = {label: [] for label in contenders}
    starts: Dict[str, List[float]] = {label: [] for label in contenders}
    for _, label in common.interleave(list(contenders), settings.rounds, settings.seed):
        rate, first_step = measure_fn(contenders[label])
        rates[label].append(rate)
        starts[label].append(first_step)
    comparisons = []
    for model in models:
        new, old = (StackRun(stack, model).label() for stack in PYTHONS)
        comparisons.append(
            {
                "model": model,
                "throughput": summary(common.paired_ratios(rates[new], rates[old])),
                "startup": summary(common.paired_ratios(starts[new], starts[old])),
            }
        )
    return {
        "cores": [sorted(cores) for cores in one_core_each(2)],
        "runs": [
            {
                "label": label,
                **dataclasses.asdict(run),
                "examples_per_second": summary(rates[label]),
                "first_step_seconds": summary(starts[label]),
            }
            for label, run in contenders.items()
        ],
        "comparisons": comparisons,
    }


def table(results: dict) -> List[str]:
    """The markdown table: each contender's figures, then the ratios per model."""
    lines = [
        "2 workers x 64 per worker, random images in memory, cores pinned, no evaluator; the "
        "same launcher command with each stack's venv (TF 2.21: `.venv`, TF 2.15: "
        "`.venv-tf2.15`). Medians (range) over rounds.",
        "",
        "| contender | examples/s | first step after (s) |",
        "|---|---|---|",
    ]
    for run in results["runs"]:
        rate, start = run["examples_per_second"], run["first_step_seconds"]
        lines.append(
            f"| {run['label']} | {rate['median']:,.0f} ({rate['min']:,.0f}-{rate['max']:,.0f}) "
            f"| {start['median']:.1f} ({start['min']:.1f}-{start['max']:.1f}) |"
        )
    lines += [
        "",
        "| model | throughput TF 2.21 / 2.15 | start-up TF 2.21 / 2.15 |",
        "|---|---|---|",
    ]
    for c in results["comparisons"]:
        t, s = c["throughput"], c["startup"]
        lines.append(
            f"| {c['model']} | {t['median']:.3f} ({t['min']:.3f}-{t['max']:.3f}) "
            f"| {s['median']:.3f} ({s['min']:.3f}-{s['max']:.3f}) |"
        )
    return lines
