"""A legacy script that trains "for N epochs": its input, not max_steps, ends training.

A linear regression in TF1 style whose training input is one of the shapes
legacy programs use, with `tf.estimator.EvalSpec` left at its defaults
(steps=100, start_delay_secs=120, throttle_secs=600):

* `numpy`: `numpy_input_fn(num_epochs=EPOCHS)`, read whole by every worker;
* `shards`: `from_tensor_slices(...).shard(...)` by `input_context`, then
  `.repeat(EPOCHS).batch(BATCH)`: its cardinality is known;
* `finite`: one pass, sharded, through a `filter`, so that its size is
  known only by reading it; with `--max_steps` larger than the data.

  python tests/legacy/scripts/epochs.py --model_dir=/tmp/epochs --input=numpy
"""

import argparse

import numpy as np
import tensorflow.compat.v1 as tf1


def _data(count):
    # y = 0.5 x0 - 0.25 x1 + 0.1, deterministic: the same examples on every task.
    features = np.linspace(-1.0, 1.0, 2 * count, dtype=np.float32).reshape(count, 2)
    features[:, 1] = features[::-1, 0] * 0.5
    labels = features @ np.array([[0.5], [-0.25]], np.float32) + 0.1
    return features, labels


def _model_fn(features, labels, mode):
    layer = tf1.layers.Dense(1, kernel_initializer=tf1.zeros_initializer())
    predictions = layer(features["x"])
    loss = tf1.losses.mean_squared_error(labels=labels, predictions=predictions)
    optimizer = tf1.train.GradientDescentOptimizer(0.1)
    train_op = optimizer.minimize(loss, global_step=tf1.train.get_global_step())
    return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True, help="Where checkpoints go.")
    parser.add_argument("--input", choices=("numpy", "shards", "finite"), default="shards")
    parser.add_argument("--examples", type=int, default=96, help="Training examples.")
    parser.add_argument("--batch", type=int, default=8, help="Each worker's batch.")
    parser.add_argument("--epochs", type=int, default=2, help="Passes over the data.")
    parser.add_argument("--max_steps", type=int, default=None, help="TrainSpec's max_steps.")
    args = parser.parse_args()
    features, labels = _data(args.examples)

    def sharded(input_context):
        dataset = tf1.data.Dataset.from_tensor_slices(({"x": features}, labels))
        if input_context is not None:
            dataset = dataset.shard(
                input_context.num_input_pipelines, input_context.input_pipeline_id
            )
        return dataset

    if args.input == "numpy":
        train_input_fn = tf1.estimator.inputs.numpy_input_fn(
            {"x": features}, labels, batch_size=args.batch, num_epochs=args.epochs, shuffle=False
        )
    elif args.input == "shards":

        def train_input_fn(input_context=None):
            return sharded(input_context).repeat(args.epochs).batch(args.batch)

    else:

        def train_input_fn(input_context=None):
            return sharded(input_context).filter(lambda x, y: True).batch(args.batch)

    def eval_input_fn():
        dataset = tf1.data.Dataset.from_tensor_slices(({"x": features[:32]}, labels[:32]))
        return dataset.batch(16)

    estimator = tf1.estimator.Estimator(model_fn=_model_fn, model_dir=args.model_dir)
    train_spec = tf1.estimator.TrainSpec(input_fn=train_input_fn, max_steps=args.max_steps)
    eval_spec = tf1.estimator.EvalSpec(input_fn=eval_input_fn)
    tf1.estimator.train_and_evaluate(estimator, train_spec, eval_spec)


if __name__ == "__main__":
    main()
