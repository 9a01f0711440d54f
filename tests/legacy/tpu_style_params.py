"""TPUEstimator-style functions: `input_fn(params)` reads the batch size from params.

Code written for TPUEstimator (and kept for CPU and GPU Estimators) takes
the batch size from `params["batch_size"]`, which the Estimator fills,
and the learning rate from the model_fn's `params`.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits


def _digits(training):
    digits = load_digits()
    part = slice(0, 1500) if training else slice(1500, None)
    images = (digits.images[part] / 16.0).astype(np.float32)[..., None]
    return images, digits.target[part].astype(np.int32)


def train_input_fn(params):
    batch_size = params["batch_size"]
    images, labels = _digits(training=True)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    dataset = dataset.shuffle(1024, seed=16).repeat()
    return dataset.batch(batch_size, drop_remainder=True)


def eval_input_fn(params):
    images, labels = _digits(training=False)
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(params["batch_size"])


def model_fn(features, labels, mode, params):
    net = tf.compat.v1.layers.conv2d(
        features,
        8,
        3,
        activation=tf.nn.relu,
        kernel_initializer=tf.compat.v1.variance_scaling_initializer(seed=16),
    )
    net = tf.compat.v1.layers.flatten(net)
    logits = tf.compat.v1.layers.dense(
        net, 10, kernel_initializer=tf.compat.v1.variance_scaling_initializer(seed=17)
    )
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)

    if mode == tf.estimator.ModeKeys.EVAL:

        def metric_fn(labels, logits):
            predictions = tf.argmax(logits, 1)
            return {"accuracy": tf.compat.v1.metrics.accuracy(labels, predictions)}

        return tf.estimator.EstimatorSpec(
            mode, loss=loss, eval_metric_ops=metric_fn(labels, logits)
        )

    optimizer = tf.compat.v1.train.MomentumOptimizer(params["learning_rate"], momentum=0.9)
    train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
