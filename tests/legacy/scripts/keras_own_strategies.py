"""A Keras model on Estimator with strategies the program builds, as Kubeflow's TFJob examples do.

The model_dir is the first positional argument; the program builds a
`MultiWorkerMirroredStrategy` for training and evaluation itself and hands
them to `RunConfig(experimental_distribute=DistributeConfig(...))`, converts
a compiled Keras model with `model_to_estimator`, and trains with
`train_and_evaluate` on numpy arrays:

  python tests/legacy/scripts/keras_own_strategies.py /tmp/model [STEPS]
"""

import sys

import numpy as np
import tensorflow as tf
from tensorflow.python.distribute.distribute_config import DistributeConfig


def input_fn(count, seed):
    rng = np.random.RandomState(seed)
    x = rng.uniform(-1.0, 1.0, size=(count, 4)).astype(np.float32)
    y = (x @ np.array([[0.5], [-0.3], [0.2], [0.1]], np.float32)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(16)


def main(model_dir, steps):
    model = tf.keras.Sequential(
        [tf.keras.layers.Dense(8, activation="relu", input_shape=(4,)), tf.keras.layers.Dense(1)]
    )
    model.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.05), loss="mse")
    strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()
    config = tf.estimator.RunConfig(
        model_dir=model_dir,
        save_checkpoints_steps=10,
        experimental_distribute=DistributeConfig(
            train_distribute=strategy, eval_distribute=strategy
        ),
    )
    estimator = tf.keras.estimator.model_to_estimator(keras_model=model, config=config)
    train_spec = tf.estimator.TrainSpec(input_fn=lambda: input_fn(256, 0), max_steps=steps)
    eval_spec = tf.estimator.EvalSpec(
        input_fn=lambda: input_fn(64, 1), steps=4, start_delay_secs=0, throttle_secs=1
    )
    tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    print("training finished")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40)
