"""A custom model_fn whose train_op never steps the global step, trained until its input ends.

The shape of TensorFlow Lattice's custom-estimator tutorial: a Keras model
called in a model_fn, an optimizer that updates the weights and leaves the
global step at 0 (there, a Keras optimizer under a canned head; here,
`minimize` without `global_step`), `pandas_input_fn(num_epochs=...)`, then
`train()` with no steps, `evaluate()` and a printed metric. One process
trains until the input ends and evaluates the checkpoint of step 0, saved
when training began (the end saves nothing at an unchanged step); each task
writes what it saw to `--results_dir/<role>.json`:

  python tests/legacy/scripts/global_step_stays.py --model_dir=/tmp/stays --results_dir=/tmp/r
"""

import argparse
import json
import os

import numpy as np
import pandas as pd
import tensorflow as tf


def frame(count, seed):
    rng = np.random.RandomState(seed)
    data = pd.DataFrame({"a": rng.uniform(-1, 1, count), "b": rng.uniform(-1, 1, count)})
    return data, (data["a"] - 0.5 * data["b"] > 0).astype(np.int64)


def model_fn(features, labels, mode, config):
    del config
    inputs = {key: tf.keras.layers.Input(shape=(1,), name=key) for key in ("a", "b")}
    hidden = tf.keras.layers.Concatenate(axis=1)([inputs["a"], inputs["b"]])
    dense = tf.keras.layers.Dense(1, kernel_initializer=tf.keras.initializers.GlorotUniform(3))
    model = tf.keras.Model(inputs=inputs, outputs=dense(hidden))
    logits = model({key: tf.reshape(tf.cast(features[key], tf.float32), [-1, 1]) for key in inputs})
    probabilities = tf.sigmoid(logits)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"probability": probabilities})
    labels = tf.cast(tf.reshape(labels, [-1, 1]), tf.float32)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == tf.estimator.ModeKeys.EVAL:
        auc = tf.compat.v1.metrics.auc(labels, probabilities)
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={"auc": auc})
    optimizer = tf.compat.v1.train.AdagradOptimizer(0.5)
    train_op = optimizer.minimize(loss, var_list=model.trainable_variables)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--results_dir", required=True)
    args = parser.parse_args()
    config = tf.estimator.RunConfig(model_dir=args.model_dir, tf_random_seed=7)
    estimator = tf.estimator.Estimator(model_fn=model_fn, config=config)
    train_x, train_y = frame(200, 0)
    test_x, test_y = frame(100, 1)
    train_input_fn = tf.compat.v1.estimator.inputs.pandas_input_fn(
        train_x, train_y, batch_size=20, num_epochs=3, shuffle=True, num_threads=1
    )
    test_input_fn = tf.compat.v1.estimator.inputs.pandas_input_fn(
        test_x, test_y, batch_size=20, num_epochs=1, shuffle=False, num_threads=1
    )
    estimator.train(input_fn=train_input_fn)
    results = estimator.evaluate(input_fn=test_input_fn)
    print(f"AUC: {results['auc']}")
    role = "local"
    if os.environ.get("TF_CONFIG"):
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        role = f"{task['type']}-{task['index']}"
    os.makedirs(args.results_dir, exist_ok=True)
    with open(os.path.join(args.results_dir, f"{role}.json"), "w") as out:
        json.dump({key: float(value) for key, value in results.items()}, out)


if __name__ == "__main__":
    main()
