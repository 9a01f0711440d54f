"""Entry point of the census trainer package, run as `python -m trainer.task`.

In the shape of GoogleCloudPlatform/cloudml-samples' census estimator: argparse
flags with dashes (`--job-dir`, `--train-files`), CSV files without a header,
13 feature columns into a `DNNLinearCombinedClassifier`, a `FinalExporter`
and a `BestExporter`, `train_and_evaluate`.
"""

import argparse

from . import model


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--job-dir", required=True, help="Where checkpoints and exports go.")
    parser.add_argument("--train-files", nargs="+", required=True)
    parser.add_argument("--eval-files", nargs="+", required=True)
    parser.add_argument("--train-steps", type=int, default=60)
    parser.add_argument("--eval-steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=32)
    arguments = parser.parse_args()
    model.train_and_evaluate(arguments)


if __name__ == "__main__":
    main()
