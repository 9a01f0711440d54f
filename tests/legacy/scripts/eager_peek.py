"""A program that looks at its data eagerly before training, as TensorFlow's tutorials do.

It prints a batch of its input with `.numpy()` (eager execution, TensorFlow 2's
default), then trains a canned `LinearClassifier` with `train_and_evaluate`,
and prints the first prediction's class after training, eagerly again:

  python tests/legacy/scripts/eager_peek.py --model_dir=/tmp/peek
"""

import argparse

import numpy as np
import tensorflow as tf


def input_fn(repeat=True):
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, size=(64, 2)).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(({"x": x}, (x.sum(axis=1) > 0).astype(np.int32)))
    return (dataset.repeat() if repeat else dataset).batch(8)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    args = parser.parse_args()
    for features, labels in input_fn().take(1):
        print("a batch of", features["x"].numpy().shape[0], "examples, labels", labels.numpy()[:4])
    classifier = tf.estimator.LinearClassifier(
        [tf.feature_column.numeric_column("x", shape=(2,))], model_dir=args.model_dir
    )
    tf.estimator.train_and_evaluate(
        classifier,
        tf.estimator.TrainSpec(input_fn, max_steps=30),
        tf.estimator.EvalSpec(lambda: input_fn(False), start_delay_secs=0, throttle_secs=1),
    )
    prediction = next(classifier.predict(lambda: input_fn(False)))
    print("first prediction's class:", prediction["class_ids"][0])


if __name__ == "__main__":
    main()
