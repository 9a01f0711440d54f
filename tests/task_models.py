"""Model functions that tests name with `--model_fn=tests.task_models:<name>`."""

import json
import os

import tensorflow as tf

from model_fns import mnist_cnn


class _AbortOnce(tf.compat.v1.train.SessionRunHook):
    """Raises one AbortedError after `step`, as a transient gRPC failure would."""

    def __init__(self, step):
        self._step = step
        self._raised = False

    def begin(self):
        self._global_step = tf.compat.v1.train.get_global_step()

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context, run_values):
        if not self._raised and run_values.results >= self._step:
            self._raised = True
            raise tf.errors.AbortedError(None, None, "injected transient error on the worker")


def transient_error_on_worker(features, labels, mode, params):
    """mnist_cnn, plus one transient AbortedError on the worker task at step 30.

    TensorFlow alone would re-create the worker's session and restore the
    last checkpoint on that worker only, diverging from the chief.
    """
    spec = mnist_cnn.model_fn(features, labels, mode, params)
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    if mode == tf.estimator.ModeKeys.TRAIN and task.get("type") == "worker":
        spec = spec._replace(training_hooks=(*spec.training_hooks, _AbortOnce(30)))
    return spec


def keras_new_optimizer(params):
    """The Keras CNN compiled with a non-legacy optimizer, which the bridge refuses."""
    inputs = tf.keras.Input(params["feature_shapes"]["image"], name="image")
    model = tf.keras.Model(inputs, mnist_cnn.build_layers(mnist_cnn.CnnParams())(inputs))
    model.compile(optimizer=tf.keras.optimizers.Adam(), loss="sparse_categorical_crossentropy")
    return model
