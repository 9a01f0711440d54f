"""Bad data: errors recovered from TensorFlow, counts of skipped records, and real training.

The end-to-end tests train with `estimator_dist.train` (and the launcher) on
TFRecord files holding one bad record, and check the exit code, the message,
and that every checkpoint written before the failure still loads.
"""

import os

import pytest
import tensorflow as tf

from estimator_dist.base.errors import DataError
from input_fns import bad_data
from tests.input_fns import data
from tests.procs import run_module

TIMEOUT = 240


pytestmark = pytest.mark.usefixtures("fresh_bad_data_counter")


def assert_fails_with(message):
    ok = tf.constant([True, False])

    def describe(bad):
        return tf.constant(["f"]), tf.constant([message])

    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        bad_data.check(ok, describe, skip=False)
    return bad_data.data_error_from(raised.value)


@pytest.mark.parametrize(
    "message",
    [
        "/data/a.tfrecord, record 3: feature 'label' is missing",
        "/data/dir \"x\"/b.csv, line 2: column 1 (id) holds 'a\\b'; expected int64",
        "/données/é.tfrecord, record 0: tab\there and [brackets]",
    ],
)
def test_data_error_recovers_the_exact_message(message):
    error = assert_fails_with(message)
    assert isinstance(error, DataError)
    assert str(error) == f"Bad input data: {message}. {bad_data.FIX_HINT}"


def test_other_errors_are_not_data_errors():
    assert bad_data.data_error_from(tf.errors.InvalidArgumentError(None, None, "shapes")) is None
    assert bad_data.data_error_from(ValueError("plain")) is None


def test_skip_counts_each_bad_record_once_and_logs_the_first(caplog):
    ok = tf.constant([True, False, False])

    def describe(bad):
        return tf.constant(["a.csv", "b.csv"]), tf.constant(
            ["a.csv, line 2: x", "b.csv, line 3: y"]
        )

    for _ in range(3):  # three epochs meet the same two records
        assert int(bad_data.check(ok, describe, skip=True)) == 2
    assert bad_data.COUNTER.per_file() == {"a.csv": 1, "b.csv": 1}
    assert bad_data.summary() == (
        "Skipped 2 bad record(s) of input data (skip_bad_records=true): 1 in a.csv, 1 in b.csv. "
        "First: a.csv, line 2: x."
    )
    assert caplog.text.count("Skipped a bad record") == 2


def test_no_summary_without_skipped_records():
    assert bad_data.check(tf.constant([True]), None, skip=True).numpy() == 0
    assert bad_data.summary() is None


# --- real training ------------------------------------------------------------


def write_job_data(tmp_path, bad_id):
    """One training file of 600 examples whose example `bad_id` lacks its label."""
    broken = data.example_features(bad_id)
    del broken["label"]
    train = data.write_tfrecords(str(tmp_path / "data"), 1, 600, replace={bad_id: broken})
    test = data.write_tfrecords(str(tmp_path / "data"), 1, 40, prefix="test")
    return f"files={train},eval_files={test},features={data.SPEC},shuffle_buffer=1"


def train_args(model_dir, params, steps, checkpoint_steps=20):
    return [
        f"--model_dir={model_dir}",
        "--input_fn=tfrecord",
        f"--params={params}",
        f"--train_steps={steps}",
        f"--save_checkpoints_steps={checkpoint_steps}",
        "--eval_throttle_secs=600",
        "--batch_size=8",
    ]


def assert_checkpoints_load(model_dir):
    state = tf.train.get_checkpoint_state(model_dir)
    assert state is not None and state.all_model_checkpoint_paths, os.listdir(model_dir)
    for path in state.all_model_checkpoint_paths:
        step = int(path.rsplit("-", 1)[1])
        reader = tf.train.load_checkpoint(path)
        assert reader.get_tensor("global_step") == step
    return state


@pytest.mark.multiprocess
def test_skip_bad_records_trains_on_and_reports_the_count(tmp_path):
    params = write_job_data(tmp_path, bad_id=50) + ",skip_bad_records=true"
    model_dir = str(tmp_path / "model")
    run = run_module("estimator_dist.train", train_args(model_dir, params, 80, 40), TIMEOUT)
    assert "Final evaluation: global_step=80" in run.output
    path = str(tmp_path / "data" / "train-00.tfrecord")
    # 80 steps of 8 read the 600 examples more than once; the bad one is counted once.
    assert f"Skipped 1 bad record(s) of input data (skip_bad_records=true): 1 in {path}" in (
        run.output
    )
    assert_checkpoints_load(model_dir)


@pytest.mark.multiprocess
def test_bad_record_on_one_worker_stops_the_job_with_exit_3_and_checkpoints_load(tmp_path):
    # Two files: by-file sharding gives file 1 (odd ids) to worker 1. Read in order
    # (shuffle_buffer=1), its record 300 (id 601) comes at about step 70 of 4 per
    # replica; the first 256 records are checked and delivered before it.
    broken = data.example_features(601)
    broken["label"] = data.feature([1.0], "float")
    train = data.write_tfrecords(str(tmp_path / "data"), 2, 800, replace={601: broken})
    params = f"files={train},features={data.SPEC},shuffle_buffer=1"
    model_dir = str(tmp_path / "model")
    args = [
        "--num_workers=2",
        "--noevaluator",
        "--timeout_secs=200",
        "--grace_secs=5",
        "--",
        *train_args(model_dir, params, 1000),
    ]
    run = run_module("estimator_dist.launch", args, TIMEOUT, model_dir=model_dir, check=False)
    assert run.returncode == 3, run.describe()
    assert "[launcher] attempt 0 failed: worker-0 exited with code 3 (BAD_DATA)" in run.output
    assert "job failed (not retryable)" in run.output
    path = str(tmp_path / "data" / "train-01.tfrecord")
    assert (
        f"[worker-0] estimator_dist: task worker-0 failed (exit 3): Bad input data: {path}, "
        "record 300: feature 'label' holds float values; the spec label:int64 expects int64 "
        "values" in run.output
    )
    assert "--params=skip_bad_records=true" in run.output
    assert "Traceback" not in run.output
    state = assert_checkpoints_load(model_dir)
    assert int(state.model_checkpoint_path.rsplit("-", 1)[1]) >= 20
