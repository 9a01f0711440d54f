"""The benchmark suite: every comparison of issue 6, side by side, in one run.

`run_suite(settings)` measures each section and returns one JSON-able dict;
`benchmarks.report` turns it into `docs/benchmarks/README.md` and plots.

Noise control: this machine's speed drifts by a fifth between minutes, so
configurations that are compared with each other form a *group*, run back
to back in a shuffled order within each round, and every ratio is taken
within a round (`common.paired_ratios`) before its median and range are
reported. Rounds repeat the whole set; each run is a fresh set of processes.

Sections:

* `overhead`: the package's own cost per step: against hand-written
  Estimator code, and against itself with the preemption watch off, 2
  workers x 64, at least `OVERHEAD_ROUNDS` rounds (its margin is 2%);
* `alternatives`: the package against Keras `model.fit` and Horovod (Gloo)
  at 64 per worker, and against hand-written Estimator code and Horovod at
  256, same model and data, 2 workers;
* `scaling`: 1, 2 and 3 workers, weak (fixed batch per worker) and strong
  (fixed global batch), `mnist_cnn` and `resnet_cifar`, RING and AUTO;
* `options`: each performance option's 2-worker efficiency and speed, next
  to the hardware limit (two separate jobs at once, one per core);
* `collectives`: all-reduce time against size, and the loopback floor;
* `startup`: the launcher's start to the first training step, by phase;
* `input`: input pipeline throughput against what training consumes;
* `speedup`: issue 19's MobileNetV2 training-time table: 1 worker, 2 workers
  at the same global batch and at twice it, beside the seeds' (`benchmarks.speedup`);
* `engines`: the same launcher job on a Ray cluster and on the local launcher
  (`benchmarks.engines`);
* `precision`: issue 27's `--mixed_precision=bfloat16` against float32 (mnist_cnn,
  resnet_cifar, MobileNetV2; 1 and 2 workers x 64) and against Keras `fit` with
  `mixed_bfloat16` (`benchmarks.precision_section`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from absl import logging

from benchmarks import (
    allreduce,
    common,
    engines,
    input_pipeline,
    precision_section,
    speedup,
    stacks,
    startup_section,
    storage_section,
)
from benchmarks.contenders import MODELS, Config, measure, one_core_each
from benchmarks.groups import ratio, run_groups, run_record, summary
from benchmarks.options_table import OPTIONS, QUICK_OPTIONS
from estimator_dist.hardware import cpus

SECTIONS = (
    "overhead",
    "alternatives",
    "scaling",
    "options",
    "collectives",
    "startup",
    "input",
    "speedup",
    "engines",
    "precision",
    "stacks",
    "storage",
)
#: Rounds of the overhead section at least (fewer with --quick): its target leaves a 2% margin,
#: within the spread of a ratio of two runs on this machine.
OVERHEAD_ROUNDS = 10
#: Target ratios of issue 6.
TARGETS = {
    "package / handwritten": 0.98,
    "package / keras": 3.0,
    "package / horovod": 1.0,
    "efficiency, 2 workers": 0.90,
    "startup seconds": 15.0,
    "preemption watch on / off": 0.98,
}
#: The package with its SIGTERM watch turned off, for the cost of watching.
PREEMPTION_OFF = (("preemption_checkpoint", "false"),)
#: Keras at its fastest: 20 steps per tf.function call (the tutorial leaves 1).
KERAS_FASTEST = (("steps_per_execution", "20"),)


@dataclasses.dataclass(frozen=True)
class Settings:
    """What the suite runs.

    Attributes:
      sections: Which of `SECTIONS` to run.
      rounds: Repetitions of every measurement.
      quick: Fewer configurations and shorter runs, for a check of the suite.
      horovod_python: A Python with Horovod (Gloo) and this package; empty
        to leave Horovod out.
      seed: Seed of the shuffled run order.
      scaling_models: Models of the scaling section.
      scaling_communications: Collective implementations of the scaling section.
    """

    sections: Tuple[str, ...] = SECTIONS
    rounds: int = 3
    quick: bool = False
    horovod_python: str = ""
    seed: int = 0
    scaling_models: Tuple[str, ...] = ("mnist_cnn", "resnet_cifar")
    scaling_communications: Tuple[str, ...] = ("RING", "AUTO")

    def __post_init__(self) -> None:
        unknown = sorted(set(self.sections) - set(SECTIONS))
        if unknown:
            raise ValueError(f"unknown sections {unknown}; valid: {', '.join(SECTIONS)}.")
        if self.rounds < 1:
            raise ValueError(f"rounds must be at least 1, received {self.rounds}.")
        unknown = sorted(set(self.scaling_models) - set(MODELS))
        if unknown or not self.scaling_models:
            raise ValueError(
                f"scaling models must be some of {', '.join(MODELS)}, received "
                f"{list(self.scaling_models)}."
            )
        unknown = sorted(set(self.scaling_communications) - {"RING", "AUTO"})
        if unknown or not self.scaling_communications:
            raise ValueError(
                f"scaling communications must be some of RING, AUTO, received "
                f"{list(self.scaling_communications)}."
            )


def _comparisons(groups: Sequence[Sequence[Config]], samples: Sequence[dict]) -> List[dict]:
    """The first config of each group (the package) against each other one, per round."""
    comparisons = []
    for group, measured in zip(groups, samples):
        package = group[0]
        for rival in group[1:]:
            if rival.flags == PREEMPTION_OFF:
                name = target = "preemption watch on / off"
            else:
                variant = " (steps_per_execution=20)" if rival.flags else ""
                target = f"package / {rival.contender}"
                name = f"{target}{variant}"
            comparison = {
                "name": name,
                "per_worker_batch": package.per_worker_batch,
                "target": TARGETS[target],
                **ratio(measured, package, rival),
            }
            logging.info(
                "%s, 2 workers x %d: median %.3f (%.3f-%.3f) over %d rounds, per round %s",
                name,
                package.per_worker_batch,
                comparison["median"],
                comparison["min"],
                comparison["max"],
                len(comparison["samples"]),
                " ".join(f"{ratio:.3f}" for ratio in comparison["samples"]),
            )
            comparisons.append(comparison)
    return comparisons


def overhead(settings: Settings, measure_fn: Callable[[Config], float]) -> dict:
    """The package against hand-written Estimator code and without its preemption watch.

    2 workers x 64 examples, where a step is shortest and the package's own
    per-step cost shows most; `OVERHEAD_ROUNDS` rounds at least, unless quick.
    """
    rounds = settings.rounds if settings.quick else max(settings.rounds, OVERHEAD_ROUNDS)
    measured_on = machine()
    # The ratio differs between processors (docs/performance.md keeps a row per CPU): say which.
    logging.info(
        "overhead section on %d cores of %s (%s), TensorFlow %s",
        measured_on["cores"],
        measured_on["cpu"] or "an unnamed CPU",
        " ".join(measured_on["cpu_flags"]) or "no AVX2",
        measured_on["tensorflow"],
    )
    group = [
        Config("package", workers=2),
        Config("handwritten", workers=2),
        Config(workers=2, flags=PREEMPTION_OFF),
    ]
    samples = run_groups([group], dataclasses.replace(settings, rounds=rounds), measure_fn)
    return {
        "rounds": rounds,
        "machine": measured_on,
        "runs": run_record(samples),
        "comparisons": _comparisons([group], samples),
    }


def alternatives(settings: Settings, measure_fn: Callable[[Config], float]) -> dict:
    """The package against Keras fit and Horovod, and hand-written Estimator code at 256."""
    batches = (64,) if settings.quick else (64, 256)
    groups = []
    for batch in batches:
        rivals = []
        if batch == 64:
            rivals += [
                Config("keras", workers=2, per_worker_batch=batch),
                Config("keras", workers=2, per_worker_batch=batch, flags=KERAS_FASTEST),
            ]
        else:
            # At 64 per worker, the overhead section compares it, over more rounds.
            rivals.append(Config("handwritten", workers=2, per_worker_batch=batch))
        if settings.horovod_python:
            rivals.append(Config("horovod", workers=2, per_worker_batch=batch))
        groups.append([Config("package", workers=2, per_worker_batch=batch), *rivals])
    samples = run_groups(groups, settings, measure_fn)
    return {"runs": run_record(samples), "comparisons": _comparisons(groups, samples)}


def scaling(settings: Settings, measure_fn: Callable[[Config], float]) -> dict:
    """Weak and strong scaling over 1, 2 and 3 workers, per model and collective."""
    weak_batch = {"mnist_cnn": 64, "resnet_cifar": 32}
    models = settings.scaling_models[:1] if settings.quick else settings.scaling_models
    communications = (
        settings.scaling_communications[:1] if settings.quick else settings.scaling_communications
    )
    workers = (1, 2, 3)
    groups, keys = [], []
    for model in models:
        for communication in communications:
            for mode in ("weak", "strong"):
                batch = weak_batch[model]
                group = [
                    Config(
                        model=model,
                        workers=n,
                        communication=communication,
                        per_worker_batch=batch if mode == "weak" else batch * 3 // n,
                    )
                    for n in workers
                ]
                groups.append(group)
                keys.append((model, communication, mode))
    samples = run_groups(groups, settings, measure_fn)
    curves = []
    for (model, communication, mode), group, measured in zip(keys, groups, samples):
        one = group[0]
        curves.append(
            {
                "model": model,
                "communication": communication,
                "mode": mode,
                "workers": [c.workers for c in group],
                "global_batch": [c.global_batch for c in group],
                "throughput": [summary(measured[c]) for c in group],
                "efficiency": [ratio(measured, c, one, scale=c.workers) for c in group],
            }
        )
    return {"runs": run_record(samples), "curves": curves, "cores": len(os.sched_getaffinity(0))}


def options(settings: Settings, measure_fn: Callable[[Config], float]) -> dict:
    """2-worker efficiency (against 1 worker with the same options) of each option."""
    names = QUICK_OPTIONS if settings.quick else tuple(OPTIONS)
    groups = []
    for name in names:
        flags, fields, _ = OPTIONS[name]
        groups.append([Config(workers=n, flags=flags, **fields) for n in (1, 2)])
    samples = run_groups(groups, settings, measure_fn)
    rows = []
    defaults = common.summarize(samples[0][groups[0][1]])["median"]
    for name, (one, two), measured in zip(names, groups, samples):
        rows.append(
            {
                "option": name,
                "update": OPTIONS[name][2],
                "one_worker": summary(measured[one]),
                "two_workers": summary(measured[two]),
                "efficiency": ratio(measured, two, one, scale=2),
                "speed_vs_defaults": common.summarize(measured[two])["median"] / defaults,
            }
        )
    return {
        "runs": run_record(samples),
        "options": rows,
        "target": TARGETS["efficiency, 2 workers"],
    }


def collectives(settings: Settings) -> dict:
    """All-reduce seconds against size (2 workers; RING, AUTO, bfloat16), and the floor."""
    sizes = allreduce.DEFAULT_SIZES[::2] if settings.quick else allreduce.DEFAULT_SIZES
    variants = {"RING float32": ("RING", "float32", 2)}
    if not settings.quick:
        variants.update(
            {
                "AUTO float32": ("AUTO", "float32", 2),
                "RING bfloat16": ("RING", "bfloat16", 2),
                "RING float32, 3 workers": ("RING", "float32", 3),
            }
        )
    seconds = 1.0 if settings.quick else 2.0
    measured: Dict[str, List[Dict[int, float]]] = {name: [] for name in variants}
    floors: List[Dict[int, float]] = []
    for _ in range(settings.rounds):
        floors.append(allreduce.measure_floor(sizes, seconds / 2, one_core_each(2)))
        for name, (communication, dtype, workers) in variants.items():
            measured[name].append(
                allreduce.benchmark(sizes, workers, seconds, communication, dtype)
            )

    def per_size(rounds: List[Dict[int, float]]) -> List[Dict[str, Any]]:
        return [summary([r[size] for r in rounds]) for size in sizes]

    return {
        "sizes": list(sizes),
        "bytes": [size * allreduce.FLOAT_BYTES for size in sizes],
        "allreduce": {name: per_size(rounds) for name, rounds in measured.items()},
        "floor": per_size(floors),
    }


def startup(settings: Settings) -> dict:
    """Seconds from the launcher's start to the first training step (`startup_section`)."""
    return {**startup_section.measure(settings.rounds), "target": TARGETS["startup seconds"]}


def input_throughput(settings: Settings) -> dict:
    """`benchmarks.input_pipeline`'s figures, with settings scaled to the suite."""
    rows = input_pipeline.benchmark(
        examples=5000 if settings.quick else 10000,
        seconds=4 if settings.quick else 6,
        batch=64,
        workers=2,
        shards=8,
        repeats=settings.rounds,
    )
    return {"rows": rows, "table": input_pipeline.format_rows(rows, 64, 2)}


#: The CPU flags that decide which kernels TensorFlow and oneDNN run, as /proc/cpuinfo names them.
VECTOR_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")


def machine() -> dict:
    """What the figures were measured on: cores, CPU model and vector flags, Python, TensorFlow.

    >>> set(machine()["cpu_flags"]) <= set(VECTOR_FLAGS)
    True
    """
    import tensorflow as tf

    model = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            model = next(line.split(":", 1)[1].strip() for line in cpuinfo if "model name" in line)
    except (OSError, StopIteration):
        pass
    flags = cpus.cpu_flags()
    return {
        "cores": len(os.sched_getaffinity(0)),
        "cpu": model,
        "cpu_flags": [flag for flag in VECTOR_FLAGS if flag in flags],
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "platform": platform.platform(),
    }


def run_suite(
    settings: Settings,
    measure_fn: Optional[Callable[[Config], float]] = None,
    on_section: Optional[Callable[[dict], None]] = None,
) -> dict:
    """Runs the chosen sections; returns every figure, with settings and machine.

    Args:
      settings: What to run.
      measure_fn: Measures one config in examples/s; `contenders.measure` by default.
      on_section: Called with the results so far after each section, to save
        them before a long run ends.
    """
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    if measure_fn is None:

        def measure_fn(config: Config) -> float:
            return measure(config, settings.horovod_python)

    results: Dict[str, Any] = {
        "schema": common.SCHEMA,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "settings": dataclasses.asdict(settings),
        "machine": machine(),
        "command": " ".join([os.path.basename(sys.executable), "-m", "benchmarks", *sys.argv[1:]]),
    }
    sections = {
        "overhead": lambda: overhead(settings, measure_fn),
        "alternatives": lambda: alternatives(settings, measure_fn),
        "scaling": lambda: scaling(settings, measure_fn),
        "options": lambda: options(settings, measure_fn),
        "collectives": lambda: collectives(settings),
        "startup": lambda: startup(settings),
        "input": lambda: input_throughput(settings),
        "speedup": lambda: speedup.section(settings, settings.quick, speedup.measure),
        "engines": lambda: engines.section(settings, engines.measure),
        "precision": lambda: precision_section.section(settings, settings.quick, measure_fn),
        "stacks": lambda: stacks.section(
            settings, lambda run: stacks.measure(run, stacks.PYTHONS), settings.scaling_models
        ),
        "storage": lambda: storage_section.measure(
            settings.rounds, 3000 if settings.quick else 10000
        ),
    }
    for name in settings.sections:
        started = time.monotonic()
        logging.info("section %s ...", name)
        results[name] = sections[name]()
        results[name]["seconds"] = time.monotonic() - started
        logging.info("section %s done in %.0f s", name, results[name]["seconds"])
        if on_section is not None:
            on_section(results)
    results["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    return results


def save(results: dict, path: str) -> None:
    """Writes the results as JSON."""
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(results, stream, indent=1, sort_keys=True)
        stream.write("\n")
