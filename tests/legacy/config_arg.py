"""A model_fn that takes `config`, Estimator's RunConfig, and nothing else extra.

It seeds its initialiser from `config.tf_random_seed` and adds a summary
hook on the chief only, writing to `config.model_dir`.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_breast_cancer

_data = load_breast_cancer()
_order = np.random.RandomState(4).permutation(len(_data.target))
_x = _data.data[_order].astype(np.float32)
_mean, _std = _x[:455].mean(axis=0), _x[:455].std(axis=0)
FEATURES = (_x - _mean) / _std
LABELS = _data.target[_order].astype(np.int32)


def train_input_fn():
    dataset = tf.data.Dataset.from_tensor_slices(({"x": FEATURES[:455]}, LABELS[:455]))
    return dataset.shuffle(455, seed=4).repeat().batch(32)


def eval_input_fn():
    return tf.data.Dataset.from_tensor_slices(({"x": FEATURES[455:]}, LABELS[455:])).batch(57)


def model_fn(features, labels, mode, config):
    init = tf.compat.v1.glorot_uniform_initializer(seed=config.tf_random_seed)
    net = tf.compat.v1.layers.dense(features["x"], 16, tf.nn.relu, kernel_initializer=init)
    logits = tf.compat.v1.layers.dense(net, 2, kernel_initializer=init)
    classes = tf.argmax(logits, 1, output_type=tf.int32)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"classes": classes})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    accuracy = tf.compat.v1.metrics.accuracy(labels, classes)
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy})

    hooks = []
    if config.is_chief:
        batch_accuracy = tf.reduce_mean(tf.cast(tf.equal(classes, labels), tf.float32))
        hooks.append(
            tf.compat.v1.train.SummarySaverHook(
                save_steps=config.save_summary_steps or 100,
                output_dir=config.model_dir,
                summary_op=tf.compat.v1.summary.scalar("batch_accuracy", batch_accuracy),
            )
        )
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, training_hooks=hooks)
