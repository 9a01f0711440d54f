"""Runs the benchmark suite and writes docs/benchmarks/ (results.json, README.md, plots).

  python -m benchmarks                      # everything, 3 rounds (about 2 hours on 2 cores)
  python -m benchmarks --quick --rounds=1   # a shorter check of the suite (about 18 minutes)
  python -m benchmarks --sections=collectives,startup
  python -m benchmarks --sections=overhead --output=/tmp/overhead   # package / hand-written alone
  python -m benchmarks --sections=speedup   # MobileNetV2's speed-up table (~15 min), into
                                            # docs/benchmarks/speedup/ (3 min with --quick)

The *overhead* section (the package against hand-written Estimator code, 2
workers x 64) runs at least 10 interleaved rounds (`--rounds` with `--quick`),
and logs each ratio's median, range and per-round values as it ends (8-9
minutes on 2 cores). A run of some sections writes a report of those alone: give it
its own `--output` to keep the full suite's.

`make bench` builds the environment (and Horovod, if it can) and runs the
first form. Nothing else should run on the machine meanwhile: the suite
pins its processes to cores and its figures assume they are free.
"""

from __future__ import annotations

import os
from typing import Sequence

from absl import app, flags

from benchmarks.report import write_report
from benchmarks.speedup import report_directory
from benchmarks.suite import SECTIONS, Settings, run_suite, save

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOROVOD_PYTHON = os.path.join(REPO, ".venv-horovod", "bin", "python")

_SECTIONS = flags.DEFINE_list("sections", list(SECTIONS), f"Which of {', '.join(SECTIONS)}.")
_ROUNDS = flags.DEFINE_integer("rounds", 3, "Repetitions of every measurement.", lower_bound=1)
_QUICK = flags.DEFINE_boolean("quick", False, "Fewer configurations and shorter runs.")
_HOROVOD = flags.DEFINE_string(
    "horovod_python",
    None,
    "A Python with Horovod (Gloo) and this package (`make bench-horovod` builds "
    f"{os.path.relpath(HOROVOD_PYTHON, REPO)}, used when it exists); empty to leave Horovod out.",
)
_OUTPUT = flags.DEFINE_string(
    "output", os.path.join(REPO, "docs", "benchmarks"), "Where results and report go."
)
_SEED = flags.DEFINE_integer("seed", 0, "Seed of the shuffled run order.")
_SCALING_MODELS = flags.DEFINE_list(
    "scaling_models", ["mnist_cnn", "resnet_cifar"], "Models of the scaling section."
)
_SCALING_COMMUNICATIONS = flags.DEFINE_list(
    "scaling_communications", ["RING", "AUTO"], "Collectives of the scaling section."
)


def main(argv: Sequence[str]) -> None:
    """Flags in, the suite, results and report out."""
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments {list(argv[1:])}", exitcode=2)
    horovod = _HOROVOD.value
    if horovod is None:
        horovod = HOROVOD_PYTHON if os.path.exists(HOROVOD_PYTHON) else ""
    try:
        settings = Settings(
            tuple(_SECTIONS.value),
            _ROUNDS.value,
            _QUICK.value,
            horovod,
            _SEED.value,
            tuple(_SCALING_MODELS.value),
            tuple(c.upper() for c in _SCALING_COMMUNICATIONS.value),
        )
    except ValueError as error:
        raise app.UsageError(str(error), exitcode=2) from None
    output = report_directory(settings.sections, _OUTPUT.value, _OUTPUT.present)
    os.makedirs(output, exist_ok=True)
    path = os.path.join(output, "results.json")
    results = run_suite(settings, on_section=lambda partial: save(partial, path))
    save(results, path)
    print(write_report(results, output))
    for section in ("overhead", "alternatives"):
        for c in results.get(section, {}).get("comparisons", []):
            print(
                f"{c['name']}, 2 workers x {c['per_worker_batch']}: median {c['median']:.3f} "
                f"({c['min']:.3f}-{c['max']:.3f}) over {len(c['samples'])} rounds"
            )


if __name__ == "__main__":
    app.run(main)
