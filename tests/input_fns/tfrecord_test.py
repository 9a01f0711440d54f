"""The `tfrecord` input_fn: reading, sharding, order, cache, and every kind of bad record."""

import logging
import os

import numpy as np
import pytest
import tensorflow as tf

from estimator_dist.base.errors import DataError, UsageError
from input_fns import INPUT_FNS, bad_data, prepare_input, tfrecord
from tests.input_fns import data
from tests.input_fns.data import context, feature, read_all

TRAIN = tf.estimator.ModeKeys.TRAIN
EVAL = tf.estimator.ModeKeys.EVAL


pytestmark = pytest.mark.usefixtures("fresh_bad_data_counter")


@pytest.fixture
def pattern(tmp_path):
    return data.write_tfrecords(str(tmp_path / "data"), 3, 61)


def test_registered_as_tfrecord():
    assert INPUT_FNS.get("tfrecord") is tfrecord.input_fn


def test_batches_follow_the_spec(pattern):
    dataset = tfrecord.input_fn(TRAIN, context(2, 1), data.tfrecord_params(pattern, batch_size=16))
    features, labels = next(iter(dataset))
    assert set(features) == {"image", "id"}
    assert features["image"].shape == (8, 4, 4, 1)
    assert features["image"].dtype == tf.float32
    assert labels.dtype == tf.int32
    ids = features["id"].numpy()
    # Each image's pixels are id % 256, scaled to [0, 1]; labels are id % 10.
    np.testing.assert_allclose(features["image"].numpy()[:, 0, 0, 0], (ids % 256) / 255.0)
    np.testing.assert_array_equal(labels.numpy(), ids % 10)
    features_spec, labels_spec = dataset.element_spec
    assert features_spec["image"].shape.as_list() == [8, 4, 4, 1]
    assert labels_spec.shape.as_list() == [8]


def test_id_feature_is_left_out_of_the_features(pattern):
    params = data.tfrecord_params(pattern, id_feature="id")
    features, _ = next(iter(tfrecord.input_fn(EVAL, None, params)))
    assert set(features) == {"image"}


def test_eval_reads_every_record_once(pattern):
    ids = read_all(tfrecord.input_fn(EVAL, None, data.tfrecord_params(pattern)))
    assert sorted(ids) == list(range(61))


def test_eval_reads_eval_files_when_given(tmp_path, pattern):
    evaluation = data.write_tfrecords(str(tmp_path / "test"), 1, 5, prefix="test")
    params = data.tfrecord_params(pattern, eval_files=evaluation)
    assert sorted(read_all(tfrecord.input_fn(EVAL, None, params))) == list(range(5))


def test_train_repeats_with_full_batches(pattern):
    dataset = tfrecord.input_fn(TRAIN, None, data.tfrecord_params(pattern))
    ids = [i for features, _ in dataset.take(30) for i in features["id"].numpy()]
    assert len(ids) == 240
    assert set(ids) == set(range(61))


def first_ids(pattern, **params):
    dataset = tfrecord.input_fn(TRAIN, None, data.tfrecord_params(pattern, **params))
    return [i for features, _ in dataset.take(8) for i in features["id"].numpy().tolist()]


@pytest.mark.slow
def test_a_seed_makes_the_order_deterministic(pattern):
    assert first_ids(pattern, seed=3) == first_ids(pattern, seed=3)
    assert first_ids(pattern, seed=3) != first_ids(pattern, seed=4)
    dataset = tfrecord.input_fn(TRAIN, None, data.tfrecord_params(pattern, seed=3))
    assert dataset.options().deterministic is True


def test_no_seed_allows_any_order(pattern):
    dataset = tfrecord.input_fn(TRAIN, None, data.tfrecord_params(pattern, seed=None))
    assert dataset.options().deterministic is False


@pytest.mark.parametrize(
    "pipelines, expected",
    [
        (1, "sharding none (one input pipeline)"),
        (3, "sharding by file (3 files over 3 pipelines)"),
        (4, "sharding by example (3 file(s) < 4 pipelines)"),
    ],
)
def test_sharding_decision_and_batch_sizes_are_logged(pattern, caplog, pipelines, expected):
    caplog.set_level(logging.INFO)
    tfrecord.input_fn(
        TRAIN, context(pipelines, 0), data.tfrecord_params(pattern, batch_size=8 * pipelines)
    )
    (message,) = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("input_fn tfrecord")
    ]
    assert f"global batch {8 * pipelines}, per worker 8, per replica 8" in message
    assert message.endswith(expected + ".")


@pytest.mark.slow
def test_cache_keeps_the_records_after_the_files_are_gone(tmp_path):
    pattern = data.write_tfrecords(str(tmp_path / "data"), 2, 20)
    # Shuffle buffer > data: the first batch reads the whole first epoch.
    params = data.tfrecord_params(pattern, batch_size=4, shuffle_buffer=100)
    cached = iter(tfrecord.input_fn(TRAIN, None, {**params, "cache": True}))
    uncached = iter(tfrecord.input_fn(TRAIN, None, params))
    next(cached), next(uncached)
    for path in tf.io.gfile.glob(pattern):
        os.remove(path)
    ids = [i for _ in range(20) for i in next(cached)[0]["id"].numpy()]
    assert set(ids) == set(range(20))
    # A file removed while training fails (it does not hang) and is named.
    with pytest.raises(tf.errors.NotFoundError, match="train-00.tfrecord|train-01.tfrecord"):
        for _ in range(20):
            next(uncached)


# --- bad records --------------------------------------------------------------


def bad(**features):
    good = data.example_features(7)
    good.update(features)
    return {name: value for name, value in good.items() if value is not None}


BAD_RECORDS = {
    "missing feature": (bad(label=None), "feature 'label' is missing"),
    "wrong dtype": (
        bad(label=feature([7.0], "float")),
        "feature 'label' holds float values; the spec label:int64 expects int64 values",
    ),
    "wrong value count": (
        bad(label=feature([7, 8], "int64")),
        "feature 'label' has 2 value(s); the spec label:int64 expects 1",
    ),
    "wrong image size": (
        bad(image=feature([b"\x07" * 15], "bytes")),
        "feature 'image' holds 15 bytes; the spec image:uint8:4x4x1 expects 16",
    ),
    "image as integers": (
        bad(image=feature([7] * 16, "int64")),
        "feature 'image' holds int64 values; the spec image:uint8:4x4x1 expects bytes values",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_fail_with_bad_record_names_file_position_and_problem(tmp_path, case):
    features, problem = BAD_RECORDS[case]
    # Id 7 goes to file 1 of 3 (round robin), as its third record (position 2).
    pattern = data.write_tfrecords(str(tmp_path), 3, 30, replace={7: features})
    with pytest.raises(tf.errors.OpError) as raised:
        read_all(tfrecord.input_fn(EVAL, None, data.tfrecord_params(pattern)))
    error = bad_data.data_error_from(raised.value)
    assert isinstance(error, DataError)
    path = os.path.join(str(tmp_path), "train-01.tfrecord")
    assert f"Bad input data: {path}, record 2: {problem}" in str(error)
    assert "--params=skip_bad_records=true" in str(error)


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_skip_bad_record_and_count_it(tmp_path, case):
    features, problem = BAD_RECORDS[case]
    pattern = data.write_tfrecords(str(tmp_path), 3, 30, replace={7: features, 20: features})
    params = data.tfrecord_params(pattern, skip_bad_records=True)
    ids = read_all(tfrecord.input_fn(EVAL, None, params))
    assert sorted(ids) == [i for i in range(30) if i not in (7, 20)]
    assert bad_data.COUNTER.per_file() == {
        os.path.join(str(tmp_path), "train-01.tfrecord"): 1,
        os.path.join(str(tmp_path), "train-02.tfrecord"): 1,
    }
    assert problem in bad_data.summary()
    assert bad_data.summary().startswith("Skipped 2 bad record(s) of input data")


def damage(path, how):
    content = bytearray(open(path, "rb").read())
    if how == "truncated":
        content = content[:-5]
    else:
        # Flip a byte of the 4th record's data: its CRC no longer matches.
        record = len(content) // 10
        content[3 * record + 20] ^= 0xFF
    open(path, "wb").write(bytes(content))
    return len(content)


@pytest.mark.parametrize("how, position", [("truncated", 9), ("corrupt", 3)])
def test_fail_with_truncated_or_corrupt_file(tmp_path, how, position):
    pattern = data.write_tfrecords(str(tmp_path), 2, 20)
    path = os.path.join(str(tmp_path), "train-01.tfrecord")
    size = damage(path, how)
    with pytest.raises(tf.errors.OpError) as raised:
        read_all(tfrecord.input_fn(EVAL, None, data.tfrecord_params(pattern)))
    message = str(bad_data.data_error_from(raised.value))
    assert f"{path}, record {position}: the file ends early or this record is corrupt" in message
    assert f"of its {size} bytes could be read" in message


@pytest.mark.parametrize("how, readable", [("truncated", 9), ("corrupt", 3)])
def test_skip_truncated_or_corrupt_file_tail(tmp_path, how, readable):
    pattern = data.write_tfrecords(str(tmp_path), 2, 20)
    damage(os.path.join(str(tmp_path), "train-01.tfrecord"), how)
    params = data.tfrecord_params(pattern, skip_bad_records=True)
    ids = read_all(tfrecord.input_fn(EVAL, None, params))
    # File 1 holds the odd ids; only its first `readable` records are read.
    assert sorted(ids) == sorted(list(range(0, 20, 2)) + list(range(1, 2 * readable, 2)))
    assert bad_data.COUNTER.total() == 1


def test_data_error_in_graph_mode(tmp_path):
    pattern = data.write_tfrecords(str(tmp_path), 1, 10, replace={4: bad(label=None)})
    with tf.Graph().as_default():
        dataset = tfrecord.input_fn(EVAL, None, data.tfrecord_params(pattern))
        batch = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
        with tf.compat.v1.Session() as session, pytest.raises(tf.errors.OpError) as raised:
            while True:
                session.run(batch)
    assert "record 4: feature 'label' is missing" in str(bad_data.data_error_from(raised.value))


# --- parameters and preflight ---------------------------------------------------


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"features": data.SPEC}, "files is required"),
        ({"files": "x"}, "features is required"),
        ({"files": "x", "features": "image:uint16:4x4"}, "dtype 'uint16'"),
        ({"files": "x", "features": "image:uint8:4x0"}, "shape '4x0'"),
        ({"files": "x", "features": "image:uint8"}, "label_key='label' is not in features"),
        ({"files": "x", "features": data.SPEC, "id_feature": "key"}, "id_feature='key'"),
        ({"files": "x", "features": data.SPEC, "skip_bad_records": "yes"}, "expected bool"),
    ],
)
def test_fail_with_invalid_params(params, fragment):
    with pytest.raises(UsageError, match=fragment):
        tfrecord.input_fn(TRAIN, None, params)


def test_fail_with_empty_glob(tmp_path):
    pattern = str(tmp_path / "nothing-*.tfrecord")
    with pytest.raises(UsageError) as raised:
        tfrecord.input_fn(TRAIN, None, data.tfrecord_params(pattern))
    assert f"files={pattern!r} matches no file" in str(raised.value)


def test_prepare_accepts_matching_files(pattern):
    assert prepare_input("tfrecord", data.tfrecord_params(pattern)) is None


@pytest.mark.parametrize(
    "params, fragment",
    [
        (
            {"features": "image:uint8:5x5x1;label:int64"},
            "holds 16 bytes; the spec image:uint8:5x5x1",
        ),
        ({"features": "image:uint8:4x4x1;label:float32"}, "holds int64 values"),
        (
            {"eval_files": "/nonexistent/a.tfrecord"},
            "eval_files=.?/nonexistent/a.tfrecord.? matches no file",
        ),
    ],
)
def test_prepare_fails_before_training_for_mismatched_or_missing_files(pattern, params, fragment):
    with pytest.raises(UsageError, match=fragment):
        prepare_input("tfrecord", data.tfrecord_params(pattern, **params))


def test_prepare_fails_for_files_that_are_not_tfrecords(tmp_path):
    path = tmp_path / "notes.tfrecord"
    path.write_text("hello, not a TFRecord file\n" * 5)
    with pytest.raises(UsageError, match="not a serialized tf.train.Example|not a TFRecord file"):
        prepare_input("tfrecord", data.tfrecord_params(str(path)))
