"""The model: a canned LinearRegressor on generated data, trained by its own `train_and_evaluate`.

The function of the same name as TensorFlow's is the package's own, as in AI
Platform's samples; it calls `tf.estimator.train_and_evaluate`.
"""

import numpy as np
import tensorflow as tf


def input_fn(batch_size, seed):
    """y = 2x + 1 on 256 generated points, repeated."""
    x = np.random.RandomState(seed).uniform(-1, 1, size=(256, 1)).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(({"x": x}, 2 * x + 1))
    return dataset.repeat().batch(batch_size)


def build_estimator(job_dir):
    config = tf.estimator.RunConfig(model_dir=job_dir, save_checkpoints_steps=20)
    return tf.compat.v1.estimator.LinearRegressor(
        [tf.feature_column.numeric_column("x")],
        optimizer=tf.compat.v1.train.GradientDescentOptimizer(0.2),
        loss_reduction=tf.compat.v1.losses.Reduction.MEAN,
        config=config,
    )


def train_and_evaluate(args):
    estimator = build_estimator(args.job_dir)
    train_spec = tf.estimator.TrainSpec(
        lambda: input_fn(args.batch_size, 0), max_steps=args.train_steps
    )
    eval_spec = tf.estimator.EvalSpec(
        lambda: input_fn(args.batch_size, 1),
        steps=args.eval_steps,
        start_delay_secs=0,
        throttle_secs=0,
    )
    return tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
