"""driver.is_peer_error: which TensorFlow errors mean a lost peer (exit 150)."""

import pytest
import tensorflow as tf

from estimator_dist.driver import is_peer_error


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
