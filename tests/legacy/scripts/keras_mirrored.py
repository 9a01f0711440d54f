"""A Keras model on Estimator with a MirroredStrategy of its own, in a deep-learning book's shape.

A `Sequential` model compiled with a (non-legacy) `tf.keras.optimizers.SGD`,
converted with `model_to_estimator` under `RunConfig(train_distribute=
tf.distribute.MirroredStrategy())`, trained for epochs of numpy arrays with
`train()` and evaluated with `evaluate()`. TensorFlow converts the optimizer
to its legacy equivalent when eager execution is on, as it is in one process:

  python tests/legacy/scripts/keras_mirrored.py --model_dir=/tmp/mirrored --epochs=3
"""

import argparse

import numpy as np
import tensorflow as tf


def input_fn(epochs, seed):
    rng = np.random.RandomState(seed)
    x = rng.uniform(-1.0, 1.0, size=(96, 4)).astype(np.float32)
    y = (x.sum(axis=1) > 0).astype(np.int64)
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    return dataset.repeat(epochs).batch(16)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Dense(8, activation="relu", input_shape=(4,)),
            tf.keras.layers.Dense(2, activation="softmax"),
        ]
    )
    model.compile(
        optimizer=tf.keras.optimizers.SGD(0.1),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    config = tf.estimator.RunConfig(
        model_dir=args.model_dir, train_distribute=tf.distribute.MirroredStrategy()
    )
    estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
    estimator.train(lambda: input_fn(args.epochs, 0))
    results = estimator.evaluate(lambda: input_fn(1, 1))
    print("evaluated:", sorted(results))


if __name__ == "__main__":
    main()
