"""Sharded TFDS input functions, read from the embedded digits dataset."""

import collections
import glob
import logging
import os
from unittest import mock

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from estimator_dist.base.errors import DatasetNotFoundError, UsageError
from input_fns import INPUT_FNS, digits, prepare_input, tfds_input

TRAIN = tf.estimator.ModeKeys.TRAIN
EVAL = tf.estimator.ModeKeys.EVAL
PREDICT = tf.estimator.ModeKeys.PREDICT


def context(pipelines, pipeline_id, replicas=None):
    return tf.distribute.InputContext(
        num_input_pipelines=pipelines,
        input_pipeline_id=pipeline_id,
        num_replicas_in_sync=replicas or pipelines,
    )


def examples(dataset):
    """Every (image bytes, label) of a finite dataset, as a multiset."""
    counts = collections.Counter()
    for features, labels in dataset:
        images = features["image"].numpy()
        for image, label in zip(images, labels.numpy()):
            counts[(image.tobytes(), int(label))] += 1
    return counts


def sharding_logs(caplog):
    return [
        r.getMessage()
        for r in caplog.records
        if r.getMessage().startswith(f"input_fn {digits.NAME} ")
    ]


# --- TRAIN batches ------------------------------------------------------------


@pytest.mark.parametrize("pipeline_id", [0, 1])
def test_train_batches_are_per_replica_sized_and_scaled(data_dir, pipeline_id):
    dataset = tfds_input.tfds_dataset(
        digits.NAME,
        TRAIN,
        context(2, pipeline_id),
        {"batch_size": 64, "data_dir": data_dir, "shuffle_buffer": 100},
    )
    features, labels = next(iter(dataset))
    assert set(features) == {"image"}
    image = features["image"]
    assert image.shape == (32, 8, 8, 1)
    assert image.dtype == tf.float32
    assert float(tf.reduce_min(image)) >= 0.0
    assert float(tf.reduce_max(image)) <= 1.0
    # Scaled from uint8, not left at 0..255 nor flattened to zeros.
    assert float(tf.reduce_max(image)) > 0.5
    assert labels.shape == (32,)
    assert labels.dtype == tf.int32
    assert set(labels.numpy().tolist()) <= set(range(10))


def test_train_repeats_past_one_epoch(data_dir):
    # 1,500 training examples in batches of 64 make 23 full batches: 30 full
    # batches mean the data repeats, without a short batch at the epoch end.
    dataset = tfds_input.tfds_dataset(
        digits.NAME, TRAIN, None, {"batch_size": 64, "data_dir": data_dir, "shuffle_buffer": 1}
    )
    sizes = [int(labels.shape[0]) for _, labels in dataset.take(30)]
    assert sizes == [64] * 30


def test_train_batch_shape_is_static(data_dir):
    dataset = tfds_input.tfds_dataset(
        digits.NAME, TRAIN, context(2, 0), {"batch_size": 8, "data_dir": data_dir}
    )
    features_spec, labels_spec = dataset.element_spec
    assert features_spec["image"].shape.as_list() == [4, 8, 8, 1]
    assert labels_spec.shape.as_list() == [4]


def test_train_with_more_pipelines_than_files_still_yields_batches(data_dir):
    for pipeline_id in range(5):
        dataset = tfds_input.tfds_dataset(
            digits.NAME,
            TRAIN,
            context(5, pipeline_id),
            {"batch_size": 10, "data_dir": data_dir, "shuffle_buffer": 10},
        )
        features, labels = next(iter(dataset))
        assert features["image"].shape == (2, 8, 8, 1)
        assert labels.shape == (2,)


# --- sharding decision and disjointness ---------------------------------------


@pytest.mark.parametrize(
    "pipelines, expected",
    [
        (2, "sharding by file (4 files over 2 pipelines)"),
        (4, "sharding by file (4 files over 4 pipelines)"),
        (5, "sharding by example (4 file(s) < 5 pipelines)"),
    ],
)
def test_sharding_decision_is_logged(data_dir, caplog, pipelines, expected):
    caplog.set_level(logging.INFO)
    tfds_input.tfds_dataset(
        digits.NAME,
        TRAIN,
        context(pipelines, pipelines - 1),
        {"batch_size": 10 * pipelines, "data_dir": data_dir},
    )
    (message,) = sharding_logs(caplog)
    assert message.endswith(expected + ".")
    assert f"pipeline {pipelines - 1} of {pipelines}" in message
    assert f"global batch {10 * pipelines}, per worker 10, per replica 10" in message


def test_single_pipeline_is_not_sharded(data_dir, caplog):
    caplog.set_level(logging.INFO)
    tfds_input.tfds_dataset(digits.NAME, EVAL, None, {"batch_size": 16, "data_dir": data_dir})
    (message,) = sharding_logs(caplog)
    assert "split=test" in message
    assert message.endswith("sharding none (one input pipeline).")


@pytest.mark.parametrize("pipelines", [2, 5])
def test_pipelines_read_disjoint_shards_covering_the_split(data_dir, pipelines):
    params = {"batch_size": 10 * pipelines, "data_dir": data_dir}
    whole = examples(tfds_input.tfds_dataset(digits.NAME, EVAL, None, params))
    assert sum(whole.values()) == digits.NUM_TEST
    shards = [
        examples(tfds_input.tfds_dataset(digits.NAME, EVAL, context(pipelines, i), params))
        for i in range(pipelines)
    ]
    assert all(sum(shard.values()) > 0 for shard in shards)
    assert sum(shards, collections.Counter()) == whole


# --- EVAL / PREDICT -----------------------------------------------------------


@pytest.mark.parametrize("mode", [EVAL, PREDICT])
def test_eval_reads_the_test_split_once_in_order(data_dir, mode):
    params = {"batch_size": 64, "data_dir": data_dir}
    dataset = tfds_input.tfds_dataset(digits.NAME, mode, None, params)
    sizes = [int(labels.shape[0]) for _, labels in dataset]
    assert sum(sizes) == digits.NUM_TEST
    # No remainder is dropped: the last batch is the short one.
    assert sizes == [64] * (digits.NUM_TEST // 64) + [digits.NUM_TEST % 64]
    again = tfds_input.tfds_dataset(digits.NAME, mode, None, params)
    first = np.concatenate([labels.numpy() for _, labels in dataset])
    second = np.concatenate([labels.numpy() for _, labels in again])
    np.testing.assert_array_equal(first, second)


def test_digits_input_fn_from_registry_reads_eval_split(data_dir):
    input_fn = INPUT_FNS.get("digits")
    assert input_fn is digits.input_fn
    dataset = input_fn(EVAL, None, {"batch_size": 300, "data_dir": data_dir})
    (batch,) = list(dataset)
    features, labels = batch
    assert features["image"].shape == (digits.NUM_TEST, 8, 8, 1)
    assert labels.shape == (digits.NUM_TEST,)
    # All ten digits occur in 297 random examples.
    assert set(labels.numpy().tolist()) == set(range(10))


def test_named_tfds_inputs_are_registered():
    assert INPUT_FNS.get("mnist") is tfds_input.mnist
    assert INPUT_FNS.get("fashion_mnist") is tfds_input.fashion_mnist
    assert INPUT_FNS.get("cifar10") is tfds_input.cifar10
    assert INPUT_FNS.get("tfds") is tfds_input.input_fn
    assert INPUT_FNS.names() == [
        "cifar10",
        "cifar10_binary",
        "csv",
        "digits",
        "fashion_mnist",
        "mnist",
        "synthetic",
        "tabular",
        "tfds",
        "tfds_images",
        "tfrecord",
    ]


def test_fail_with_invalid_input_params(data_dir):
    with pytest.raises(UsageError, match="batch_size must be at least 1"):
        tfds_input.tfds_dataset(digits.NAME, EVAL, None, {"batch_size": 0, "data_dir": data_dir})


def test_input_params_ignore_model_keys(data_dir):
    dataset = tfds_input.tfds_dataset(
        digits.NAME,
        EVAL,
        None,
        {"batch_size": 300, "data_dir": data_dir, "learning_rate": 0.1, "optimizer": "sgd"},
    )
    assert dataset.element_spec[1].shape.as_list() == [None]


# --- missing datasets ---------------------------------------------------------


def test_fail_with_missing_dataset(tmp_path):
    empty = str(tmp_path / "empty_tfds")
    with pytest.raises(DatasetNotFoundError) as raised:
        tfds_input.tfds_dataset("mnist", TRAIN, None, {"data_dir": empty})
    message = str(raised.value)
    assert f"data_dir {empty!r}" in message
    assert f"tfds build mnist --data_dir={empty}" in message
    assert isinstance(raised.value, UsageError)


def test_fail_with_missing_dataset_via_mnist_input_fn(tmp_path):
    empty = str(tmp_path)
    with pytest.raises(DatasetNotFoundError, match="tfds build mnist"):
        tfds_input.mnist(EVAL, None, {"data_dir": empty})


def test_prepare_input_fails_for_missing_mnist(tmp_path):
    empty = str(tmp_path)
    with pytest.raises(DatasetNotFoundError) as raised:
        prepare_input("mnist", {"data_dir": empty})
    message = str(raised.value)
    assert empty in message
    assert "tfds build mnist" in message


def test_prepare_input_is_a_noop_for_user_inputs(tmp_path):
    assert prepare_input("my_package.inputs:train_fn", {"data_dir": str(tmp_path)}) is None
    assert prepare_input("unregistered", {"data_dir": str(tmp_path)}) is None
    assert os.listdir(tmp_path) == []


def test_prepare_input_digits_reuses_prepared_data(data_dir, monkeypatch):
    def fail(self, **kwargs):
        raise AssertionError("the prepared dataset was written again")

    monkeypatch.setattr(digits.SklearnDigits, "download_and_prepare", fail)
    assert prepare_input("digits", {"data_dir": data_dir}) is None


def test_prepare_input_digits_prepares_a_fresh_dir_with_four_shards(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(
        digits.SklearnDigits, "download_and_prepare", lambda self, **kw: calls.append(kw)
    )
    prepare_input("digits", {"data_dir": str(tmp_path)})
    (call,) = calls
    assert call["download_config"].num_shards == digits.NUM_SHARDS
    assert call["download_config"].try_download_gcs is False
    assert os.path.exists(tmp_path / f".{digits.NAME}.lock")


# --- batch_sizes --------------------------------------------------------------


def test_batch_sizes_without_context():
    assert tfds_input.batch_sizes(64, None) == (64, 64)


@pytest.mark.parametrize(
    "pipelines, replicas, expected", [(2, 2, (32, 32)), (2, 4, (32, 16)), (1, 4, (64, 16))]
)
def test_batch_sizes_with_context(pipelines, replicas, expected):
    assert tfds_input.batch_sizes(64, context(pipelines, 0, replicas)) == expected


def test_fail_with_indivisible_global_batch():
    with pytest.raises(ValueError, match="63"):
        tfds_input.batch_sizes(63, context(2, 0))


# --- digits.prepare -----------------------------------------------------------


def test_prepare_is_idempotent(data_dir):
    first = digits.prepare({"data_dir": data_dir})
    info = os.path.join(first, "dataset_info.json")
    before = os.stat(info).st_mtime_ns
    files_before = sorted(os.listdir(first))
    second = digits.prepare({"data_dir": data_dir})
    assert second == first
    assert os.stat(info).st_mtime_ns == before
    assert sorted(os.listdir(second)) == files_before
    assert first == os.path.join(data_dir, digits.NAME, "1.0.0")


def test_prepared_dataset_has_four_shards_per_split(data_dir):
    path = digits.prepare({"data_dir": data_dir})
    for split in ("train", "test"):
        files = glob.glob(os.path.join(path, f"*-{split}.tfrecord*"))
        assert len(files) == digits.NUM_SHARDS == 4
    assert len(glob.glob(os.path.join(path, "*tfrecord*"))) == 2 * digits.NUM_SHARDS
    builder = digits.SklearnDigits(data_dir=data_dir)
    assert builder.info.splits["train"].num_examples == 1797 - digits.NUM_TEST
    assert builder.info.splits["test"].num_examples == digits.NUM_TEST


# --- TFDS datasets by name, prepared offline with generated examples ----------


def prepare_fake(name, data_dir, sizes, num_shards):
    """Writes a real prepared TFDS dataset `name` with random examples.

    The builder's own features, splits, file layout and dataset_info.json are
    used; only the download is replaced, since these machines cannot reach it.
    """
    builder = tfds.builder(name, data_dir=data_dir)
    features = builder.info.features

    def examples(split, count):
        rng = np.random.RandomState(count)
        for index in range(count):
            example = {}
            for key, feature in features.items():
                if isinstance(feature, tfds.features.Image):
                    example[key] = rng.randint(0, 256, feature.shape, dtype=np.uint8)
                elif isinstance(feature, tfds.features.ClassLabel):
                    example[key] = index % feature.num_classes
                else:
                    example[key] = f"{split}_{index}"
            yield index, example

    def split_generators(self, dl_manager):
        return {split: examples(split, count) for split, count in sizes.items()}

    with mock.patch.object(type(builder), "_split_generators", split_generators):
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(
                num_shards=num_shards, try_download_gcs=False
            )
        )


@pytest.fixture(scope="module")
def fake_tfds(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("fake_tfds"))
    for name in ("mnist", "fashion_mnist", "cifar10"):
        prepare_fake(name, path, {"train": 30, "test": 10}, num_shards=3)
    return path


@pytest.mark.parametrize(
    "name, shape",
    [("mnist", (28, 28, 1)), ("fashion_mnist", (28, 28, 1)), ("cifar10", (32, 32, 3))],
)
def test_named_tfds_inputs_read_image_batches(fake_tfds, name, shape):
    params = {"batch_size": 8, "data_dir": fake_tfds}
    prepare_input(name, params)
    features, labels = next(iter(INPUT_FNS.get(name)(TRAIN, context(2, 1), params)))
    # Only the supervised input: cifar10's string `id` is left out.
    assert set(features) == {"image"}
    assert features["image"].shape == (4, *shape)
    assert features["image"].dtype == tf.float32
    assert (
        0.0
        <= float(tf.reduce_min(features["image"]))
        <= float(tf.reduce_max(features["image"]))
        <= 1.0
    )
    assert labels.dtype == tf.int32


def test_generic_tfds_input_reads_the_named_dataset(fake_tfds):
    params = {"batch_size": 10, "data_dir": fake_tfds, "dataset": "cifar10"}
    prepare_input("tfds", params)
    (batch,) = list(tfds_input.input_fn(EVAL, None, params))
    assert batch[0]["image"].shape == (10, 32, 32, 3)


def test_sub_split_is_read(fake_tfds):
    params = {"batch_size": 64, "data_dir": fake_tfds, "eval_split": "train[:50%]"}
    (batch,) = list(tfds_input.mnist(EVAL, None, params))
    assert batch[1].shape == (15,)


@pytest.mark.parametrize(
    "name, params, fragment",
    [
        ("tfds", {}, "input_fn tfds needs the dataset name"),
        (
            "tfds",
            {"dataset": "no_such_dataset_xyz"},
            "TFDS has no dataset named 'no_such_dataset_xyz'",
        ),
        (
            "mnist",
            {"split": "training"},
            "split='training': dataset 'mnist' has no split 'training'; it has test, train",
        ),
        ("mnist", {"eval_split": "val"}, "eval_split='val'"),
    ],
)
def test_fail_with_bad_dataset_or_split(fake_tfds, name, params, fragment):
    with pytest.raises(UsageError) as raised:
        prepare_input(name, {"data_dir": fake_tfds, **params})
    assert fragment in str(raised.value)


def test_fail_with_skip_bad_records_on_tfds(fake_tfds):
    with pytest.raises(UsageError, match="skip_bad_records applies to the tfrecord and csv"):
        tfds_input.mnist(TRAIN, None, {"data_dir": fake_tfds, "skip_bad_records": True})
