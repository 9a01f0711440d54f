"""diagnose: which TensorFlow errors mean a lost peer (exit 150), a collective shape mismatch
(exit 7), a bad record (exit 3) or an unwritable model_dir (exit 9)."""

import errno
import os

import pytest
import tensorflow as tf

from estimator_dist.base import exit_codes
from estimator_dist.base.errors import (
    DataError,
    ModelDirUnwritableError,
    PeerFailureError,
    UsageError,
)
from estimator_dist.task import diagnose
from estimator_dist.task.diagnose import is_peer_error


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


def test_a_collective_aborted_by_a_bad_record_is_bad_data_not_a_lost_peer():
    # StartAbort keeps the cause's message, here the marker of a bad record.
    error = tf.errors.InternalError(
        None,
        None,
        "Collective ops is aborted by: <bad-data>train.tfrecord record 7: truncated</bad-data>",
    )
    explained = diagnose.explain_training_error(error, step=12, seconds=3.0)
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
    explained = diagnose.explain_training_error(error, step=12, seconds=3.0)
    assert isinstance(explained, PeerFailureError)
    assert explained.exit_code == exit_codes.PEER_FAILURE
    assert "UnavailableError at global step 12 after 3.0 s (Socket closed; peer worker-1)" in str(
        explained
    )


def test_other_training_errors_are_left_as_they_are():
    error = tf.errors.InvalidArgumentError(None, None, "Incompatible shapes")
    assert diagnose.explain_training_error(error, step=1, seconds=1.0) is None


# --- a model_dir whose storage refuses writes (exit 9) --------------------------------
# The messages are TensorFlow 2.15's, as seen on a full tmpfs, a read-only bind mount and a
# directory without write permission (tests/estimator_dist/faults_test.py runs those).


def _checkpoint(model_dir, step, size):
    """Writes the files of a checkpoint of `step` taking `size` bytes, and lists it."""
    prefix = os.path.join(model_dir, f"model.ckpt-{step}")
    for suffix, share in ((".index", 1024), (".data-00000-of-00001", size - 1024)):
        with open(prefix + suffix, "wb") as stream:
            stream.write(bytes(share))
    tf.compat.v1.train.update_checkpoint_state(model_dir, prefix)
    return prefix


@pytest.mark.parametrize("seen", [99, 2], ids=["last step", "stale step"])
def test_a_checkpoint_save_on_a_full_disk_names_the_path_space_and_fix(tmp_path, seen):
    model_dir = str(tmp_path)
    latest = _checkpoint(model_dir, 50, 400 * 1024)
    path = f"{model_dir}/model.ckpt-100_temp/part-00000-of-00001.data-00000-of-00001.tempstate91"
    error = tf.errors.ResourceExhaustedError(
        None,
        None,
        "Graph execution error:\n\nDetected at node 'save/SaveV2' defined at (most recent call "
        "last):\n    File \"train.py\", line 447, in <module>\nNode: 'save/SaveV2'\n"
        f"{path}; No space left on device\n\t [[{{{{node save/SaveV2}}}}]]\nHint: If you want "
        "to see a list of allocated tensors when OOM happens, add report_tensor_allocations",
    )
    # The watchdog looks at the global step every few seconds: the checkpoint's own step is newer.
    explained = diagnose.explain_training_error(error, seen, 3.0, model_dir)
    assert isinstance(explained, ModelDirUnwritableError)
    assert explained.exit_code == exit_codes.MODEL_DIR_UNWRITABLE
    message = str(explained)
    assert message.startswith(
        f"cannot write the checkpoint of step 100 to {model_dir} at global step 100: No space "
        f"left on device ({path}; "
    ), message
    assert " free of " in message and "; the latest checkpoint takes 400 KiB)" in message
    assert f"training resumes from {latest}." in message
    assert "A restart would fail the same way, so the job is not retried: free space" in message


#: What a refused write raised, as a function of model_dir, and what the message calls it.
REFUSED_WRITES = {
    # From the thread writing event files, which Estimator's evaluation re-raises.
    "events": (
        lambda d: RuntimeError(
            f"{d}/eval/events.out.tfevents.1795478560.vm; No space left on device\n"
            f"\tFailed to flush 2 events to {d}/eval/events.out.tfevents.1795478560.vm"
        ),
        "evaluation event file",
    ),
    "read-only": (
        lambda d: tf.errors.PermissionDeniedError(
            None, None, f"{d}/checkpoint.tmp8d96e647ba43; Read-only file system"
        ),
        "checkpoint list (the file `checkpoint`, which names the latest one)",
    ),
    "permission": (
        lambda d: tf.errors.PermissionDeniedError(None, None, f"{d}/export; Permission denied"),
        "SavedModel export",
    ),
    "quota": (
        lambda d: tf.errors.ResourceExhaustedError(
            None, None, f"{d}/graph.pbtxt.tmpf8d23ace; Disk quota exceeded"
        ),
        "file graph.pbtxt",
    ),
    "directory": (
        lambda d: tf.errors.PermissionDeniedError(None, None, f"{d}/preemption; Permission denied"),
        "directory preemption",
    ),
    "oserror": (
        lambda d: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), f"{d}/.keras_bridge.lock"),
        "file .keras_bridge.lock",
    ),
    "creating": (
        lambda d: tf.errors.PermissionDeniedError(None, None, f"{d}; Read-only file system"),
        "directory itself (creating it)",
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSED_WRITES))
def test_each_refused_write_to_model_dir_names_what_was_written(tmp_path, case):
    model_dir = str(tmp_path / "run")
    make_error, what = REFUSED_WRITES[case]
    explained = diagnose.explain_storage_error(make_error(model_dir), model_dir, step=None)
    assert isinstance(explained, ModelDirUnwritableError)
    assert str(explained).startswith(f"cannot write the {what} to {model_dir}: "), explained
    assert "No checkpoint had been written yet." in str(explained)


@pytest.mark.parametrize(
    "error",
    [
        # Reading data can be refused too: only writes to model_dir count.
        tf.errors.PermissionDeniedError(None, None, "/data/train.tfrecord; Permission denied"),
        tf.errors.ResourceExhaustedError(
            None, None, "OOM when allocating tensor with shape[64,32,26,26] and type float"
        ),
        tf.errors.ResourceExhaustedError(None, None, "/tmp/cache.data; No space left on device"),
        OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
        RuntimeError("injected failure"),
    ],
    ids=["read", "oom", "elsewhere", "no-path", "other"],
)
def test_other_errors_are_not_an_unwritable_model_dir(tmp_path, error):
    assert diagnose.explain_storage_error(error, str(tmp_path), step=3) is None


def test_without_a_model_dir_only_a_full_or_read_only_filesystem_counts():
    full = tf.errors.ResourceExhaustedError(
        None, None, "/r/model.ckpt-9.index; No space left on device"
    )
    refused = tf.errors.PermissionDeniedError(
        None, None, "/r/model.ckpt-9.index; Permission denied"
    )
    assert isinstance(diagnose.explain_training_error(full, 8, 1.0), ModelDirUnwritableError)
    assert diagnose.explain_training_error(refused, 8, 1.0) is None


def test_a_model_dir_on_a_file_system_tensorflow_lacks_is_a_usage_error():
    with pytest.raises(UsageError) as raised:
        with diagnose.refused_writes("s3://bucket/run"):
            tf.io.gfile.makedirs("s3://bucket/run")
    message = str(raised.value)
    assert "--model_dir=s3://bucket/run" in message
    assert "s3" in message and "Mount the storage" in message


# --- a checkpoint deleted while it was restored (exit 159) ----------------------------


def save_checkpoints(model_dir, steps):
    """Real checkpoints of one variable at each of `steps`; returns their paths."""
    paths = []
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("v", [3])
        saver = tf.compat.v1.train.Saver(max_to_keep=None)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for step in steps:
                paths.append(saver.save(session, f"{model_dir}/model.ckpt", global_step=step))
    return paths


def restore_error(path):
    """What restoring `path` raises, as the evaluator restores it."""
    with tf.Graph().as_default():
        tf.compat.v1.get_variable("v", [3])
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            with pytest.raises(Exception) as raised:
                saver.restore(session, path)
    return raised.value


@pytest.mark.parametrize("removed", ["data", "all", "reader"])
def test_a_checkpoint_rotated_away_while_restored_exits_159_naming_it_and_the_newest(
    tmp_path, removed
):
    old, newest = save_checkpoints(tmp_path, [100, 300])
    for name in tf.io.gfile.glob(f"{old}.{'data' if removed == 'data' else ''}*"):
        os.remove(name)
    if removed == "reader":
        with pytest.raises(tf.errors.NotFoundError) as raised:
            tf.train.load_checkpoint(old)
        error = raised.value
    else:
        error = restore_error(old)
    # Saver's ValueError when the index is gone, RestoreV2's NotFoundError when a data file is.
    assert isinstance(error, ValueError if removed == "all" else tf.errors.NotFoundError)
    explain = diagnose.explain_user_error if removed == "all" else diagnose.explain_training_error
    explained = explain(error, None, 0) if removed == "all" else explain(error, 0, 1.0)
    assert explained.exit_code == exit_codes.CHECKPOINT_GONE == 159
    assert exit_codes.is_retryable(explained.exit_code)
    assert str(explained) == (
        f"the checkpoint {old} was deleted while this task restored it: training keeps the "
        "newest --keep_checkpoint_max checkpoints and removed it meanwhile (this task was slow "
        f"or frozen). Restarted, the task takes the newest checkpoint instead ({newest})."
    )


def test_a_checkpoint_still_whole_is_not_gone_and_a_users_value_error_stays_exit_5(tmp_path):
    (path,) = save_checkpoints(tmp_path, [100])
    named = ValueError(f"The passed save_path is not a valid checkpoint: {path}")
    assert diagnose.explain_checkpoint_gone(named) is None  # Its files are all there.
    mistake = ValueError("Shapes (None, 10) and (None, 3) are incompatible")
    explained = diagnose.explain_user_error(mistake, str(tmp_path), 7)
    assert explained.exit_code == exit_codes.USER_CODE
    assert str(explained).startswith("training raised ValueError: Shapes (None, 10)")


def test_a_lost_peer_names_the_checkpointed_step_when_the_task_saw_an_older_one(tmp_path):
    save_checkpoints(tmp_path, [300])
    error = tf.errors.UnavailableError(None, None, "Socket closed")
    explained = diagnose.explain_training_error(error, 0, 109.5, str(tmp_path))
    assert "UnavailableError at global step 300 after 109.5 s" in str(explained)
    newer = diagnose.explain_training_error(error, 340, 109.5, str(tmp_path))
    assert "UnavailableError at global step 340 after" in str(newer)
    (tmp_path / "empty").mkdir()
    first = diagnose.explain_training_error(error, None, 5.0, str(tmp_path / "empty"))
    assert "UnavailableError before the first step after 5.0 s" in str(first)
