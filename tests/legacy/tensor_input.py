"""Hand-written input functions that return tensors, not a Dataset.

Before Estimator accepted datasets, an input_fn returned `(features,
labels)` tensors; many kept doing so through a one-shot iterator's
`get_next()`.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_breast_cancer

_data = load_breast_cancer()
_order = np.random.RandomState(12).permutation(len(_data.target))
_x = _data.data[_order].astype(np.float32)
_x = (_x - _x[:455].mean(axis=0)) / _x[:455].std(axis=0)
_y = _data.target[_order].astype(np.int64)


def train_input_fn():
    dataset = tf.data.Dataset.from_tensor_slices(({"measurements": _x[:455]}, _y[:455]))
    dataset = dataset.shuffle(455, seed=12).repeat().batch(32)
    features, labels = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    return features, labels


def eval_input_fn():
    dataset = tf.data.Dataset.from_tensor_slices(({"measurements": _x[455:]}, _y[455:]))
    return tf.compat.v1.data.make_one_shot_iterator(dataset.batch(38)).get_next()


def model_fn(features, labels, mode):
    init = tf.compat.v1.glorot_uniform_initializer(seed=12)
    hidden = tf.compat.v1.layers.dense(
        features["measurements"], 8, tf.nn.relu, kernel_initializer=init
    )
    logits = tf.squeeze(tf.compat.v1.layers.dense(hidden, 1, kernel_initializer=init), axis=1)
    predicted = tf.cast(logits > 0, tf.int64)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"malignant": 1 - predicted})
    loss = tf.reduce_mean(
        tf.nn.sigmoid_cross_entropy_with_logits(labels=tf.cast(labels, tf.float32), logits=logits)
    )
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(
            mode,
            loss=loss,
            eval_metric_ops={"accuracy": tf.compat.v1.metrics.accuracy(labels, predicted)},
        )
    train_op = tf.compat.v1.train.RMSPropOptimizer(0.01).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step()
    )
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
