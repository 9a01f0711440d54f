"""Model functions that tests name with `--model_fn=tests.task_models:<name>`."""

import json
import os
import time

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


def linear_model_fn(features, labels, mode):
    """One dense unit on features of ones, trained by plain SGD: the cheapest real model_fn."""
    prediction = tf.compat.v1.layers.dense(features, 1)
    loss = tf.compat.v1.losses.mean_squared_error(labels, prediction)
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def ones_input_fn():
    """`(ones, ones)` batches of one example, forever."""
    features = tf.data.Dataset.from_tensors(tf.ones([1, 1]))
    return tf.data.Dataset.zip((features, features)).repeat()


#: `role:seconds:marker` of `hang_in_session_once`, e.g. `worker-0:90:/tmp/run/hung`.
SESSION_HANG_ENV = "TEST_SESSION_HANG"


class _HangInSessionCreation(tf.compat.v1.train.SessionRunHook):
    """Blocks in `after_create_session` for `seconds`, once per `marker` file."""

    def __init__(self, seconds, marker):
        self._seconds, self._marker = seconds, marker

    def after_create_session(self, session, coord):
        if os.path.exists(self._marker):
            return
        with open(self._marker, "w") as marker:
            marker.write(f"{os.getpid()}\n")
        time.sleep(self._seconds)


def hang_in_session_once(features, labels, mode, params):
    """mnist_cnn, whose session creation hangs once on the task `TEST_SESSION_HANG` names.

    The hang is in a hook's `after_create_session`, after "Running local_init_op." and before
    the first step, as the hang the watchdog's session bound catches (exit 157); the marker
    file keeps the restarted job from hanging again.
    """
    spec = mnist_cnn.model_fn(features, labels, mode, params)
    role, seconds, marker = os.environ[SESSION_HANG_ENV].split(":", 2)
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    if mode == tf.estimator.ModeKeys.TRAIN and f"{task.get('type')}-{task.get('index')}" == role:
        hook = _HangInSessionCreation(float(seconds), marker)
        spec = spec._replace(training_hooks=(*spec.training_hooks, hook))
    return spec
