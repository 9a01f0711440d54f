"""A Keras functional model compiled with `optimizer='adam'`, for model_to_estimator.

Authors of Keras models turned them into Estimators with
`tf.keras.estimator.model_to_estimator(keras_model=build())`; the input
names of the model are the feature names of the input function, and one
input function serves both modes.
"""

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits


def build():
    inputs = tf.keras.Input(shape=(64,), name="pixels")
    hidden = tf.keras.layers.Dense(
        32, activation="relu", kernel_initializer=tf.keras.initializers.GlorotUniform(seed=1)
    )(inputs)
    outputs = tf.keras.layers.Dense(
        10, activation="softmax", kernel_initializer=tf.keras.initializers.GlorotUniform(seed=2)
    )(hidden)
    model = tf.keras.Model(inputs=inputs, outputs=outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def input_fn(mode):
    digits = load_digits()
    part = slice(0, 1500) if mode == tf.estimator.ModeKeys.TRAIN else slice(1500, None)
    pixels = (digits.data[part] / 16.0).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(({"pixels": pixels}, digits.target[part]))
    if mode == tf.estimator.ModeKeys.TRAIN:
        dataset = dataset.shuffle(1500, seed=6).repeat()
    return dataset.batch(32)


if __name__ == "__main__":
    estimator = tf.keras.estimator.model_to_estimator(keras_model=build())
    estimator.train(lambda: input_fn(tf.estimator.ModeKeys.TRAIN), steps=200)
    print(estimator.evaluate(lambda: input_fn(tf.estimator.ModeKeys.EVAL)))
