"""driver: which TensorFlow errors mean a lost peer (exit 150), and model_fns run as written."""

import sys

import pytest
import tensorflow as tf

from estimator_dist.driver import is_peer_error, model_fn_as_written


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
