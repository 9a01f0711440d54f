"""Separate train and eval input functions, the eval one repeating forever.

The author's EvalSpec said `steps=100`, so the evaluation data was made to
repeat like the training data and nothing else bounded it.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

digits = load_digits()
PIXELS = (digits.data / 16.0).astype(np.float32)
TARGET = digits.target.astype(np.int64)


def train_input_fn():
    dataset = tf.data.Dataset.from_tensor_slices(({"pixels": PIXELS[:1500]}, TARGET[:1500]))
    return dataset.shuffle(1500, seed=15).repeat().batch(32)


def eval_input_fn():
    dataset = tf.data.Dataset.from_tensor_slices(({"pixels": PIXELS[1500:]}, TARGET[1500:]))
    return dataset.repeat().batch(20)


def model_fn(features, labels, mode):
    logits = tf.compat.v1.layers.dense(
        features["pixels"], 10, kernel_initializer=tf.compat.v1.zeros_initializer()
    )
    classes = tf.argmax(logits, axis=-1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"classes": classes})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(
        loss, global_step=tf.compat.v1.train.get_global_step()
    )
    return tf.estimator.EstimatorSpec(
        mode,
        loss=loss,
        train_op=train_op,
        eval_metric_ops={"accuracy": tf.compat.v1.metrics.accuracy(labels, classes)},
    )


if __name__ == "__main__":
    estimator = tf.estimator.Estimator(model_fn)
    tf.estimator.train_and_evaluate(
        estimator,
        tf.estimator.TrainSpec(train_input_fn, max_steps=300),
        tf.estimator.EvalSpec(eval_input_fn, steps=100),
    )
