"""The functions of TensorFlow's TF1 migration guide, named by `--model_fn`/`--input_fn`.

One epoch of 8 examples, batches of 2, no `max_steps`: TensorFlow trains until
the input ends (4 steps) and evaluates that checkpoint. `main` is the guide's
whole program in plain TensorFlow, the reference a job of these named
functions is compared with:

  python tests/legacy/migration_functions.py --model_dir=/tmp/guide
  python -m estimator_dist.train --model_dir=/tmp/guide2 \\
      --model_fn=tests.legacy.migration_functions:model_fn \\
      --input_fn=tests.legacy.migration_functions:input_fn \\
      --eval_input_fn=tests.legacy.migration_functions:eval_input_fn
"""

import argparse

import tensorflow.compat.v1 as tf1

FEATURES = [[1.0], [2.0], [3.0], [4.0], [5.0], [6.0], [7.0], [8.0]]
LABELS = [[0.5], [1.0], [1.5], [2.0], [2.5], [3.0], [3.5], [4.0]]


def input_fn():
    return tf1.data.Dataset.from_tensor_slices((FEATURES, LABELS)).batch(2)


def eval_input_fn():
    return tf1.data.Dataset.from_tensor_slices((FEATURES[:4], LABELS[:4])).batch(2)


def model_fn(features, labels, mode):
    logits = tf1.layers.Dense(1)(features)
    loss = tf1.losses.mean_squared_error(labels=labels, predictions=logits)
    optimizer = tf1.train.AdagradOptimizer(0.05)
    train_op = optimizer.minimize(loss, global_step=tf1.train.get_global_step())
    return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    args = parser.parse_args()
    estimator = tf1.estimator.Estimator(model_fn=model_fn, model_dir=args.model_dir)
    train_spec = tf1.estimator.TrainSpec(input_fn=input_fn)
    eval_spec = tf1.estimator.EvalSpec(input_fn=eval_input_fn)
    tf1.estimator.train_and_evaluate(estimator, train_spec, eval_spec)


if __name__ == "__main__":
    main()
