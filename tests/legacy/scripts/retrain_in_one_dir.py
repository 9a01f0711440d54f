"""Two models trained one after the other in one directory, cleared before each: a course's shape.

As in notebooks that tune a model by hand, the program deletes its output
directory and calls `train_and_evaluate` again with another model: a linear
regressor for 10 steps, then a DNN for 20. In plain TensorFlow each call
evaluates its own model before the program goes on.

  python tests/legacy/scripts/retrain_in_one_dir.py --outdir=/tmp/retrain
"""

import argparse
import shutil

import numpy as np
import tensorflow as tf


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--outdir", required=True)
    parser.add_argument(
        "--train_first", action="store_true", help="Train once with train() before the models."
    )
    args = parser.parse_args()
    rng = np.random.RandomState(0)
    x = rng.uniform(0, 1, (200, 1)).astype(np.float32)
    y = 3 * x[:, 0] + 1
    train = tf.compat.v1.estimator.inputs.numpy_input_fn(
        {"x": x}, y, batch_size=20, num_epochs=None, shuffle=True
    )
    evaluate = tf.compat.v1.estimator.inputs.numpy_input_fn(
        {"x": x}, y, batch_size=20, num_epochs=1, shuffle=False
    )
    columns = [tf.feature_column.numeric_column("x")]
    models = (
        (lambda: tf.estimator.LinearRegressor(columns, model_dir=args.outdir), 10),
        (lambda: tf.estimator.DNNRegressor([4], columns, model_dir=args.outdir), 20),
    )
    if args.train_first:  # As notebooks try a model with train() before train_and_evaluate.
        models[0][0]().train(train, max_steps=5)
    for make, steps in models:
        shutil.rmtree(args.outdir, ignore_errors=True)
        tf.estimator.train_and_evaluate(
            make(),
            tf.estimator.TrainSpec(train, max_steps=steps),
            tf.estimator.EvalSpec(evaluate, steps=None),
        )


if __name__ == "__main__":
    main()
