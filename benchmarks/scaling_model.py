"""A model of synchronous data-parallel step time, to size a cluster before renting it.

One training step on N workers computes its micro-batch, then all-reduces
the gradients (S bytes) once the backward pass is done (the profile in
docs/performance.md shows no overlap), then applies them:

  T(N)        = T_c * ceil(N / cores) + T_ar(N, S) / k
  T_ar(N, S)  = 2 (N - 1) a + 2 (N - 1) / N * S / b

`T_ar` is a ring all-reduce: N - 1 reduce-scatter and N - 1 all-gather
steps, each paying a latency `a` and moving S / N bytes at bandwidth `b`.
`T_c` is one worker's step time measured alone; `ceil(N / cores)` counts
workers that share a core on this machine (3 workers on 2 cores); k is the
number of accumulated micro-batches (`--gradient_accumulation_steps`), and
`--gradient_wire_dtype=bfloat16` halves S. Weak-scaling efficiency is
T_c / T(N) (k times the work per all-reduce with accumulation).

`a` and `b` are fitted to the 2-worker all-reduce times of `benchmarks.allreduce`
(least squares on relative error); `NCCL_CLASS` stands for GPUs on a
100 Gb/s fabric, the bandwidth and latency NCCL reaches there.

>>> network = Network("example", latency=1e-4, bandwidth=1e9)
>>> round(ring_allreduce_seconds(network, 2, 1_000_000), 6)
0.0012
>>> round(efficiency(0.004, network, 2, 1_000_000), 3)
0.769
"""

from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class Network:
    """How fast a ring all-reduce step is.

    Attributes:
      name: For tables and plots.
      latency: Seconds each of the 2 (N - 1) ring steps costs besides its bytes.
      bandwidth: Bytes per second each step moves.
    """

    name: str
    latency: float
    bandwidth: float


NCCL_CLASS = Network("NCCL-class (10 us, 12.5 GB/s)", latency=10e-6, bandwidth=12.5e9)


def ring_allreduce_seconds(network: Network, workers: int, nbytes: float) -> float:
    """Seconds a ring all-reduce of `nbytes` takes over `workers` workers (0 for one)."""
    if workers < 2:
        return 0.0
    steps = 2 * (workers - 1)
    return steps * network.latency + steps / workers * nbytes / network.bandwidth


def fit_ring(
    name: str, nbytes: Sequence[float], seconds: Sequence[float], workers: int = 2
) -> Network:
    """Fits latency and bandwidth to measured all-reduce times (relative least squares).

    Raises:
      ValueError: with fewer than two sizes, or a fit that is not physical.
    """
    if len(nbytes) < 2 or len(nbytes) != len(seconds):
        raise ValueError(f"need two or more (size, seconds) pairs, received {len(nbytes)} sizes.")
    steps = 2 * (workers - 1)
    t = np.asarray(seconds, float)
    design = np.stack([np.full_like(t, steps), steps / workers * np.asarray(nbytes, float)], axis=1)
    (latency, inverse_bandwidth), *_ = np.linalg.lstsq(design / t[:, None], np.ones_like(t), None)
    if latency <= 0 or inverse_bandwidth <= 0:
        raise ValueError(
            f"the fit gave latency {latency:.3g} s and 1/bandwidth {inverse_bandwidth:.3g} s/B; "
            "the measurements do not follow a ring all-reduce."
        )
    return Network(name, float(latency), float(1 / inverse_bandwidth))


def step_seconds(
    compute: float,
    network: Network,
    workers: int,
    nbytes: float,
    accumulation: int = 1,
    cores: int = 0,
) -> float:
    """Seconds per micro-batch step on `workers` workers (see the module docstring).

    Args:
      compute: One worker's step time alone.
      network: The all-reduce's latency and bandwidth.
      workers: N.
      nbytes: Gradient bytes per all-reduce.
      accumulation: Micro-batches per all-reduce (k).
      cores: Cores of the machine, if the workers share one; 0 for a core each.
    """
    shared = math.ceil(workers / cores) if cores else 1
    return compute * shared + ring_allreduce_seconds(network, workers, nbytes) / accumulation


def efficiency(
    compute: float,
    network: Network,
    workers: int,
    nbytes: float,
    accumulation: int = 1,
    cores: int = 0,
) -> float:
    """Weak-scaling efficiency: throughput of N workers over N times one worker's."""
    return compute / step_seconds(compute, network, workers, nbytes, accumulation, cores)


def predict(
    compute: float,
    nbytes: float,
    networks: Sequence[Network],
    workers: Sequence[int] = tuple(2**i for i in range(1, 9)),
    accumulation: int = 1,
) -> Dict[str, List[float]]:
    """Predicted efficiency per network at each worker count (a core or GPU each)."""
    return {
        network.name: [efficiency(compute, network, n, nbytes, accumulation) for n in workers]
        for network in networks
    }
