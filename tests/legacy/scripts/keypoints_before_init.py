"""An estimator that settles its model_dir before its constructor, in TensorFlow Lattice's shape.

TensorFlow Lattice's canned estimators call Estimator's
`maybe_overwrite_model_dir_and_session_config(config, None)` themselves, then
the chief computes feature keypoints and writes them to that directory while
every other task waits for the file, and only then call
`Estimator.__init__`. In plain TensorFlow, without a model_dir, the directory
is a new temporary one.

  python tests/legacy/scripts/keypoints_before_init.py --steps=10
"""

import argparse
import json
import os
import time

import numpy as np
import tensorflow as tf
from tensorflow_estimator.python.estimator import estimator as estimator_lib

#: How long a non-chief task waits for the chief's keypoints (TensorFlow Lattice: 2,400 s).
WAIT_SECS = 60


def model_fn(features, labels, mode, params):
    keypoints = tf.constant(params["keypoints"], tf.float32)
    # Each value's position among the keypoints, as a calibration layer would use them.
    calibrated = tf.reduce_sum(
        tf.cast(features["x"] > keypoints, tf.float32), axis=1, keepdims=True
    )
    logits = tf.compat.v1.layers.dense(calibrated, 2)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.EVAL:
        accuracy = tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, axis=1))
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy})
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class KeypointsClassifier(tf.estimator.Estimator):
    """The chief writes `keypoints.json` into the model_dir; the other tasks read it there."""

    def __init__(self, values, config=None):
        config = estimator_lib.maybe_overwrite_model_dir_and_session_config(config, None)
        path = os.path.join(config.model_dir, "keypoints.json")
        if config.is_chief:  # Into the directory as it is: TensorFlow Lattice makes none.
            keypoints = np.quantile(values, [0.25, 0.5, 0.75]).tolist()
            with tf.io.gfile.GFile(path, "w") as stream:
                json.dump(keypoints, stream)
        deadline = time.monotonic() + WAIT_SECS
        while not tf.io.gfile.exists(path):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{path} did not appear within {WAIT_SECS} s")
            time.sleep(0.5)
        with tf.io.gfile.GFile(path) as stream:
            keypoints = json.load(stream)
        super().__init__(model_fn, config=config, params={"keypoints": keypoints})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    rng = np.random.RandomState(0)
    values = rng.uniform(0, 10, (200, 1)).astype(np.float32)
    labels = (values[:, 0] > 5).astype(np.int32)

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"x": values}, labels)).repeat().batch(20)

    # Two of them, as the example trains several canned estimators, each without a model_dir.
    for _ in range(2):
        classifier = KeypointsClassifier(values)
        classifier.train(input_fn, steps=args.steps)
        print("accuracy", classifier.evaluate(input_fn, steps=5)["accuracy"])


if __name__ == "__main__":
    main()
