"""Input functions bound with functools.partial from one dataset factory.

`make_dataset(split, batch_size, ...)` serves both splits; the module binds
it once per split, so Estimator sees functions of no arguments.
"""

import functools

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

_SPLITS = {"train": slice(0, 1500), "test": slice(1500, None)}


def make_dataset(split, batch_size, shuffle_buffer=0, repeat=False):
    digits = load_digits()
    part = _SPLITS[split]
    images = (digits.images[part] / 16.0).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(({"image": images}, digits.target[part]))
    if shuffle_buffer:
        dataset = dataset.shuffle(shuffle_buffer, seed=2)
    if repeat:
        dataset = dataset.repeat()
    return dataset.batch(batch_size)


train_input_fn = functools.partial(
    make_dataset, "train", batch_size=32, shuffle_buffer=1500, repeat=True
)
eval_input_fn = functools.partial(make_dataset, "test", batch_size=32)


def model_fn(features, labels, mode):
    flat = tf.compat.v1.layers.flatten(features["image"])
    hidden = tf.compat.v1.layers.dense(
        flat,
        48,
        activation=tf.nn.relu,
        kernel_initializer=tf.compat.v1.initializers.he_normal(seed=9),
    )
    logits = tf.compat.v1.layers.dense(
        hidden, 10, kernel_initializer=tf.compat.v1.initializers.glorot_normal(seed=10)
    )
    predictions = {"class_ids": tf.argmax(logits, 1), "probabilities": tf.nn.softmax(logits)}
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions=predictions)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.EVAL:
        accuracy = tf.compat.v1.metrics.accuracy(labels, predictions["class_ids"])
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy})
    optimizer = tf.compat.v1.train.AdamOptimizer(learning_rate=0.01)
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
