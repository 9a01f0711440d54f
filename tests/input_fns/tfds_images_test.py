"""`tfds_images`: variable-size TFDS images resized, scaled to [-1, 1] and sharded by file.

The data is `tfds.testing.mock_data`'s random examples of the real
`tf_flowers` features (images 5 to 49 pixels a side), written as a real
prepared dataset of 4 files (`fake_images.prepare_mock_images`).
"""

import collections
import logging
import types

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from estimator_dist.base.errors import DatasetNotFoundError, UsageError
from estimator_dist.base.params import SHARED_KEYS, from_params
from input_fns import INPUT_FNS, REGISTERED, digits, ids, prepare_input, tfds_images
from input_fns.tfds_images import TfdsImagesParams, resize_image, scale
from tests.input_fns.fake_images import prepare_mock_images

TRAIN = tf.estimator.ModeKeys.TRAIN
EVAL = tf.estimator.ModeKeys.EVAL
NUM_EXAMPLES = 40
FLOWERS = {"dataset": "tf_flowers", "image_size": 32, "batch_size": 8}

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def flowers_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("mock_tfds"))
    prepare_mock_images("tf_flowers", path, NUM_EXAMPLES, num_shards=4)
    return path


def context(pipelines, pipeline_id):
    return tf.distribute.InputContext(pipelines, pipeline_id, pipelines)


def examples(dataset):
    """Every (image bytes, label) of a finite dataset, as a multiset."""
    counts = collections.Counter()
    for features, labels in dataset:
        for image, label in zip(features["image"].numpy(), labels.numpy()):
            counts[(image.tobytes(), int(label))] += 1
    return counts


# --- parameters -----------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("image_size", 31, "image_size must be at least 32, received 31"),
        ("resize", "squash", "resize 'squash' is unknown; valid: stretch, pad, crop"),
    ],
)
def test_fail_with_invalid_params(field, value, message):
    with pytest.raises(ValueError, match=message):
        TfdsImagesParams(**{field: value})
    with pytest.raises(UsageError, match=message):
        from_params(TfdsImagesParams, {field: value}, "input_fn tfds_images", strict=False)


def test_is_registered_with_its_params_shared_with_every_model():
    assert INPUT_FNS.get("tfds_images") is tfds_images.input_fn
    entry = REGISTERED["tfds_images"]
    assert entry.parameters is TfdsImagesParams
    assert entry.prepare is tfds_images.prepare
    assert {"image_size", "resize", "dataset", "split", "eval_split"} <= SHARED_KEYS


# --- resizing and scaling ---------------------------------------------------------


def test_stretch_fills_the_square_without_padding():
    out = resize_image(tf.fill([8, 40, 3], tf.constant(255, tf.uint8)), 32, "stretch")
    assert out.shape == (32, 32, 3) and out.dtype == tf.float32
    assert float(tf.reduce_min(out)) == 255.0


def test_pad_keeps_the_aspect_ratio_with_black_bars():
    out = resize_image(tf.fill([8, 32, 3], tf.constant(255, tf.uint8)), 32, "pad").numpy()
    assert out.shape == (32, 32, 3)
    # An 8x32 image padded to 32x32: 12 black rows above and below the image.
    assert (out[:12] == 0).all() and (out[-12:] == 0).all()
    assert (out[13:19] == 255).all()


def test_crop_keeps_the_central_square():
    image = np.zeros([8, 32, 3], np.uint8)
    image[:, 12:20] = 255
    cropped = resize_image(tf.constant(image), 32, "crop").numpy()
    assert cropped.shape == (32, 32, 3)
    assert (cropped == 255).all()
    # The control: stretched, the black ends stay in the picture.
    assert (resize_image(tf.constant(image), 32, "stretch").numpy() == 0).any()


def test_scale_maps_pixels_to_minus_one_one():
    np.testing.assert_allclose(scale(tf.constant([0.0, 127.5, 255.0])).numpy(), [-1, 0, 1])


# --- batches of variable-size images ------------------------------------------------


def test_mock_images_really_differ_in_size(flowers_dir):
    builder = tfds.builder("tf_flowers", data_dir=flowers_dir)
    shapes = {tuple(ex["image"].shape) for ex in builder.as_dataset(split="train").take(10)}
    assert len(shapes) > 5, shapes


@pytest.mark.parametrize("pipeline_id", [0, 1])
@pytest.mark.parametrize("resize", ["stretch", "pad", "crop"])
def test_train_batches_are_resized_scaled_and_per_replica(flowers_dir, pipeline_id, resize):
    params = {**FLOWERS, "data_dir": flowers_dir, "resize": resize}
    dataset = tfds_images.input_fn(TRAIN, context(2, pipeline_id), params)
    features_spec, labels_spec = dataset.element_spec
    assert set(features_spec) == {"image"}
    assert features_spec["image"].shape.as_list() == [4, 32, 32, 3]
    assert labels_spec.shape.as_list() == [4]
    for features, labels in dataset.take(3):
        image = features["image"]
        assert image.dtype == tf.float32 and labels.dtype == tf.int32
        assert -1.0 <= float(tf.reduce_min(image)) < 0.0 < float(tf.reduce_max(image)) <= 1.0
        assert set(labels.numpy().tolist()) <= set(range(5))


def test_by_file_sharding_is_logged(flowers_dir, caplog):
    caplog.set_level(logging.INFO)
    tfds_images.input_fn(TRAIN, context(2, 1), {**FLOWERS, "data_dir": flowers_dir})
    (message,) = [
        r.getMessage() for r in caplog.records if r.getMessage().startswith("input_fn tfds_images")
    ]
    assert message.startswith("input_fn tfds_images tf_flowers train split=train: global batch 8")
    assert message.endswith("pipeline 1 of 2; sharding by file (4 files over 2 pipelines).")


@pytest.mark.parametrize("pipelines", [2, 5])
def test_pipelines_read_disjoint_shards_covering_the_split(flowers_dir, pipelines):
    params = {
        **FLOWERS,
        "data_dir": flowers_dir,
        "eval_split": "train",
        "batch_size": 5 * pipelines,
    }
    whole = examples(tfds_images.input_fn(EVAL, None, params))
    assert sum(whole.values()) == NUM_EXAMPLES
    shards = [
        examples(tfds_images.input_fn(EVAL, context(pipelines, i), params))
        for i in range(pipelines)
    ]
    assert all(sum(shard.values()) > 0 for shard in shards)
    assert sum(shards, collections.Counter()) == whole


def test_sliced_splits_carve_a_disjoint_evaluation_split(flowers_dir):
    params = {
        **FLOWERS,
        "data_dir": flowers_dir,
        "split": "train[:90%]",
        "eval_split": "train[90%:]",
    }
    prepare_input("tfds_images", params)
    evaluation = examples(tfds_images.input_fn(EVAL, None, params))
    training = examples(tfds_images.input_fn(EVAL, None, {**params, "eval_split": "train[:90%]"}))
    assert (sum(training.values()), sum(evaluation.values())) == (36, 4)
    assert not set(training) & set(evaluation)


def test_training_pipelines_record_disjoint_ids(flowers_dir, tmp_path):
    params = {**FLOWERS, "data_dir": flowers_dir, "record_read_ids": str(tmp_path)}
    for pipeline_id in (0, 1):
        next(iter(tfds_images.input_fn(TRAIN, context(2, pipeline_id), params)))
    read = ids.read_ids(str(tmp_path))
    assert all(pipeline.complete for pipeline in read.values())
    first, second = (set(read[i].ids) for i in (0, 1))
    assert not first & second
    assert len(first | second) == NUM_EXAMPLES


def test_a_grey_dataset_keeps_its_channel(data_dir):
    params = {"dataset": digits.NAME, "data_dir": data_dir, "image_size": 32, "batch_size": 4}
    features, _ = next(iter(tfds_images.input_fn(EVAL, None, params)))
    assert features["image"].shape == (4, 32, 32, 1)


def test_works_under_tfds_mock_data(flowers_dir):
    # mock_data serves random examples of the real features through the same builder
    # API, from the metadata of flowers_dir, for whatever data_dir the input is given.
    params = {**FLOWERS, "data_dir": "/nonexistent", "eval_split": "train"}
    with tfds.testing.mock_data(
        num_examples=6, policy=tfds.testing.MockPolicy.USE_FILES, data_dir=flowers_dir
    ):
        batches = list(tfds_images.input_fn(EVAL, None, params))
    assert [features["image"].shape for features, _ in batches] == [(6, 32, 32, 3)]


# --- errors -----------------------------------------------------------------------


def test_fail_without_dataset(flowers_dir):
    with pytest.raises(UsageError, match="input_fn tfds_images needs the dataset name"):
        prepare_input("tfds_images", {"data_dir": flowers_dir})


def test_fail_with_unprepared_dataset_names_the_command(tmp_path):
    empty = str(tmp_path)
    with pytest.raises(DatasetNotFoundError) as raised:
        prepare_input("tfds_images", {"dataset": "cats_vs_dogs", "data_dir": empty})
    assert f"tfds build cats_vs_dogs --data_dir={empty}" in str(raised.value)


def test_fail_with_missing_test_split_says_how_to_carve_one(flowers_dir):
    with pytest.raises(UsageError) as raised:
        prepare_input("tfds_images", {"dataset": "tf_flowers", "data_dir": flowers_dir})
    assert str(raised.value) == (
        "eval_split='test': dataset 'tf_flowers' has no split 'test'; it has train. "
        "'tf_flowers' has a train split only: carve the evaluation split out of it, such as "
        "--params='split=train[:90%],eval_split=train[90%:]'."
    )


def test_fail_with_a_dataset_without_images():
    features = {"text": tfds.features.Text(), "label": tfds.features.ClassLabel(num_classes=2)}
    builder = types.SimpleNamespace(
        name="imdb_like",
        info=types.SimpleNamespace(supervised_keys=("text", "label"), features=features),
    )
    with pytest.raises(UsageError, match="'imdb_like' has no image feature 'text'"):
        tfds_images._image_feature(builder, "label")


def test_fail_with_skip_bad_records(flowers_dir):
    with pytest.raises(UsageError, match="skip_bad_records applies to the tfrecord and csv"):
        tfds_images.input_fn(
            TRAIN, None, {**FLOWERS, "data_dir": flowers_dir, "skip_bad_records": True}
        )
