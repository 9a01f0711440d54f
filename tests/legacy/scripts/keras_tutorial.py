"""A Keras model turned into an Estimator, in the shape of TensorFlow's model_to_estimator tutorial.

A Sequential model compiled with the optimizer's name (its loss told that the
last layer gives logits), a model_dir from
`tempfile.mkdtemp()`, `tf.keras.estimator.model_to_estimator`, then
`train(steps=...)` and `evaluate(steps=...)`. Run as it is it trains in one
process:

  python tests/legacy/scripts/keras_tutorial.py

`python -m estimator_dist.launch --script=... --model_dir=DIR` runs it
unchanged on several workers: every task's temporary directory becomes DIR.
"""

import argparse
import tempfile

import numpy as np
import tensorflow as tf


def input_fn():
    rng = np.random.RandomState(0)
    features = rng.uniform(-1.0, 1.0, size=(150, 4)).astype(np.float32)
    labels = np.eye(3, dtype=np.float32)[
        (features.sum(axis=1) > 0).astype(int) + (features[:, 0] > 0.5)
    ]
    dataset = tf.data.Dataset.from_tensor_slices(({"dense_input": features}, labels))
    return dataset.batch(32).repeat()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    model = tf.keras.models.Sequential(
        [
            tf.keras.layers.Dense(16, activation="relu", input_shape=(4,)),
            tf.keras.layers.Dropout(0.2),
            tf.keras.layers.Dense(3),
        ]
    )
    # The tutorial's "categorical_crossentropy" reads this layer's logits as probabilities,
    # normalised by their sum: an unseeded start whose sum nears 0 trains to a NaN loss
    # (seen once in the suite). The loss told the outputs are logits keeps the shape, not that.
    loss = tf.keras.losses.CategoricalCrossentropy(from_logits=True)
    model.compile(loss=loss, optimizer="adam")
    model_dir = tempfile.mkdtemp()
    keras_estimator = tf.keras.estimator.model_to_estimator(keras_model=model, model_dir=model_dir)
    keras_estimator.train(input_fn=input_fn, steps=args.steps)
    eval_result = keras_estimator.evaluate(input_fn=input_fn, steps=10)
    print(f"Eval result: {eval_result}")


if __name__ == "__main__":
    main()
