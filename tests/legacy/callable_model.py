"""A model_fn that is a callable object: softmax regression on hand-made variables.

The class keeps its settings and builds the graph in `__call__(features,
labels, mode)`, with `tf.compat.v1.get_variable` for the weights, as
TF1 code written before tf.layers did.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits


class SoftmaxRegression:
    def __init__(self, num_features, num_classes, learning_rate):
        self.num_features = num_features
        self.num_classes = num_classes
        self.learning_rate = learning_rate

    def __call__(self, features, labels, mode):
        with tf.compat.v1.variable_scope("softmax_regression"):
            weights = tf.compat.v1.get_variable(
                "weights",
                [self.num_features, self.num_classes],
                initializer=tf.compat.v1.zeros_initializer(),
            )
            bias = tf.compat.v1.get_variable(
                "bias", [self.num_classes], initializer=tf.compat.v1.zeros_initializer()
            )
        logits = tf.matmul(features["pixels"], weights) + bias
        prediction = tf.argmax(logits, 1)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(
                mode, predictions={"prediction": prediction, "logits": logits}
            )
        one_hot = tf.one_hot(labels, self.num_classes)
        loss = tf.reduce_mean(
            tf.nn.softmax_cross_entropy_with_logits(labels=one_hot, logits=logits)
        )
        metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels, prediction)}
        train_op = tf.compat.v1.train.GradientDescentOptimizer(self.learning_rate).minimize(
            loss, global_step=tf.compat.v1.train.get_or_create_global_step()
        )
        return tf.estimator.EstimatorSpec(
            mode, loss=loss, train_op=train_op, eval_metric_ops=metrics
        )


def _dataset(start, stop):
    digits = load_digits()
    pixels = (digits.data[start:stop] / 16.0).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"pixels": pixels}, digits.target[start:stop]))


def train_input_fn():
    return _dataset(0, 1500).shuffle(500, seed=17).repeat().batch(40)


def eval_input_fn():
    return _dataset(1500, None).batch(40)


model_fn = SoftmaxRegression(num_features=64, num_classes=10, learning_rate=0.5)
