"""CIFAR-10's binary release: the layout, the decode of a record, sharding by file, the errors."""

import os

import numpy as np
import pytest
import tensorflow as tf

from estimator_dist.base import exit_codes
from estimator_dist.base.errors import DataError, DatasetNotFoundError
from input_fns import INPUT_FNS, REGISTERED, cifar10_binary, prepare_input

RECORDS = 12
NAMES = cifar10_binary.TRAIN_FILES + cifar10_binary.TEST_FILES


def write_release(folder, records=RECORDS, names=NAMES):
    """Writes the six files: labels 0, 1, 2, ...; the first red value of record r is r, the
    other image bytes of file i are 100 + i."""
    os.makedirs(folder, exist_ok=True)
    for index, name in enumerate(names):
        data = np.full((records, cifar10_binary.RECORD_BYTES), 100 + index, np.uint8)
        data[:, 0] = np.arange(records) % 10
        data[:, 1] = np.arange(records)
        data.tofile(os.path.join(folder, name))
    return str(folder)


def identify(image):
    """(file index, record index) of a decoded image written by `write_release`."""
    pixels = np.round(image * 255).astype(int)
    return int(pixels[0, 1, 0]) - 100, int(pixels[0, 0, 0])


@pytest.fixture
def release(tmp_path):
    return write_release(tmp_path / "cifar-10-batches-bin")


def eager(dataset):
    return [(features["image"].numpy(), labels.numpy()) for features, labels in dataset]


def test_decode_a_known_record_channel_major_to_height_width_channels():
    image = np.arange(3 * 32 * 32, dtype=np.int64).reshape(3, 32, 32) % 251  # [c, h, w]
    record = np.concatenate([[7], image.reshape(-1)]).astype(np.uint8).tobytes()
    features, labels = cifar10_binary.decode(tf.constant([record]))
    decoded = features["image"].numpy()
    assert decoded.shape == (1, 32, 32, 3) and decoded.dtype == np.float32
    assert labels.numpy().tolist() == [7] and labels.dtype == tf.int32
    np.testing.assert_allclose(decoded[0], np.transpose(image, (1, 2, 0)) / 255.0, rtol=1e-6)
    # The red value of row 1, column 2 is byte 1 + 32 + 2 of the image.
    assert decoded[0, 1, 2, 0] == pytest.approx((32 + 2) / 255.0)
    assert decoded[0, 1, 2, 2] == pytest.approx(((2 * 1024 + 32 + 2) % 251) / 255.0)


def test_the_layout_is_found_counted_and_registered(release, tmp_path):
    assert cifar10_binary.holds_layout(release)
    assert not cifar10_binary.holds_layout(str(tmp_path))
    assert cifar10_binary.count_examples(release) == 5 * RECORDS
    assert cifar10_binary.count_examples(release, tf.estimator.ModeKeys.EVAL) == RECORDS
    assert INPUT_FNS.get("cifar10_binary") is cifar10_binary.input_fn
    assert REGISTERED["cifar10_binary"].prepare is cifar10_binary.prepare
    prepare_input("cifar10_binary", {"data_dir": release})


def test_evaluation_reads_the_test_file_once_in_order(release):
    batches = eager(cifar10_binary.input_fn("eval", None, {"batch_size": 5, "data_dir": release}))
    labels = np.concatenate([labels for _, labels in batches])
    assert labels.tolist() == [i % 10 for i in range(RECORDS)]
    images = np.concatenate([images for images, _ in batches])
    assert [identify(image) for image in images] == [(5, r) for r in range(RECORDS)]


@pytest.mark.parametrize("pipeline, files", [(0, (0, 2, 4)), (1, (1, 3))])
def test_training_is_sharded_by_file_over_two_workers(release, pipeline, files):
    context = tf.distribute.InputContext(2, pipeline, 2)
    own, sharding = cifar10_binary.shard_files("train", release, context)
    assert [os.path.basename(path) for path in own] == [f"data_batch_{i + 1}.bin" for i in files]
    assert sharding.by_file and sharding.describe() == "by file (5 files over 2 pipelines)"
    params = {"batch_size": 8, "data_dir": release, "seed": 1}
    dataset = cifar10_binary.input_fn("train", context, params)
    images = np.concatenate([images for images, _ in eager(dataset.take(20))])
    seen = {identify(image) for image in images}
    # Only its own files, all their records, repeated (160 read of 36 or 24).
    assert seen == {(f, r) for f in files for r in range(RECORDS)}


def test_more_workers_than_files_shard_by_example_disjointly(release):
    shares = []
    for index in range(6):
        context = tf.distribute.InputContext(6, index, 1)
        files, sharding = cifar10_binary.shard_files("train", release, context)
        assert len(files) == 5 and sharding.by_example
        dataset = cifar10_binary.input_fn("train", context, {"batch_size": 8, "data_dir": release})
        images = np.concatenate([images for images, _ in eager(dataset.take(4))])
        shares.append({identify(image) for image in images})
    # The 60 training records, each kept by one pipeline only.
    assert sum(len(share) for share in shares) == 5 * RECORDS
    assert set().union(*shares) == {(f, r) for f in range(5) for r in range(RECORDS)}


def test_fail_with_missing_files_naming_them(release):
    os.remove(os.path.join(release, "data_batch_3.bin"))
    os.remove(os.path.join(release, "test_batch.bin"))
    with pytest.raises(DatasetNotFoundError) as raised:
        cifar10_binary.input_fn("train", None, {"batch_size": 8, "data_dir": release})
    message = str(raised.value)
    assert "lacks data_batch_3.bin, test_batch.bin of CIFAR-10's binary release" in message
    assert "expected all of data_batch_1.bin, " in message and "cifar-10-batches-bin" in message
    assert raised.value.exit_code == exit_codes.USAGE


@pytest.mark.parametrize("size", [cifar10_binary.RECORD_BYTES * 3 - 1, 0])
def test_fail_with_a_file_that_is_not_whole_records(release, size):
    path = os.path.join(release, "data_batch_2.bin")
    with open(path, "r+b") as stream:
        stream.truncate(size)
    with pytest.raises(DataError) as raised:
        prepare_input("cifar10_binary", {"data_dir": release})
    assert f"{path} has {size:,} bytes; expected a positive multiple of 3,073" in str(raised.value)
    assert "truncated or is not CIFAR-10's binary release" in str(raised.value)
    assert raised.value.exit_code == exit_codes.BAD_DATA


def test_fail_without_data_dir():
    with pytest.raises(Exception, match="pass it as --data_dir=.../cifar-10-batches-bin"):
        cifar10_binary.check_layout(None)
