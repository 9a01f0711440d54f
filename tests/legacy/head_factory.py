"""A model_fn made by a factory, computing its spec with a canned head.

`make_model_fn(...)` closes over the architecture and returns
`_model_fn(features, labels, mode, params, config=None)`, which builds the
logits and lets `tf.estimator.MultiClassHead` make the loss, metrics,
predictions and train op, given a `train_op_fn` with a TF1 optimizer.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits


def make_model_fn(hidden_units, n_classes):
    head = tf.estimator.MultiClassHead(n_classes=n_classes)

    def _model_fn(features, labels, mode, params, config=None):
        del config  # unused
        net = features["pixels"]
        for i, units in enumerate(hidden_units):
            net = tf.compat.v1.layers.dense(
                net,
                units,
                activation=tf.nn.relu,
                kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=30 + i),
                name=f"hiddenlayer_{i}",
            )
        logits = tf.compat.v1.layers.dense(
            net,
            head.logits_dimension,
            kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=29),
            name="logits",
        )
        optimizer = tf.compat.v1.train.AdagradOptimizer(params["learning_rate"])

        def _train_op_fn(loss):
            return optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())

        return head.create_estimator_spec(
            features=features, mode=mode, logits=logits, labels=labels, train_op_fn=_train_op_fn
        )

    return _model_fn


model_fn = make_model_fn(hidden_units=[32], n_classes=10)


def _dataset(training):
    digits = load_digits()
    part = slice(0, 1500) if training else slice(1500, None)
    pixels = (digits.data[part] / 16.0).astype(np.float32)
    labels = digits.target[part].astype(np.int64).reshape(-1, 1)
    return tf.data.Dataset.from_tensor_slices(({"pixels": pixels}, labels))


def train_input_fn():
    return _dataset(training=True).shuffle(1500, seed=31).repeat().batch(32)


def eval_input_fn():
    return _dataset(training=False).batch(64)
