"""The suite's *precision* section: `--mixed_precision=bfloat16` against float32, and against Keras.

Issue 27's comparisons, each a group of runs back to back in every round
(`benchmarks.groups`), so that each ratio pairs runs of the same minutes:

* package bfloat16 / package float32 throughput, for `mnist_cnn`,
  `resnet_cifar` and MobileNetV2 (`--keras_model=mobilenet_v2`, at the
  *speedup* section's width), on 1 and on 2 workers x 64 examples;
* package bfloat16 / Keras `model.fit` under the `mixed_bfloat16` policy,
  same network, strategy and per-worker batch, 2 workers x 64
  (`benchmarks.keras_fit --mixed_precision=bfloat16`), for `mnist_cnn` and
  `resnet_cifar`;
* from the same runs, the 2-worker efficiency of each precision (2 workers
  / (2 x 1 worker)): less compute per step makes the all-reduce, which stays
  float32, a larger share of a step.

`--quick` runs a fifth of the steps, to check that every run works.

>>> [len(group) for group in groups(quick=False)]
[2, 2, 2, 2, 2, 2, 2, 2]
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Dict, List

from benchmarks.contenders import Config
from benchmarks.groups import Rounds, ratio, run_groups, run_record, summary

#: The flag of the package's bfloat16 runs (and of Keras' `mixed_bfloat16` ones).
BFLOAT16 = (("mixed_precision", "bfloat16"),)
#: Models of the package's bfloat16 / float32 comparison.
MODELS = ("mnist_cnn", "resnet_cifar", "mobilenet_v2")
#: Models Keras fit trains too.
KERAS_MODELS = ("mnist_cnn", "resnet_cifar")
#: Steps of a quick run, against a full one's.
QUICK_STEPS = 0.2
#: Issue 27's targets: bfloat16 / float32 at 2 workers x 64, package / Keras bfloat16.
TARGETS = {"bfloat16 / float32": 2.0, "package / keras, bfloat16": 1.5}


def groups(quick: bool) -> List[List[Config]]:
    """Each comparison's runs: (bfloat16, float32) per model and workers, then (package, Keras)."""
    steps = QUICK_STEPS if quick else 1.0
    made = []
    for model in MODELS:
        for workers in (1, 2):
            bfloat16 = Config(model=model, workers=workers, flags=BFLOAT16, steps_factor=steps)
            made.append([bfloat16, dataclasses.replace(bfloat16, flags=())])
    for model in KERAS_MODELS:
        package = Config(model=model, workers=2, flags=BFLOAT16, steps_factor=steps)
        made.append([package, dataclasses.replace(package, contender="keras")])
    return made


def section(settings: Rounds, quick: bool, measure_fn: Callable[[Config], float]) -> dict:
    """Runs every group for `settings.rounds` rounds; returns the ratios and the runs."""
    made = groups(quick)
    samples = run_groups(made, settings, measure_fn)
    measured: Dict[Config, List[float]] = {}
    for group, runs in zip(made, samples):
        if group[1].contender == "package":  # The package's own pairs, not those against Keras.
            measured.update(runs)
    comparisons = []
    for group, runs in zip(made, samples):
        top, bottom = group
        if bottom.contender == "keras":
            name, target = "package / keras, bfloat16", TARGETS["package / keras, bfloat16"]
        else:
            name = "bfloat16 / float32"
            target = TARGETS[name] if top.workers == 2 and top.model != "mobilenet_v2" else None
        comparisons.append(
            {
                "name": name,
                "model": top.model,
                "workers": top.workers,
                "target": target,
                **ratio(runs, top, bottom),
            }
        )
    efficiency, steps = [], made[0][0].steps_factor
    for model in MODELS:
        for flags in (BFLOAT16, ()):
            one, two = (
                Config(model=model, workers=n, flags=flags, steps_factor=steps) for n in (1, 2)
            )
            efficiency.append(
                {
                    "model": model,
                    "precision": "bfloat16" if flags else "float32",
                    "one_worker": summary(measured[one]),
                    "two_workers": summary(measured[two]),
                    "efficiency": ratio(measured, two, one, scale=2),
                }
            )
    return {"runs": run_record(samples), "comparisons": comparisons, "efficiency": efficiency}


def table(results: dict) -> List[str]:
    """The section's markdown: the ratios against their targets, then the efficiencies."""
    lines = [
        "| comparison | model | workers x 64 | median (range) | goal |",
        "|---|---|---|---|---|",
    ]
    for c in results["comparisons"]:
        goal = f">= {c['target']}" if c["target"] is not None else ""
        lines.append(
            f"| {c['name']} | {c['model']} | {c['workers']} | "
            f"{c['median']:.2f} ({c['min']:.2f}-{c['max']:.2f}) | {goal} |"
        )
    lines += [
        "",
        "| model | precision | 1 worker, examples/s | 2 workers, examples/s | efficiency |",
        "|---|---|---|---|---|",
    ]
    for row in results["efficiency"]:
        e = row["efficiency"]
        lines.append(
            f"| {row['model']} | {row['precision']} | {row['one_worker']['median']:,.0f} | "
            f"{row['two_workers']['median']:,.0f} | "
            f"{e['median']:.2f} ({e['min']:.2f}-{e['max']:.2f}) |"
        )
    return lines
