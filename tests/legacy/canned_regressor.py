"""A canned LinearRegressor on the diabetes table, features normalised in the columns.

The author standardised each raw feature with a `normalizer_fn` lambda on
its numeric column, from training-set statistics computed at import.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_diabetes

_data = load_diabetes(scaled=False)
NAMES = list(_data.feature_names)
_order = np.random.RandomState(23).permutation(len(_data.target))
X = _data.data[_order].astype(np.float32)
Y = _data.target[_order].astype(np.float32)
TRAIN, TEST = slice(0, 354), slice(354, None)
MEANS, STDS = X[TRAIN].mean(axis=0), X[TRAIN].std(axis=0)


def _columns(part):
    return {name: X[part, i] for i, name in enumerate(NAMES)}


def train_input_fn():
    dataset = tf.data.Dataset.from_tensor_slices((_columns(TRAIN), Y[TRAIN]))
    return dataset.shuffle(354, seed=23).repeat().batch(32)


def eval_input_fn():
    return tf.data.Dataset.from_tensor_slices((_columns(TEST), Y[TEST])).batch(88)


feature_columns = [
    tf.feature_column.numeric_column(
        name, normalizer_fn=lambda x, m=float(MEANS[i]), s=float(STDS[i]): (x - m) / s
    )
    for i, name in enumerate(NAMES)
]


def build(config):
    return tf.estimator.LinearRegressor(
        feature_columns=feature_columns,
        optimizer=tf.keras.optimizers.legacy.SGD(learning_rate=0.05),
        config=config,
    )
