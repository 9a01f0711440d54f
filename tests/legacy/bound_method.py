"""A model_fn and input functions that are bound methods of module-level objects.

Authors who kept hyper-parameters on an object handed Estimator
`model_fn=MODEL.model_fn`; the data object's methods are the input
functions. Run as `--model_fn=tests.legacy.bound_method:MODEL.model_fn`.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits


class Model:
    """A two-layer perceptron for 8x8 digits."""

    def __init__(self, hidden_units=64, learning_rate=0.3, seed=21):
        self.hidden_units = hidden_units
        self.learning_rate = learning_rate
        self.seed = seed

    def logits(self, pixels):
        init = tf.compat.v1.glorot_uniform_initializer(seed=self.seed)
        hidden = tf.compat.v1.layers.dense(
            pixels, self.hidden_units, tf.nn.relu, kernel_initializer=init
        )
        return tf.compat.v1.layers.dense(hidden, 10, kernel_initializer=init)

    def model_fn(self, features, labels, mode):
        logits = self.logits(features["pixels"])
        classes = tf.argmax(logits, 1)
        if mode == tf.estimator.ModeKeys.PREDICT:
            return tf.estimator.EstimatorSpec(mode, predictions={"classes": classes})
        loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
        if mode == tf.estimator.ModeKeys.EVAL:
            accuracy = tf.compat.v1.metrics.accuracy(labels, classes)
            return tf.estimator.EstimatorSpec(
                mode, loss=loss, eval_metric_ops={"accuracy": accuracy}
            )
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(self.learning_rate)
        train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


class Digits:
    """The digits, the first 1,500 for training."""

    def __init__(self, batch_size):
        digits = load_digits()
        self.pixels = (digits.data / 16.0).astype(np.float32)
        self.target = digits.target.astype(np.int32)
        self.batch_size = batch_size

    def train_input_fn(self):
        dataset = tf.data.Dataset.from_tensor_slices(
            ({"pixels": self.pixels[:1500]}, self.target[:1500])
        )
        return dataset.shuffle(1500, seed=8).repeat().batch(self.batch_size)

    def eval_input_fn(self):
        dataset = tf.data.Dataset.from_tensor_slices(
            ({"pixels": self.pixels[1500:]}, self.target[1500:])
        )
        return dataset.batch(self.batch_size)


MODEL = Model()
DATA = Digits(batch_size=32)
