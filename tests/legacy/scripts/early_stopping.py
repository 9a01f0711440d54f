"""Early stopping the TensorFlow 1 way, in the shape of TensorFlow's migration guide.

An Estimator, an early-stopping hook from `tf.estimator.experimental` in the
TrainSpec, and `train_and_evaluate`: training ends when the evaluations say
accuracy passed `--stop_accuracy`, long before `--max_steps`. As in the
guide, the Estimator gets no model_dir unless `--model_dir` is given. Run as
it is it trains in one process:

  python tests/legacy/scripts/early_stopping.py

and `python -m estimator_dist.launch --script=...` runs it unchanged on
several workers and an evaluator, where TensorFlow's hook alone would stop the
chief and leave the workers waiting.
"""

import argparse

import numpy as np
import tensorflow.compat.v1 as tf1


def _data(count, seed):
    rng = np.random.RandomState(seed)
    features = rng.uniform(-1.0, 1.0, size=(count, 4)).astype(np.float32)
    labels = (features @ np.array([1.0, -2.0, 0.5, 1.5], np.float32) > 0.0).astype(np.int32)
    return features, labels


def _input_fn():
    features, labels = _data(512, seed=1)
    return tf1.data.Dataset.from_tensor_slices(({"x": features}, labels)).repeat().batch(32)


def _eval_input_fn():
    features, labels = _data(200, seed=2)
    return tf1.data.Dataset.from_tensor_slices(({"x": features}, labels)).batch(50)


def _model_fn(features, labels, mode):
    logits = tf1.layers.Dense(2)(features["x"])
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    metrics = {"accuracy": tf1.metrics.accuracy(labels, tf1.argmax(logits, axis=1))}
    train_op = tf1.train.GradientDescentOptimizer(0.5).minimize(
        loss, global_step=tf1.train.get_global_step()
    )
    return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", default=None, help="None: a temporary directory.")
    parser.add_argument("--max_steps", type=int, default=20000)
    parser.add_argument("--stop_accuracy", type=float, default=0.9)
    args = parser.parse_args()

    config = tf1.estimator.RunConfig(save_checkpoints_steps=50)
    estimator = tf1.estimator.Estimator(_model_fn, model_dir=args.model_dir, config=config)
    hook = tf1.estimator.experimental.stop_if_higher_hook(
        estimator, "accuracy", args.stop_accuracy, run_every_secs=None, run_every_steps=10
    )
    train_spec = tf1.estimator.TrainSpec(_input_fn, max_steps=args.max_steps, hooks=[hook])
    eval_spec = tf1.estimator.EvalSpec(_eval_input_fn, start_delay_secs=0, throttle_secs=0)
    tf1.estimator.train_and_evaluate(estimator, train_spec, eval_spec)


if __name__ == "__main__":
    main()
