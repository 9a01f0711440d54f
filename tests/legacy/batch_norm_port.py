"""A TF1 model ported to tf.compat.v1: dense layers with batch normalisation.

Breast cancer diagnosis from 30 raw measurements. Batch normalisation is
the TF1 layer with `training=` from the mode, and its moving averages are
updated through the UPDATE_OPS collection, the control dependency TF1
code had to remember.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_breast_cancer

BATCH_SIZE = 32
SEED = 11

_data = load_breast_cancer()
_order = np.random.RandomState(SEED).permutation(len(_data.target))
X = _data.data[_order].astype(np.float32)
Y = _data.target[_order].astype(np.float32)[:, None]
TRAIN, TEST = slice(0, 455), slice(455, None)


def train_input_fn():
    dataset = tf.data.Dataset.from_tensor_slices(({"x": X[TRAIN]}, Y[TRAIN]))
    return dataset.shuffle(455, seed=SEED).repeat().batch(BATCH_SIZE)


def eval_input_fn():
    return tf.data.Dataset.from_tensor_slices(({"x": X[TEST]}, Y[TEST])).batch(BATCH_SIZE)


def model_fn(features, labels, mode):
    is_training = mode == tf.estimator.ModeKeys.TRAIN
    init = tf.compat.v1.glorot_uniform_initializer(seed=SEED)

    net = tf.compat.v1.layers.batch_normalization(features["x"], momentum=0.9, training=is_training)
    net = tf.compat.v1.layers.dense(net, 32, use_bias=False, kernel_initializer=init)
    net = tf.compat.v1.layers.batch_normalization(net, momentum=0.9, training=is_training)
    net = tf.nn.relu(net)
    logits = tf.compat.v1.layers.dense(net, 1, kernel_initializer=init)

    probabilities = tf.sigmoid(logits)
    classes = tf.cast(probabilities > 0.5, tf.float32)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(
            mode, predictions={"probabilities": probabilities, "classes": classes}
        )

    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.EVAL:
        metrics = {
            "accuracy": tf.compat.v1.metrics.accuracy(labels, classes),
            "auc": tf.compat.v1.metrics.auc(labels, probabilities),
        }
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)

    optimizer = tf.compat.v1.train.MomentumOptimizer(0.05, momentum=0.9)
    update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
    with tf.control_dependencies(update_ops):
        train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
