"""The "Premade Estimators" tutorial: a canned DNNClassifier on iris.

The tutorial read two CSV files into pandas frames; here scikit-learn's
iris is split 120/30 with a fixed permutation, into dicts of columns. Its
`input_fn(features, labels, training=True, batch_size=256)` is not an
Estimator input function: the tutorial bound it with a lambda at each
call, and this module binds it once, as module-level functions do.
"""

import functools

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_iris

CSV_COLUMN_NAMES = ["SepalLength", "SepalWidth", "PetalLength", "PetalWidth"]
SPECIES = ["Setosa", "Versicolor", "Virginica"]


def load_data():
    iris = load_iris()
    order = np.random.RandomState(42).permutation(len(iris.target))
    data, target = iris.data[order].astype(np.float32), iris.target[order]
    train = {name: data[:120, i] for i, name in enumerate(CSV_COLUMN_NAMES)}
    test = {name: data[120:, i] for i, name in enumerate(CSV_COLUMN_NAMES)}
    return (train, target[:120]), (test, target[120:])


(train, train_y), (test, test_y) = load_data()


def input_fn(features, labels, training=True, batch_size=256):
    """An input function for training or evaluating"""
    # Convert the inputs to a Dataset.
    dataset = tf.data.Dataset.from_tensor_slices((dict(features), labels))

    # Shuffle and repeat if you are in training mode.
    if training:
        dataset = dataset.shuffle(1000, seed=7).repeat()

    return dataset.batch(batch_size)


# Feature columns describe how to use the input.
my_feature_columns = []
for key in train.keys():
    my_feature_columns.append(tf.feature_column.numeric_column(key=key))

train_input_fn = functools.partial(input_fn, train, train_y, training=True, batch_size=32)
eval_input_fn = lambda: input_fn(test, test_y, training=False)  # noqa: E731


def build(config):
    # Build a DNN with 2 hidden layers with 30 and 10 hidden nodes each.
    return tf.estimator.DNNClassifier(
        feature_columns=my_feature_columns,
        # Two hidden layers of 30 and 10 nodes respectively.
        hidden_units=[30, 10],
        # The model must choose between 3 classes.
        n_classes=3,
        # Adam instead of the default Adagrad(0.05): a hundred steps, not 5000.
        optimizer=tf.keras.optimizers.legacy.Adam(learning_rate=0.01),
        config=config,
    )


if __name__ == "__main__":
    classifier = build(tf.estimator.RunConfig())
    classifier.train(input_fn=lambda: input_fn(train, train_y, training=True), steps=5000)
    eval_result = classifier.evaluate(input_fn=lambda: input_fn(test, test_y, training=False))
    print("\nTest set accuracy: {accuracy:0.3f}\n".format(**eval_result))
