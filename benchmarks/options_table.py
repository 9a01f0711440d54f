"""The options the suite's *options* section measures, and what each changes in the update.

`OPTIONS` maps a row's name to `(estimator_dist.train flags, Config fields,
what the option changes in the update)`; `benchmarks.suite` measures each at
1 and 2 workers, `benchmarks.report` checks each against the scaling model.

>>> OPTIONS[HARDWARE_LIMIT][1]
{'contender': 'independent'}
"""

from __future__ import annotations

from typing import Any, Dict, Tuple

#: Two separate one-worker jobs at once: what the cores give with no synchronisation.
HARDWARE_LIMIT = "hardware limit"
#: 8 x 64 examples per worker in one step: what fewer synchronisations per example give.
LARGER_BATCH = "per_worker_batch=512"
#: 8 micro-batches of 64 per worker within one step: accumulation without per-slice steps.
MICRO_BATCHES_8 = "micro_batches=8 (8 x 64 per step)"
#: Rows of the options section that are references, not options at 64 per worker.
REFERENCES = (HARDWARE_LIMIT, LARGER_BATCH)
#: Options measured for 2-worker efficiency, with what each changes in the update.
OPTIONS: Dict[str, Tuple[Tuple[Tuple[str, str], ...], Dict[str, Any], str]] = {
    "defaults": ((), {}, "plain synchronous SGD: one all-reduce of all gradients per step"),
    "bytes_per_pack=64KiB": (
        (("bytes_per_pack", "65536"),),
        {},
        "none: gradients all-reduced in packs that may start during the backward pass",
    ),
    "inter_op_threads=2": (
        (("inter_op_threads", "2"),),
        {},
        "none: a second thread runs collectives beside the backward pass",
    ),
    "gradient_wire_dtype=bfloat16": (
        (("gradient_wire_dtype", "bfloat16"),),
        {},
        "gradients rounded to bfloat16 (8 significant bits) and summed in it",
    ),
    "gradient_accumulation_steps=8": (
        (("gradient_accumulation_steps", "8"),),
        {},
        "one update per 8 micro-batches: effective global batch x8",
    ),
    "bfloat16 + accumulation 4": (
        (("gradient_wire_dtype", "bfloat16"), ("gradient_accumulation_steps", "4")),
        {},
        "both of the above",
    ),
    MICRO_BATCHES_8: (
        (("micro_batches", "8"),),
        {"per_worker_batch": 512, "steps_factor": 0.25},
        "one update per 8 micro-batches of 64, run one after another within one step: "
        "effective global batch x8",
    ),
    "bfloat16 + micro_batches 8": (
        (("gradient_wire_dtype", "bfloat16"), ("micro_batches", "8")),
        {"per_worker_batch": 512, "steps_factor": 0.25},
        "gradients rounded to bfloat16, 8 micro-batches of 64 per step: effective global batch x8",
    ),
    "onednn off": ((), {"onednn": False}, "none (Eigen kernels: slower compute)"),
    "not pinned": ((), {"pin": False}, "none (workers float over all cores)"),
    LARGER_BATCH: (
        (),
        {"per_worker_batch": 512, "steps_factor": 0.25},
        "reference: global batch x8 in one step (one loss and one gradient all-reduce per 512 "
        "examples per worker, where accumulation 8 keeps a loss all-reduce per 64)",
    ),
    HARDWARE_LIMIT: (
        (),
        {"contender": "independent"},
        "no update is shared: 2 separate 1-worker jobs at once, one per core",
    ),
}
#: The options of a --quick run.
QUICK_OPTIONS = (
    "defaults",
    "gradient_wire_dtype=bfloat16",
    "gradient_accumulation_steps=8",
    MICRO_BATCHES_8,
    LARGER_BATCH,
    HARDWARE_LIMIT,
)
