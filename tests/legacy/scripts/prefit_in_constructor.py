"""An estimator whose constructor trains a helper estimator on the chief alone.

The shape of TensorFlow Lattice's crystals ensembles (`CannedClassifier` with
`lattices='crystals'`): the constructor settles its model_dir first; on the
chief (`config.is_chief`) it builds a prefitting `Estimator` with no
model_dir (a temporary directory), trains it with `steps`, reads a variable
from it and writes a structure file into the model_dir; every other task
polls for that file. Then `train()` with no steps over epochs, `evaluate()`,
`export_saved_model()` into the model_dir. Each task writes what it saw to
`--results_dir/<role>.json`:

  python tests/legacy/scripts/prefit_in_constructor.py --results_dir=/tmp/prefit
"""

import argparse
import json
import os
import time

import numpy as np
import tensorflow as tf
from tensorflow_estimator.python.estimator import estimator as estimator_lib

STRUCTURE_FILE = "structure.json"


def frame(count, seed):
    rng = np.random.RandomState(seed)
    features = {"a": rng.uniform(-1, 1, count), "b": rng.uniform(-1, 1, count)}
    return features, (features["a"] - 0.5 * features["b"] > 0).astype(np.int64)


def linear_model_fn(features, labels, mode, params):
    columns = [tf.feature_column.numeric_column(name) for name in ("a", "b")]
    inputs = tf.compat.v1.feature_column.input_layer(features, columns)
    scale = tf.compat.v1.get_variable("scale", [2, 1], initializer=tf.zeros_initializer())
    logits = tf.matmul(inputs, scale * params["mask"]) + tf.compat.v1.get_variable(
        "bias", [1], initializer=tf.zeros_initializer()
    )
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    labels = tf.cast(tf.reshape(labels, [-1, 1]), tf.float32)
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    if mode == tf.estimator.ModeKeys.EVAL:
        accuracy = tf.compat.v1.metrics.accuracy(labels, tf.cast(logits > 0, tf.float32))
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy})
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.5)
    step = tf.compat.v1.train.get_global_step()
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(loss, step))


class PrefitClassifier(tf.estimator.Estimator):
    """Keeps the features the chief's prefitting estimator found to matter."""

    def __init__(self, prefit_input_fn, config):
        config = estimator_lib.maybe_overwrite_model_dir_and_session_config(config, None)
        structure = os.path.join(config.model_dir, STRUCTURE_FILE)
        if config.is_chief and not tf.io.gfile.exists(structure):
            prefit = tf.estimator.Estimator(
                linear_model_fn,
                config=tf.estimator.RunConfig(tf_random_seed=42),
                params={"mask": np.ones([2, 1], np.float32)},
            )
            prefit.train(prefit_input_fn, steps=20)
            weights = np.abs(prefit.get_variable_value("scale"))[:, 0]
            with tf.io.gfile.GFile(structure, "w") as out:
                json.dump({"mask": [float(w >= weights.max() / 4) for w in weights]}, out)
        while not tf.io.gfile.exists(structure):
            time.sleep(0.2)
        with tf.io.gfile.GFile(structure) as stream:
            mask = np.array(json.load(stream)["mask"], np.float32).reshape([2, 1])
        super().__init__(linear_model_fn, config=config, params={"mask": mask})


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--results_dir", required=True)
    args = parser.parse_args()
    train_x, train_y = frame(200, 0)
    test_x, test_y = frame(100, 1)
    prefit_input_fn = tf.compat.v1.estimator.inputs.numpy_input_fn(
        train_x, train_y, batch_size=20, num_epochs=None, shuffle=True
    )
    train_input_fn = tf.compat.v1.estimator.inputs.numpy_input_fn(
        train_x, train_y, batch_size=20, num_epochs=2, shuffle=True
    )
    test_input_fn = tf.compat.v1.estimator.inputs.numpy_input_fn(
        test_x, test_y, batch_size=20, num_epochs=1, shuffle=False
    )
    estimator = PrefitClassifier(prefit_input_fn, tf.estimator.RunConfig(tf_random_seed=42))
    estimator.train(input_fn=train_input_fn)
    results = estimator.evaluate(input_fn=test_input_fn)
    print(f"Prefit ensemble results: {results}")
    spec = {
        name: tf.io.FixedLenFeature([1], tf.float32, default_value=[0.0]) for name in ("a", "b")
    }
    serving_input_fn = tf.estimator.export.build_parsing_serving_input_receiver_fn(spec)
    exported = estimator.export_saved_model(estimator.model_dir, serving_input_fn)
    role = "local"
    if os.environ.get("TF_CONFIG"):
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        role = f"{task['type']}-{task['index']}"
    os.makedirs(args.results_dir, exist_ok=True)
    with open(os.path.join(args.results_dir, f"{role}.json"), "w") as out:
        json.dump(
            {
                "global_step": int(results["global_step"]),
                "model_dir": estimator.model_dir,
                "export": exported.decode(),
                "mask": json.load(open(os.path.join(estimator.model_dir, STRUCTURE_FILE)))["mask"],
            },
            out,
        )


if __name__ == "__main__":
    main()
