"""Is the input pipeline the bottleneck? Input throughput per worker against training consumption.

  .venv/bin/python -m benchmarks.input_pipeline

For an MNIST-shaped (28x28x1) and a CIFAR-shaped (32x32x3) dataset, written
as sharded TFRecord files by the `convert` library, it measures side by
side, each in its own process pinned to one CPU core (what one worker of a
2-worker job gets on a 2-core machine) with one intra- and one inter-op
thread for training, as in FACTS.md:

1. input alone: examples/s that the `tfrecord` input_fn of worker 0 of
   `--workers` delivers (read, check, shuffle, batch, parse, scale);
2. training, synthetic input: examples/s that Estimator training of the model
   consumes when input costs nothing (`synthetic` input_fn, cached in memory);
3. training, TFRecord input: the same training reading the TFRecord files;
4. the same with `cache=true`: records are read and checked in the first
   epoch only.

Each input_fn runs as the package hands it to Estimator (`present_input_fn`:
tf.data autotuning off, see `estimator_dist.tf_runtime.patches`).

The pipeline can feed training when (1) / (2) is above 1; (3) / (2) then
shows what the pipeline's CPU time costs training when both share one core.
The model is `resnet_cifar` for 32x32x3 when it is registered, otherwise
`mnist_cnn` on 32x32x3 inputs, which consumes more examples per second than
a ResNet would, so its ratios are lower bounds.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List, Sequence

import tensorflow as tf
from absl import app, flags

from benchmarks import NEVER_STEPS

SHAPES = {"mnist": (28, 28, 1), "cifar": (32, 32, 3)}
WARMUP_STEPS = 20


def write_data(directory: str, shape: tuple, count: int, shards: int) -> str:
    """Writes random images of `shape` as TFRecord files; returns the tfrecord `--params`."""
    import numpy as np

    from input_fns.convert import ConvertConfig, convert, training_params

    rng = np.random.RandomState(0)
    arrays = os.path.join(directory, "arrays.npz")
    np.savez(
        arrays,
        image=rng.randint(0, 256, (count, *shape), dtype=np.uint8),
        label=rng.randint(0, 10, count),
    )
    output = os.path.join(directory, "tfrecord")
    return training_params(convert(ConvertConfig(f"npz:{arrays}", output, shards)), output)


def measure_input(params: dict, workers: int, seconds: float) -> float:
    """Examples/s that worker 0's tfrecord input_fn delivers."""
    from estimator_dist.task.user_code import call_input_fn, present_input_fn
    from input_fns import tfrecord

    context = tf.distribute.InputContext(workers, 0, workers)
    input_fn = present_input_fn(tfrecord.input_fn, params)
    batches = iter(call_input_fn(input_fn, tf.estimator.ModeKeys.TRAIN, input_context=context))
    for _ in range(WARMUP_STEPS):
        next(batches)
    count, started = 0, time.monotonic()
    while time.monotonic() - started < seconds:
        features, _ = next(batches)
        count += int(features["image"].shape[0])
    return count / (time.monotonic() - started)


class StepTimer(tf.estimator.SessionRunHook):
    """Times training steps after a warm-up, and stops training after `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.steps = 0
        self.started = 0.0
        self.elapsed = 0.0

    def after_run(
        self, run_context: tf.estimator.SessionRunContext, run_values: tf.estimator.SessionRunValues
    ) -> None:
        self.steps += 1
        if self.steps == WARMUP_STEPS:
            self.started = time.monotonic()
        elif self.steps > WARMUP_STEPS:
            self.elapsed = time.monotonic() - self.started
            if self.elapsed >= self.seconds:
                run_context.request_stop()

    def rate(self, batch: int) -> float:
        return (self.steps - WARMUP_STEPS) * batch / self.elapsed


def measure_training(model: str, input_name: str, params: dict, seconds: float) -> float:
    """Examples/s one Estimator worker trains at, after a warm-up, with 1+1 threads."""
    from estimator_dist.task.user_code import present_input_fn
    from input_fns import INPUT_FNS
    from model_fns import MODEL_FNS

    tf.compat.v1.disable_eager_execution()
    input_fn = present_input_fn(INPUT_FNS.get(input_name), params)
    session = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=1, inter_op_parallelism_threads=1
    )
    with tempfile.TemporaryDirectory() as model_dir:
        config = tf.estimator.RunConfig(
            model_dir=model_dir,
            session_config=session,
            save_checkpoints_steps=NEVER_STEPS,
            save_summary_steps=NEVER_STEPS,
            log_step_count_steps=10**9,
        )
        estimator = tf.estimator.Estimator(
            MODEL_FNS.get(model), config=config, params={"batch_size": params["batch_size"]}
        )
        timer = StepTimer(seconds)
        estimator.train(input_fn, steps=10**9, hooks=[timer])
    return timer.rate(params["batch_size"])


def run_child(spec: dict) -> float:
    """One measurement, in this process, on the given core."""
    os.sched_setaffinity(0, {spec["cpu"]})
    if spec["kind"] == "input":
        return measure_input(spec["params"], spec["workers"], spec["seconds"])
    return measure_training(spec["model"], spec["input"], spec["params"], spec["seconds"])


def in_child(**spec: object) -> float:
    """Runs one measurement in a fresh process pinned to one core; returns examples/s."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    output = subprocess.run(
        [sys.executable, "-m", "benchmarks.input_pipeline", f"--child={json.dumps(spec)}"],
        check=True,
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    ).stdout
    return float(output.strip().splitlines()[-1])


FIGURES = ("input_alone", "training_synthetic", "training_tfrecord", "training_cached")


def benchmark(
    examples: int, seconds: float, batch: int, workers: int, shards: int, repeats: int
) -> List[dict]:
    """Measures every figure `repeats` times, in turn, for both shapes; one row per shape.

    Each figure of a row is the list of its measurements.
    """
    from estimator_dist.base.params import parse_params_flag
    from model_fns import MODEL_FNS

    rows = []
    cpu = sorted(os.sched_getaffinity(0))[0]
    for name, shape in SHAPES.items():
        model = "resnet_cifar" if name == "cifar" and "resnet_cifar" in MODEL_FNS else "mnist_cnn"
        synthetic = {
            "batch_size": batch,
            "image_shape": "x".join(map(str, shape)),
            "num_examples": 1024,
            "seed": 0,
        }
        row = {"shape": "x".join(map(str, shape)), "model": model}
        row.update({figure: [] for figure in FIGURES})
        with tempfile.TemporaryDirectory(prefix=f"bench-{name}-") as directory:
            params = parse_params_flag(write_data(directory, shape, examples, shards))
            params.update(seed=0)
            single = {**params, "batch_size": batch}
            specs = {
                "input_alone": dict(
                    kind="input", params={**params, "batch_size": batch * workers}, workers=workers
                ),
                "training_synthetic": dict(kind="train", input="synthetic", params=synthetic),
                "training_tfrecord": dict(kind="train", input="tfrecord", params=single),
                "training_cached": dict(
                    kind="train", input="tfrecord", params={**single, "cache": True}
                ),
            }
            # In turn, so that a slow spell of the machine hits every figure alike.
            for _ in range(repeats):
                for figure, spec in specs.items():
                    row[figure].append(in_child(cpu=cpu, model=model, seconds=seconds, **spec))
        rows.append(row)
    return rows


def format_rows(rows: Sequence[dict], batch: int, workers: int) -> str:
    """The results as a table of medians (and ranges), ratios of medians included."""
    lines = [
        f"Per worker: one CPU core, batch {batch}, data sharded over {workers} workers; "
        f"examples/s, median (min-max) of {len(rows[0]['input_alone'])} runs.",
        "| input shape | model | input alone | training, synthetic input | input / training "
        "| training, TFRecord input | TFRecord / synthetic | training, TFRecord, cache=true "
        "| cached / synthetic |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        median = {figure: statistics.median(row[figure]) for figure in FIGURES}
        cell = {
            figure: f"{median[figure]:,.0f} ({min(row[figure]):,.0f}-{max(row[figure]):,.0f})"
            for figure in FIGURES
        }
        synthetic = median["training_synthetic"]
        lines.append(
            f"| {row['shape']} | {row['model']} | {cell['input_alone']} | "
            f"{cell['training_synthetic']} | {median['input_alone'] / synthetic:.1f}x | "
            f"{cell['training_tfrecord']} | {median['training_tfrecord'] / synthetic:.2f} | "
            f"{cell['training_cached']} | {median['training_cached'] / synthetic:.2f} |"
        )
    return "\n".join(lines)


def define_flags() -> None:
    """Defines this program's flags (only when it runs as a program)."""
    flags.DEFINE_integer("examples", 20_000, "Examples per dataset.", lower_bound=1000)
    flags.DEFINE_float("seconds", 10.0, "Measuring time per figure.", lower_bound=1.0)
    flags.DEFINE_integer("per_worker_batch", 64, "Examples per worker per step.", lower_bound=1)
    flags.DEFINE_integer("workers", 2, "Workers the data is sharded over.", lower_bound=1)
    flags.DEFINE_integer("num_shards", 8, "TFRecord files per dataset.", lower_bound=1)
    flags.DEFINE_integer("repeats", 3, "Measurements of each figure.", lower_bound=1)
    flags.DEFINE_string("child", None, "Internal: run one measurement (JSON) and print it.")


def main(argv: Sequence[str]) -> int:
    """Runs the benchmark (or, with --child, one measurement) and prints the results."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {list(argv[1:])}", exitcode=2)
    f = flags.FLAGS
    if f.child:
        print(run_child(json.loads(f.child)), flush=True)
        return 0
    rows = benchmark(
        f.examples,
        f.seconds,
        f.per_worker_batch,
        f.workers,
        f.num_shards,
        f.repeats,
    )
    print(format_rows(rows, f.per_worker_batch, f.workers), flush=True)
    return 0


if __name__ == "__main__":
    define_flags()
    app.run(main)
