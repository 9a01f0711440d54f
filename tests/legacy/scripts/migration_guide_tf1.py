"""The TF1 example of TensorFlow's multi-worker migration guide, as one whole script.

A one-layer regression written the TensorFlow 1 way: `tf.compat.v1` layers,
losses and optimizer in a model_fn, an Estimator with no RunConfig (so no
`train_distribute`), and `train_and_evaluate` at the end. Run as it is it
trains in one process:

  python tests/legacy/scripts/migration_guide_tf1.py --model_dir=/tmp/tf1 --max_steps=200

and `python -m estimator_dist.launch --script=...` runs it unchanged on
several workers and an evaluator.
"""

import argparse

import numpy as np
import tensorflow.compat.v1 as tf1


def _points(count, seed):
    # y = 0.5 x0 - 0.25 x1 + 0.1, with a little noise.
    rng = np.random.RandomState(seed)
    features = rng.uniform(-1.0, 1.0, size=(count, 2)).astype(np.float32)
    labels = features @ np.array([[0.5], [-0.25]], np.float32) + 0.1
    return features, labels + rng.normal(0.0, 0.01, size=labels.shape).astype(np.float32)


def _input_fn():
    features, labels = _points(256, seed=1)
    return tf1.data.Dataset.from_tensor_slices((features, labels)).repeat().batch(16)


def _eval_input_fn():
    features, labels = _points(64, seed=2)
    return tf1.data.Dataset.from_tensor_slices((features, labels)).batch(16)


def _model_fn(features, labels, mode):
    predictions = tf1.layers.Dense(1)(features)
    loss = tf1.losses.mean_squared_error(labels=labels, predictions=predictions)
    optimizer = tf1.train.AdagradOptimizer(0.1)
    train_op = optimizer.minimize(loss, global_step=tf1.train.get_global_step())
    return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True, help="Where checkpoints go.")
    parser.add_argument("--max_steps", type=int, default=1000, help="Training steps.")
    args = parser.parse_args()

    estimator = tf1.estimator.Estimator(model_fn=_model_fn, model_dir=args.model_dir)
    train_spec = tf1.estimator.TrainSpec(input_fn=_input_fn, max_steps=args.max_steps)
    eval_spec = tf1.estimator.EvalSpec(input_fn=_eval_input_fn)
    tf1.estimator.train_and_evaluate(estimator, train_spec, eval_spec)


if __name__ == "__main__":
    main()
