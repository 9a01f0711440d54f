"""A program that only trains: `estimator.train(...)` on a pandas frame, no evaluation.

A canned `DNNRegressor` on `pandas_input_fn`, trained for `--steps` steps;
it says where training ended and exits:

  python tests/legacy/scripts/train_only.py --model_dir=/tmp/train_only --steps=30
"""

import argparse

import numpy as np
import pandas as pd
import tensorflow as tf


def frame(count, seed):
    rng = np.random.RandomState(seed)
    data = pd.DataFrame({"a": rng.uniform(-1, 1, count), "b": rng.uniform(-1, 1, count)})
    return data, (2 * data["a"] - data["b"]).astype(np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    columns = [tf.feature_column.numeric_column(name) for name in ("a", "b")]
    estimator = tf.compat.v1.estimator.DNNRegressor(
        hidden_units=[8], feature_columns=columns, model_dir=args.model_dir
    )
    features, labels = frame(200, 0)
    input_fn = tf.compat.v1.estimator.inputs.pandas_input_fn(
        features, labels, batch_size=20, num_epochs=None, shuffle=True
    )
    estimator.train(input_fn, steps=args.steps)
    print("trained to global step", estimator.get_variable_value("global_step"))


if __name__ == "__main__":
    main()
