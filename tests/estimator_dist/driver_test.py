"""driver: which TensorFlow errors mean a lost peer (exit 150), and model_fns run as written."""

import copy
import sys

import pytest
import tensorflow as tf
from tensorflow.python.autograph.impl.api import is_autograph_artifact

from estimator_dist import driver, exit_codes
from estimator_dist.driver import is_peer_error, model_fn_as_written
from estimator_dist.errors import DataError, PeerFailureError
from run_config.run_config import RunConfigOptions


@pytest.mark.parametrize(
    "error",
    [
        tf.errors.UnavailableError(None, None, "Socket closed"),
        tf.errors.AbortedError(None, None, "peer restarted"),
        tf.errors.DeadlineExceededError(None, None, "deadline"),
        tf.errors.CancelledError(None, None, "cancelled"),
        # What the chief raised when a worker's input ran out mid-step (TF 2.15).
        tf.errors.InternalError(
            None,
            None,
            "From /job:chief/replica:0/task:0:\nCollective ops is aborted by: Delete called on "
            "non-empty BufRendezvous\nAdditional GRPC error information from remote target "
            "/job:worker/replica:0/task:0 while calling /tensorflow.WorkerService/RecvBuf",
        ),
    ],
    ids=lambda error: type(error).__name__,
)
def test_collective_and_connection_errors_are_peer_errors(error):
    assert is_peer_error(error)


@pytest.mark.parametrize(
    "error",
    [
        tf.errors.InternalError(None, None, "Blas GEMM launch failed"),
        tf.errors.InvalidArgumentError(None, None, "Incompatible shapes"),
        tf.errors.DataLossError(None, None, "corrupted record at 12"),
    ],
    ids=lambda error: type(error).__name__,
)
def test_other_errors_are_not(error):
    assert not is_peer_error(error)


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
    if as_written:
        assert model_fn_as_written(estimator) is estimator
    estimator.train(_input_fn, max_steps=2)
    assert len(seen) == 1
    # Without the marking, the strategy's AutoGraph pass rewrites the model_fn:
    # the control that shows this test can fail.
    assert (seen[0] == __file__) is as_written, seen


def test_the_marking_follows_a_copy_of_the_estimator(tmp_path):
    # The distribute coordinator trains a deep copy of the estimator.
    estimator = model_fn_as_written(
        tf.estimator.Estimator(_recording_model_fn([]), model_dir=str(tmp_path))
    )
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
def test_every_kind_of_estimator_the_driver_makes_runs_its_model_fn_as_written(
    tmp_path, data_dir, kind
):
    job = driver.JobConfig(
        run=RunConfigOptions(model_dir=str(tmp_path / "model")), data_dir=data_dir, **kind
    )
    estimator = driver._make_estimator(
        job, driver.preflight(job), tf.estimator.RunConfig(model_dir=job.run.model_dir)
    )
    assert is_autograph_artifact(estimator._call_model_fn)


def test_a_collective_aborted_by_a_bad_record_is_bad_data_not_a_lost_peer():
    # StartAbort keeps the cause's message, here the marker of a bad record.
    error = tf.errors.InternalError(
        None,
        None,
        "Collective ops is aborted by: <bad-data>train.tfrecord record 7: truncated</bad-data>",
    )
    explained = driver.explain_training_error(error, step=12, seconds=3.0)
    assert isinstance(explained, DataError)
    assert explained.exit_code == exit_codes.BAD_DATA
    assert "train.tfrecord record 7: truncated" in str(explained)


def test_a_lost_peer_is_explained_with_its_step_and_time():
    error = tf.errors.UnavailableError(
        None,
        None,
        "Socket closed\nAdditional GRPC error information from remote target "
        "/job:worker/replica:0/task:1 while calling /tensorflow.WorkerService/RecvBuf",
    )
    explained = driver.explain_training_error(error, step=12, seconds=3.0)
    assert isinstance(explained, PeerFailureError)
    assert explained.exit_code == exit_codes.PEER_FAILURE
    assert "UnavailableError at global step 12 after 3.0 s (Socket closed; peer worker-1)" in str(
        explained
    )


def test_other_training_errors_are_left_as_they_are():
    error = tf.errors.InvalidArgumentError(None, None, "Incompatible shapes")
    assert driver.explain_training_error(error, step=1, seconds=1.0) is None
