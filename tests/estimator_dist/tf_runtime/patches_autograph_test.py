"""tf_runtime.patches, patch 4: under a strategy the model_fn runs as written, not rewritten."""

import copy
import sys

import pytest
import tensorflow as tf
from tensorflow.python.autograph.impl.api import is_autograph_artifact

from estimator_dist.config.job import JobConfig
from estimator_dist.task import driver, preflight
from estimator_dist.tf_runtime import patches
from run_config.run_config import RunConfigOptions

pytestmark = pytest.mark.usefixtures("patches_installed")


def _recording_model_fn(seen):
    def model_fn(features, labels, mode):
        # AutoGraph runs a rewritten copy of this function, compiled from a generated file.
        seen.append(sys._getframe().f_code.co_filename)
        prediction = tf.compat.v1.layers.dense(features, 1)
        loss = tf.compat.v1.losses.mean_squared_error(labels, prediction)
        step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, step)
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    return model_fn


def _input_fn():
    features = tf.data.Dataset.from_tensor_slices(tf.ones([8, 1]))
    return tf.data.Dataset.zip((features, features)).batch(4).repeat()


@pytest.mark.parametrize("as_written", [True, False])
def test_model_fn_runs_as_written_under_a_strategy(tmp_path, as_written):
    seen = []
    config = tf.estimator.RunConfig(train_distribute=tf.distribute.MirroredStrategy(["/cpu:0"]))
    estimator = tf.estimator.Estimator(
        _recording_model_fn(seen), model_dir=str(tmp_path), config=config
    )
    if not as_written:
        patches.uninstall()
    estimator.train(_input_fn, max_steps=2)
    assert len(seen) == 1
    # Without the marking, the strategy's AutoGraph pass rewrites the model_fn:
    # the control that shows this test can fail.
    assert (seen[0] == __file__) is as_written, seen


def test_the_marking_follows_a_copy_of_the_estimator(tmp_path):
    # The distribute coordinator trains a deep copy of the estimator.
    estimator = tf.estimator.Estimator(_recording_model_fn([]), model_dir=str(tmp_path))
    copied = copy.deepcopy(estimator)
    assert copied._call_model_fn.__self__ is copied
    assert is_autograph_artifact(copied._call_model_fn)


@pytest.mark.parametrize(
    "kind",
    [
        dict(model_fn="mnist_cnn"),
        dict(keras_model="mnist_cnn"),
        dict(
            estimator="canned_dnn", input_fn="tabular", params={"dataset": "iris", "n_classes": 3}
        ),
    ],
    ids=lambda kind: next(iter(kind)),
)
def test_every_kind_of_estimator_the_driver_makes_is_marked(tmp_path, data_dir, kind):
    job = JobConfig(
        run=RunConfigOptions(model_dir=str(tmp_path / "model")), data_dir=data_dir, **kind
    )
    estimator = driver.make_estimator(
        job, preflight.preflight(job), tf.estimator.RunConfig(model_dir=job.run.model_dir)
    )
    assert is_autograph_artifact(estimator._call_model_fn)
