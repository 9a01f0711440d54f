"""A model_fn with an exponentially decayed learning rate read from the global step.

Softmax regression on the digits with one hidden layer; the learning
rate halves every 40 steps (staircase) and is written as a summary, as
TF1 training scripts commonly did.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

STARTER_LEARNING_RATE = 0.5


def _digits(train):
    digits = load_digits()
    part = slice(0, 1500) if train else slice(1500, None)
    return digits.data[part].astype(np.float32) / 16.0, digits.target[part].astype(np.int64)


def train_input_fn():
    pixels, target = _digits(train=True)
    dataset = tf.data.Dataset.from_tensor_slices(({"pixels": pixels}, target))
    return dataset.shuffle(1500, seed=5).repeat().batch(50)


def eval_input_fn():
    pixels, target = _digits(train=False)
    return tf.data.Dataset.from_tensor_slices(({"pixels": pixels}, target)).batch(100)


def model_fn(features, labels, mode):
    hidden = tf.compat.v1.layers.dense(
        features["pixels"],
        32,
        activation=tf.nn.tanh,
        kernel_initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.1, seed=1),
    )
    logits = tf.compat.v1.layers.dense(
        hidden, 10, kernel_initializer=tf.compat.v1.truncated_normal_initializer(0.0, 0.1, seed=2)
    )
    predicted = tf.argmax(logits, axis=1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"class": predicted})

    loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    )
    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(
            mode,
            loss=loss,
            eval_metric_ops={"accuracy": tf.compat.v1.metrics.accuracy(labels, predicted)},
        )

    global_step = tf.compat.v1.train.get_global_step()
    learning_rate = tf.compat.v1.train.exponential_decay(
        STARTER_LEARNING_RATE, global_step, decay_steps=40, decay_rate=0.5, staircase=True
    )
    tf.compat.v1.summary.scalar("learning_rate", learning_rate)
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate)
    train_op = optimizer.minimize(loss, global_step=global_step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
