"""Two estimators in one program, the second warm-started from the first.

It pre-trains a model_fn estimator in `MODEL_DIR/pretrain` with
`train_and_evaluate`, then trains a second one in `MODEL_DIR` that starts from
the first's variables (`warm_start_from`), as fine-tuning programs do:

  python tests/legacy/scripts/warm_started_pair.py --model_dir=/tmp/pair
"""

import argparse
import os

import numpy as np
import tensorflow.compat.v1 as tf


def input_fn():
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, size=(128, 2)).astype(np.float32)
    y = x @ np.array([[1.5], [-0.5]], np.float32)
    return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).repeat().batch(16)


def model_fn(features, labels, mode, params):
    prediction = tf.layers.dense(features["x"], 1, name="regression")
    loss = tf.losses.mean_squared_error(labels, prediction)
    optimizer = tf.train.GradientDescentOptimizer(params["learning_rate"])
    train_op = optimizer.minimize(loss, tf.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def train(model_dir, steps, learning_rate, warm_start_from=None):
    estimator = tf.estimator.Estimator(
        model_fn,
        model_dir=model_dir,
        params={"learning_rate": learning_rate},
        warm_start_from=warm_start_from,
    )
    tf.estimator.train_and_evaluate(
        estimator,
        tf.estimator.TrainSpec(input_fn, max_steps=steps),
        tf.estimator.EvalSpec(input_fn, steps=2, start_delay_secs=0, throttle_secs=1),
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    args = parser.parse_args()
    pretrain = os.path.join(args.model_dir, "pretrain")
    train(pretrain, 20, 0.1)
    train(args.model_dir, 20, 0.01, warm_start_from=pretrain)
    print("fine-tuned")


if __name__ == "__main__":
    main()
