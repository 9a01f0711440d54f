"""Training that the program's own hook ends, over an input that ends too.

The model_fn returns `EstimatorSpec(training_hooks=[StopAtStepHook(num_steps=2)])`
and the training input yields 3 batches: TensorFlow stops at global step 2,
checkpoints it and evaluates it, as in TensorFlow's migration guide for
`StopAtStepHook`. No `max_steps` anywhere:

  python tests/legacy/scripts/stop_hook_finite.py --model_dir=/tmp/stop
"""

import argparse

import numpy as np
import tensorflow.compat.v1 as tf


def input_fn():
    x = np.arange(12, dtype=np.float32).reshape(6, 2) / 12
    return tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True))).batch(2)


def model_fn(features, labels, mode):
    prediction = tf.layers.dense(features, 1)
    loss = tf.losses.mean_squared_error(labels, prediction)
    train_op = tf.train.AdagradOptimizer(0.1).minimize(loss, tf.train.get_global_step())
    hooks = [tf.train.StopAtStepHook(num_steps=2)]
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, training_hooks=hooks)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    args = parser.parse_args()
    estimator = tf.estimator.Estimator(model_fn, model_dir=args.model_dir)
    tf.estimator.train_and_evaluate(
        estimator, tf.estimator.TrainSpec(input_fn), tf.estimator.EvalSpec(input_fn)
    )
    print("done")


if __name__ == "__main__":
    main()
