"""The package's entry point, run as `python -m trainer.task --job-dir=DIR ...`.

It parses its own arguments, records what `python -m` gave it (its `__name__`,
`__package__` and `sys.argv`) in `job-dir/program-<task>.json`, and trains
through `model`, a module of the same package imported relatively.
"""

import argparse
import json
import os
import sys

from . import model


def parse_args(argv):
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", required=True, help="Checkpoints and exports.")
    parser.add_argument("--train-steps", type=int, default=40)
    parser.add_argument("--eval-steps", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=16)
    return parser.parse_args(argv)


def record_how_it_ran(job_dir):
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("type", "local")
    os.makedirs(job_dir, exist_ok=True)
    seen = {"name": __name__, "package": __package__, "argv": sys.argv}
    with open(os.path.join(job_dir, f"program-{task}.json"), "w") as stream:
        json.dump(seen, stream)


if __name__ == "__main__":
    arguments = parse_args(sys.argv[1:])
    record_how_it_ran(arguments.job_dir)
    model.train_and_evaluate(arguments)
