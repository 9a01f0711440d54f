"""Hooks of every kind, in the shape of TensorFlow's TF1 migration guides for hooks.

`max_steps = epochs * examples / batch_size`, a float as such programs compute
it (TensorFlow stops at the first step past it); a `LoggingTensorHook` and a
hook of the program's own in `TrainSpec(hooks=...)`; another in the model_fn's
`EstimatorSpec(training_hooks=...)` and one in its `evaluation_hooks`;
`RunConfig(save_summary_steps=..., log_step_count_steps=...)`:

  python tests/legacy/scripts/hooks_tf1.py --model_dir=/tmp/hooks --epochs=5
"""

import argparse

import numpy as np
import tensorflow.compat.v1 as tf

EXAMPLES, BATCH = 100, 32


class CountingHook(tf.train.SessionRunHook):
    """Counts the session runs it sees; says so at the end when `name` is given."""

    def __init__(self, name=None):
        self.name = name
        self.runs = 0

    def after_run(self, run_context, run_values):
        self.runs += 1

    def end(self, session):
        if self.name:
            step = session.run(tf.train.get_global_step())
            print(f"{self.name}: {self.runs} runs, global step {step}")


def input_fn():
    rng = np.random.RandomState(0)
    x = rng.uniform(-1, 1, size=(EXAMPLES, 3)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True)
    return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).repeat().batch(BATCH)


def eval_input_fn():
    rng = np.random.RandomState(1)
    x = rng.uniform(-1, 1, size=(64, 3)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices(({"x": x}, x.sum(axis=1, keepdims=True))).batch(BATCH)


def model_fn(features, labels, mode):
    prediction = tf.layers.dense(features["x"], 1)
    loss = tf.losses.mean_squared_error(labels, prediction)
    train_op = tf.train.GradientDescentOptimizer(0.1).minimize(loss, tf.train.get_global_step())
    return tf.estimator.EstimatorSpec(
        mode,
        loss=loss,
        train_op=train_op,
        training_hooks=[CountingHook()],
        evaluation_hooks=[CountingHook()],
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    config = tf.estimator.RunConfig(
        model_dir=args.model_dir, save_summary_steps=5, log_step_count_steps=5
    )
    estimator = tf.estimator.Estimator(model_fn, config=config)
    max_steps = args.epochs * EXAMPLES / BATCH
    hooks = [
        tf.estimator.LoggingTensorHook(["global_step:0"], every_n_iter=5),
        CountingHook("own training hook"),
    ]
    train_spec = tf.estimator.TrainSpec(input_fn, max_steps=max_steps, hooks=hooks)
    eval_spec = tf.estimator.EvalSpec(eval_input_fn, start_delay_secs=0, throttle_secs=1)
    tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)


if __name__ == "__main__":
    main()
