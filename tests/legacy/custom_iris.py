"""The "Creating Custom Estimators" tutorial: iris through a hand-written model_fn.

The model_fn takes `params` because the tutorial's Estimator was built
with `params={'feature_columns': ..., 'hidden_units': ..., 'n_classes': 3}`,
objects no command-line flag can carry. So `build(config)` makes that same
Estimator with the job's RunConfig, for `--estimator`. The tutorial's dense
layers were seeded by the graph seed alone; here their initialiser has a
seed of its own, so that every run starts from the same weights.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_iris

CSV_COLUMN_NAMES = ["SepalLength", "SepalWidth", "PetalLength", "PetalWidth"]
INITIALIZER = tf.compat.v1.glorot_uniform_initializer(seed=42)


def load_data():
    iris = load_iris()
    order = np.random.RandomState(42).permutation(len(iris.target))
    data, target = iris.data[order].astype(np.float32), iris.target[order]
    train = {name: data[:120, i] for i, name in enumerate(CSV_COLUMN_NAMES)}
    test = {name: data[120:, i] for i, name in enumerate(CSV_COLUMN_NAMES)}
    return (train, target[:120]), (test, target[120:])


def train_input_fn():
    (train_x, train_y), _ = load_data()
    dataset = tf.data.Dataset.from_tensor_slices((train_x, train_y))
    return dataset.shuffle(1000, seed=3).repeat().batch(32)


def eval_input_fn():
    _, (test_x, test_y) = load_data()
    return tf.data.Dataset.from_tensor_slices((test_x, test_y)).batch(32)


def my_model_fn(features, labels, mode, params):
    """DNN with hidden layers and the given number of classes."""
    # Create the layer of input
    net = tf.compat.v1.feature_column.input_layer(features, params["feature_columns"])
    for units in params["hidden_units"]:
        net = tf.compat.v1.layers.dense(
            net, units=units, activation=tf.nn.relu, kernel_initializer=INITIALIZER
        )

    # Compute logits (1 per class).
    logits = tf.compat.v1.layers.dense(
        net, params["n_classes"], activation=None, kernel_initializer=INITIALIZER
    )

    # Compute predictions.
    predicted_classes = tf.argmax(logits, 1)
    if mode == tf.estimator.ModeKeys.PREDICT:
        predictions = {
            "class_ids": predicted_classes[:, tf.newaxis],
            "probabilities": tf.nn.softmax(logits),
            "logits": logits,
        }
        return tf.estimator.EstimatorSpec(mode, predictions=predictions)

    # Compute loss.
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)

    # Compute evaluation metrics.
    accuracy = tf.compat.v1.metrics.accuracy(
        labels=labels, predictions=predicted_classes, name="acc_op"
    )
    metrics = {"accuracy": accuracy}
    tf.compat.v1.summary.scalar("accuracy", accuracy[1])

    if mode == tf.estimator.ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)

    # Create training op.
    assert mode == tf.estimator.ModeKeys.TRAIN

    optimizer = tf.compat.v1.train.AdagradOptimizer(learning_rate=0.1)
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


my_feature_columns = [tf.feature_column.numeric_column(key=key) for key in CSV_COLUMN_NAMES]


def build(config):
    return tf.estimator.Estimator(
        model_fn=my_model_fn,
        params={
            "feature_columns": my_feature_columns,
            # Two hidden layers of 10 nodes each.
            "hidden_units": [10, 10],
            # The model must choose between 3 classes.
            "n_classes": 3,
        },
        config=config,
    )
