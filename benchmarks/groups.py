"""Groups of configurations measured round by round, and the ratios paired within a round.

Configurations compared with each other form a group: each round runs every
group once, groups and their members in a shuffled order, so that a group's
runs are back to back, and a ratio is taken within each round before its
median and range (`ratio`).

>>> summary([3.0, 1.0, 2.0])["median"]
2.0
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any, Callable, Dict, List, Protocol, Sequence

from absl import logging

from benchmarks import common
from benchmarks.contenders import Config


class Rounds(Protocol):
    """How many rounds to run, and the seed of their order (`suite.Settings`)."""

    rounds: int
    seed: int


def summary(samples: Sequence[float]) -> Dict[str, Any]:
    """The samples, with their median, min and max."""
    return {"samples": list(samples), **common.summarize(samples)}


def run_groups(
    groups: Sequence[Sequence[Config]],
    settings: Rounds,
    measure_fn: Callable[[Config], float],
) -> List[Dict[Config, List[float]]]:
    """Measures every config of every group once per round; groups and members shuffled.

    A config in two groups is measured in each, so that each group's ratios
    pair runs that ran back to back.

    Returns:
      Per group, each config's samples, one per round, in round order.
    """
    rng = random.Random(settings.seed)
    samples: List[Dict[Config, List[float]]] = [{} for _ in groups]
    for round_index in range(settings.rounds):
        order = list(range(len(groups)))
        rng.shuffle(order)
        for index in order:
            members = list(groups[index])
            rng.shuffle(members)
            for config in members:
                started = time.monotonic()
                value = measure_fn(config)
                samples[index].setdefault(config, []).append(value)
                logging.info(
                    "round %d: %s: %.0f examples/s (%.0f s, load %.2f)",
                    round_index,
                    config.label(),
                    value,
                    time.monotonic() - started,
                    common.load_average(),
                )
    return samples


def ratio(
    samples: Dict[Config, List[float]], top: Config, bottom: Config, scale: float = 1.0
) -> dict:
    """`top` over `bottom` (divided by `scale`) in each round, and their summary."""
    ratios = [r / scale for r in common.paired_ratios(samples[top], samples[bottom])]
    return {"numerator": top.label(), "denominator": bottom.label(), **summary(ratios)}


def run_record(samples: Sequence[Dict[Config, List[float]]]) -> List[dict]:
    """Every measured config, with its samples and their summary."""
    return [
        {"label": c.label(), "config": dataclasses.asdict(c), **summary(v)}
        for group in samples
        for c, v in group.items()
    ]
