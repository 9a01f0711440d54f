"""A program that only evaluates a model trained before, and predicts with it.

It builds the same canned `DNNRegressor` as `train_only.py` on an existing
model_dir, evaluates its latest checkpoint on a pandas frame and prints the
metric names and a prediction count:

  python tests/legacy/scripts/evaluate_only.py --model_dir=/tmp/train_only
"""

import argparse

import tensorflow as tf
from train_only import frame


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    args = parser.parse_args()
    columns = [tf.feature_column.numeric_column(name) for name in ("a", "b")]
    estimator = tf.compat.v1.estimator.DNNRegressor(
        hidden_units=[8], feature_columns=columns, model_dir=args.model_dir
    )
    features, labels = frame(60, 1)
    input_fn = tf.compat.v1.estimator.inputs.pandas_input_fn(
        features, labels, batch_size=20, num_epochs=1, shuffle=False
    )
    results = estimator.evaluate(input_fn)
    print("evaluated global step", results["global_step"], "metrics", sorted(results))
    predictions = list(estimator.predict(input_fn))
    print("predicted", len(predictions))


if __name__ == "__main__":
    main()
