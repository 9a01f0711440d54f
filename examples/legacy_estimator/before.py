"""A single-process TF1-style Estimator script, as users bring it (the "before").

It trains the classic CNN on the 8x8 digits shipped with scikit-learn:

  python examples/legacy_estimator/before.py /tmp/legacy_before

Run under a multi-worker TF_CONFIG it would fail or silently misbehave in
three places, which `python -m estimator_dist.check --script=<this file>`
reports with their fixes; docs/migration.md walks through the move to
`model.py` in this directory, whose model_fn is this one, unchanged.
"""

import sys

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits


def model_fn(features, labels, mode, params):
    images = tf.reshape(features["image"], [-1, 8, 8, 1])
    net = tf.compat.v1.layers.conv2d(images, 32, 3, activation=tf.nn.relu)
    net = tf.compat.v1.layers.max_pooling2d(net, 2, 2)
    net = tf.compat.v1.layers.flatten(net)
    net = tf.compat.v1.layers.dense(net, 64, activation=tf.nn.relu)
    logits = tf.compat.v1.layers.dense(net, 10)
    predictions = {"class_ids": tf.argmax(logits, 1), "probabilities": tf.nn.softmax(logits)}
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions=predictions)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    accuracy = tf.compat.v1.metrics.accuracy(labels, predictions["class_ids"])
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy})
    optimizer = tf.compat.v1.train.MomentumOptimizer(params["learning_rate"], momentum=0.9)
    train_op = optimizer.minimize(loss, tf.compat.v1.train.get_or_create_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def train_input_fn():
    digits = load_digits()
    images = (digits.images[:1500] / 16.0).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(({"image": images}, digits.target[:1500]))
    return dataset.shuffle(1500).repeat().batch(64)


def eval_input_fn():
    digits = load_digits()
    images = (digits.images[1500:] / 16.0).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"image": images}, digits.target[1500:])).batch(64)


if __name__ == "__main__":
    config = tf.estimator.RunConfig(model_dir=sys.argv[1], save_checkpoints_secs=60)
    estimator = tf.estimator.Estimator(model_fn, config=config, params={"learning_rate": 0.05})
    estimator.train(train_input_fn, max_steps=300)
    print(estimator.evaluate(eval_input_fn))
