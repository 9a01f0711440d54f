"""The suite's *speedup* section: issue 19's MobileNetV2 training-time table, reproduced in form.

The seeds trained Keras MobileNetV2 on TFDS `cats_vs_dogs` with
MirroredStrategy on one GPU and with MultiWorkerMirroredStrategy on two
machines, and reported the training time of the same examples (`SEEDS`):
1,622 s on one GPU, 858 s on two machines at the same global batch 64
(speed-up 1.89), 755 s at global batch 128 (2.15).

This section trains the package's `--keras_model=mobilenet_v2` through
`model_to_estimator` on the same three configurations (`runs`), with the
width and image size reduced so that it fits on 2 CPU cores (`ALPHA`,
`IMAGE_SIZE`, 2 classes as `cats_vs_dogs`), for a fixed number of examples:
one worker with MirroredStrategy and no TF_CONFIG, as the seeds' single
GPU; two workers, one core each, with MultiWorkerMirroredStrategy over RING.
Input is the suite's random images in memory (`synthetic`), so that
decoding on the two cores does not blur the comparison of the training
itself. The training time of a configuration is the examples over its
steady speed (the chief's `global_step/sec` after a warm-up of
`WARMUP_EXAMPLES`), so it leaves out start-up (about 40 s a job here, most
of it building MobileNetV2's graph); speed-ups are taken within a round
against the one-worker run, as every ratio of the suite.

>>> [run.label() for run in runs(quick=True)]
['1 worker, global batch 64', '2 workers, global batch 64', '2 workers, global batch 128']
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Callable, Dict, List, Sequence

from benchmarks import NEVER_STEPS, common
from benchmarks.contenders import one_core_each
from benchmarks.groups import Rounds, ratio, run_groups, run_record, summary

#: The seeds' training seconds of each configuration, by `SpeedupRun.label()`.
SEEDS = {
    "1 worker, global batch 64": 1622.0,
    "2 workers, global batch 64": 858.0,
    "2 workers, global batch 128": 755.0,
}
#: MobileNetV2's width multiplier and image side: 2 CPU cores instead of GPUs.
ALPHA = 0.35
IMAGE_SIZE = 96
NUM_CLASSES = 2
#: Examples every configuration trains on, and those left out of the timing.
EXAMPLES = 64 * 400
QUICK_EXAMPLES = 64 * 60
WARMUP_EXAMPLES = 64 * 20
#: Speed summaries written over the timed steps.
SUMMARIES = 10
#: The section's own directory under the suite's report directory.
DIRECTORY = "speedup"


@dataclasses.dataclass(frozen=True)
class SpeedupRun:
    """One configuration of the table.

    Attributes:
      workers: Training processes, one core each.
      global_batch: Examples of one step over all workers.
      examples: Examples trained on.
    """

    workers: int
    global_batch: int
    examples: int

    def __post_init__(self) -> None:
        if self.global_batch % self.workers:
            raise ValueError(
                f"global_batch {self.global_batch} must divide over {self.workers} workers."
            )
        if self.examples < 2 * WARMUP_EXAMPLES:
            raise ValueError(
                f"examples must be at least {2 * WARMUP_EXAMPLES} (twice the warm-up), "
                f"received {self.examples}."
            )

    def steps(self) -> int:
        """Global steps that train `examples`."""
        return self.examples // self.global_batch

    def warmup_steps(self) -> int:
        """Steps left out of the timing."""
        return WARMUP_EXAMPLES // self.global_batch

    def label(self) -> str:
        """The row's name, as in `SEEDS`."""
        noun = "worker" if self.workers == 1 else "workers"
        return f"{self.workers} {noun}, global batch {self.global_batch}"


def runs(quick: bool) -> List[SpeedupRun]:
    """The seeds' three configurations, training the same examples."""
    examples = QUICK_EXAMPLES if quick else EXAMPLES
    return [SpeedupRun(1, 64, examples), SpeedupRun(2, 64, examples), SpeedupRun(2, 128, examples)]


def train_args(run: SpeedupRun, model_dir: str) -> List[str]:
    """`estimator_dist.train` flags of every task of `run`."""
    timed = run.steps() - run.warmup_steps()
    return [
        f"--model_dir={model_dir}",
        "--keras_model=mobilenet_v2",
        "--input_fn=synthetic",
        f"--params=image_shape={IMAGE_SIZE}x{IMAGE_SIZE}x3,num_classes={NUM_CLASSES},"
        f"num_examples=1024,alpha={ALPHA}",
        f"--batch_size={run.global_batch}",
        f"--train_steps={run.steps()}",
        f"--log_step_count_steps={max(1, timed // SUMMARIES)}",
        f"--save_checkpoints_steps={NEVER_STEPS}",
        f"--save_summary_steps={NEVER_STEPS}",
        "--export=",
        "--eval_steps=1",
        "--communication=RING",
    ]


def measure(run: SpeedupRun, timeout: float = 1800) -> float:
    """Trains `run` once in fresh processes; returns its steady global examples per second.

    Raises:
      BenchmarkError: if a process fails or the time runs out.
    """
    with tempfile.TemporaryDirectory(prefix="bench-speedup-") as directory:
        model_dir = os.path.join(directory, "model")
        command = common.python_module("estimator_dist.train", *train_args(run, model_dir))
        onednn = {"TF_ENABLE_ONEDNN_OPTS": "1"}
        envs = (
            [onednn]
            if run.workers == 1
            else [{**onednn, "TF_CONFIG": c} for c in common.tf_configs(run.workers)]
        )
        common.run_tasks(
            [command] * run.workers, envs, one_core_each(run.workers), directory, timeout
        )
        return common.step_rate(model_dir, run.warmup_steps()) * run.global_batch


def section(settings: Rounds, quick: bool, measure_fn: Callable[[SpeedupRun], float]) -> dict:
    """Measures the three runs round by round (interleaved); the table's rows beside the seeds'.

    Returns:
      `examples`, the model, each run's samples (`runs`), and `rows`: per
      configuration its training seconds, its speed-up over one worker, and
      the seeds' seconds and speed-up.
    """
    group = runs(quick)
    (samples,) = run_groups([group], settings, measure_fn)
    one = group[0]
    rows = []
    for run in group:
        seconds = [run.examples / rate for rate in samples[run]]
        seed = SEEDS[run.label()]
        rows.append(
            {
                "label": run.label(),
                "workers": run.workers,
                "global_batch": run.global_batch,
                "seconds": summary(seconds),
                "speedup": ratio(samples, run, one),
                "seed_seconds": seed,
                "seed_speedup": SEEDS[one.label()] / seed,
            }
        )
    return {
        "examples": group[0].examples,
        "model": {"alpha": ALPHA, "image_size": IMAGE_SIZE, "num_classes": NUM_CLASSES},
        "runs": run_record([samples]),
        "rows": rows,
    }


def _range(values: Dict[str, float], digits: int) -> str:
    low, high = values["min"], values["max"]
    return f"{values['median']:,.{digits}f} ({low:,.{digits}f}-{high:,.{digits}f})"


def table(results: dict) -> List[str]:
    """The markdown table: measured seconds and speed-ups next to the seeds'."""
    model = results["model"]
    lines = [
        f"MobileNetV2 (alpha {model['alpha']:g}, {model['image_size']}x{model['image_size']} "
        f"images, {model['num_classes']} classes, `--keras_model=mobilenet_v2`), "
        f"{results['examples']:,} examples per configuration; training seconds leave out "
        "start-up. The seeds': `cats_vs_dogs`, full MobileNetV2 on GPUs.",
        "",
        "| configuration | seconds here | speed-up here | seeds' seconds | seeds' speed-up |",
        "|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        lines.append(
            f"| {row['label']} | {_range(row['seconds'], 1)} | {_range(row['speedup'], 2)} | "
            f"{row['seed_seconds']:,.0f} | {row['seed_speedup']:.2f} |"
        )
    return lines


def report_directory(sections: Sequence[str], output: str, given: bool) -> str:
    """Where a run's report goes: a run of this section alone into its own directory.

    Without `--output`, `--sections=speedup` writes `docs/benchmarks/speedup/`,
    so that it never replaces the full suite's report.

    >>> report_directory(["speedup"], "docs/benchmarks", given=False)
    'docs/benchmarks/speedup'
    """
    if list(sections) == [DIRECTORY] and not given:
        return os.path.join(output, DIRECTORY)
    return output
