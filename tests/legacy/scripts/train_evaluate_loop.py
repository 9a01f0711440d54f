"""A program that trains in train()/evaluate() cycles, in the shape of TensorFlow's r1 models.

Like tensorflow/models' official r1 wide-and-deep and MNIST programs and the
premade and custom estimator tutorials, it never calls `train_and_evaluate`:
it alternates `estimator.train(steps=...)` and `estimator.evaluate(...)`,
stops early when the evaluation passes a threshold, exports a SavedModel,
and predicts. Run as it is it trains in one process:

  python tests/legacy/scripts/train_evaluate_loop.py --model_dir=/tmp/loop

`python -m estimator_dist.launch --script=...` runs it unchanged on several
workers. Its input shards by `input_context` and batches by the per-replica
size, and it writes what each `evaluate()` returned to
`--results_dir/<task>.json`, so tests can compare every task's results.
"""

import argparse
import json
import os

import numpy as np
import tensorflow.compat.v1 as tf1

#: Examples in the training set; a multiple of every global batch the tests use.
EXAMPLES = 384


def _data(count, seed):
    rng = np.random.RandomState(seed)
    features = rng.uniform(-1.0, 1.0, size=(count, 4)).astype(np.float32)
    labels = (features @ np.array([1.0, -2.0, 0.5, 1.5], np.float32) > 0.0).astype(np.int32)
    return features, labels


def make_train_input_fn(global_batch):
    def input_fn(input_context=None):
        features, labels = _data(EXAMPLES, seed=1)
        dataset = tf1.data.Dataset.from_tensor_slices(({"x": features}, labels))
        batch = global_batch
        if input_context is not None:
            dataset = dataset.shard(
                input_context.num_input_pipelines, input_context.input_pipeline_id
            )
            batch = input_context.get_per_replica_batch_size(global_batch)
        return dataset.repeat().batch(batch)

    return input_fn


def eval_input_fn():
    features, labels = _data(200, seed=2)
    return tf1.data.Dataset.from_tensor_slices(({"x": features}, labels)).batch(50)


def model_fn(features, labels, mode):
    dense = tf1.layers.Dense(2, kernel_initializer=tf1.glorot_uniform_initializer(seed=7))
    logits = dense(features["x"])
    predictions = {"class": tf1.argmax(logits, axis=1)}
    if mode == tf1.estimator.ModeKeys.PREDICT:
        return tf1.estimator.EstimatorSpec(mode, predictions=predictions)
    loss = tf1.losses.sparse_softmax_cross_entropy(labels, logits)
    metrics = {"accuracy": tf1.metrics.accuracy(labels, predictions["class"])}
    optimizer = tf1.train.GradientDescentOptimizer(0.5)
    train_op = optimizer.minimize(loss, global_step=tf1.train.get_global_step())
    return tf1.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, eval_metric_ops=metrics)


def serving_input_receiver_fn():
    x = tf1.placeholder(tf1.float32, [None, 4], name="x")
    return tf1.estimator.export.ServingInputReceiver({"x": x}, {"x": x})


def _task_name():
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task")
    return f"{task['type']}-{task['index']}" if task else "local"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--cycles", type=int, default=4)
    parser.add_argument("--steps_per_cycle", type=int, default=20)
    parser.add_argument("--batch_size", type=int, default=32, help="The global batch.")
    parser.add_argument("--stop_accuracy", type=float, default=2.0)
    parser.add_argument("--results_dir", default=None)
    args = parser.parse_args()

    estimator = tf1.estimator.Estimator(model_fn=model_fn, model_dir=args.model_dir)
    history = []
    for _ in range(args.cycles):
        estimator.train(make_train_input_fn(args.batch_size), steps=args.steps_per_cycle)
        results = estimator.evaluate(eval_input_fn)
        history.append({k: (v.item(), v.dtype.str) for k, v in sorted(results.items())})
        print(f"cycle at step {results['global_step']}: accuracy {results['accuracy']:.4f}")
        if results["accuracy"] >= args.stop_accuracy:
            break
    exported = estimator.export_saved_model(
        os.path.join(args.model_dir, "export"), serving_input_receiver_fn
    )
    predictions = list(estimator.predict(eval_input_fn))
    if args.results_dir:
        os.makedirs(args.results_dir, exist_ok=True)
        with open(os.path.join(args.results_dir, f"{_task_name()}.json"), "w") as stream:
            json.dump(
                {
                    "history": history,
                    "export": exported.decode(),
                    "predictions": len(predictions),
                },
                stream,
            )


if __name__ == "__main__":
    main()
