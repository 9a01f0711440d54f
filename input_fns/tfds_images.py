"""Image classification from any prepared TFDS dataset, images of any size resized to one.

`input_fn` reads a prepared TFDS image dataset (`tf_flowers`,
`cats_vs_dogs`, `cifar10`, ...) named by `params["dataset"]`, whose images
may differ in size, and gives `({"image": float32 [b, size, size, C]},
int32 label)` with pixels scaled to [-1, 1], as MobileNetV2 expects
(`--keras_model=mobilenet_v2`).

Sharding is `tfds_input`'s: by file with `tfds.ReadConfig(input_context=...)`
when the split has at least as many files as input pipelines, by example
(`tfds.even_splits`) otherwise. Images stay encoded (JPEG or PNG bytes)
through the shuffle buffer, so it holds compressed images, and are decoded
and resized a batch at a time after batching. The `resize` policy:

* `stretch` (default): `tf.image.resize` to size x size, bilinear; the
  aspect ratio is not kept, nothing is cropped or padded (what TensorFlow's
  transfer learning tutorial does with `cats_vs_dogs`);
* `pad`: `tf.image.resize_with_pad`: the whole image, aspect ratio kept,
  black bars (-1 after scaling) on the short side;
* `crop`: the central square of the image, resized: aspect ratio kept,
  the ends of the long side cut off.

Datasets with only a `train` split (`tf_flowers`, `cats_vs_dogs`) carve
their evaluation split with TFDS slicing:
`--params='dataset=tf_flowers,split=train[:90%],eval_split=train[90%:]'`.

Example:
  >>> import tensorflow as tf
  >>> dataset = input_fn(tf.estimator.ModeKeys.TRAIN, None, {  # doctest: +SKIP
  ...     "dataset": "tf_flowers", "split": "train[:90%]", "image_size": 96,
  ...     "batch_size": 64, "data_dir": "/data/tfds"})
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Optional

import tensorflow as tf
import tensorflow_datasets as tfds

from estimator_dist.base.errors import UsageError
from estimator_dist.base.params import from_params
from input_fns import ids
from input_fns.pipeline import (
    CHUNK,
    TRAIN,
    assemble,
    batch_sizes,
    decide_sharding,
    log_input,
    to_model_inputs,
)
from input_fns.tfds_input import TFDS_ID, TfdsParams, dataset_param, get_prepared_builder

NAME = "tfds_images"
#: The feature the images are given under: the Keras models' input name.
FEATURE = "image"
RESIZE_POLICIES = ("stretch", "pad", "crop")
#: The smallest `image_size` (MobileNetV2's smallest input).
MIN_IMAGE_SIZE = 32


@dataclasses.dataclass(frozen=True)
class TfdsImagesParams(TfdsParams):
    """Settings of the `tfds_images` input_fn.

    Attributes:
      image_size: Height and width every image is resized to.
      resize: `stretch`, `pad` or `crop` (see the module's docstring).
    """

    image_size: int = 224
    resize: str = "stretch"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.image_size < MIN_IMAGE_SIZE:
            raise ValueError(
                f"image_size must be at least {MIN_IMAGE_SIZE}, received {self.image_size}."
            )
        if self.resize not in RESIZE_POLICIES:
            raise ValueError(
                f"resize {self.resize!r} is unknown; valid: {', '.join(RESIZE_POLICIES)}."
            )


def resize_image(image: tf.Tensor, size: int, policy: str) -> tf.Tensor:
    """One image `[h, w, c]` of any size, as float32 `[size, size, c]` in 0..255.

    >>> resize_image(tf.zeros([30, 60, 3], tf.uint8), 32, "crop").shape
    TensorShape([32, 32, 3])
    """
    image = tf.cast(image, tf.float32)
    if policy == "pad":
        return tf.image.resize_with_pad(image, size, size)
    if policy == "crop":
        height, width = tf.shape(image)[0], tf.shape(image)[1]
        side = tf.minimum(height, width)
        image = tf.image.crop_to_bounding_box(
            image, (height - side) // 2, (width - side) // 2, side, side
        )
    return tf.image.resize(image, [size, size])


def scale(images: tf.Tensor) -> tf.Tensor:
    """Pixels 0..255 to [-1, 1], as `tf.keras.applications.mobilenet_v2.preprocess_input`."""
    return images / 127.5 - 1.0


def _split_files(builder: tfds.core.DatasetBuilder, split: str, param: str) -> int:
    """Returns the number of files `split` reads.

    Raises:
      UsageError: if the split does not exist.
    """
    base = re.match(r"[\w-]*", split).group(0)
    splits = sorted(builder.info.splits)
    if base not in splits:
        carve = ""
        if splits == ["train"]:
            carve = (
                f" {builder.name!r} has a train split only: carve the evaluation split out of "
                "it, such as --params='split=train[:90%],eval_split=train[90%:]'."
            )
        raise UsageError(
            f"{param}={split!r}: dataset {builder.name!r} has no split {base!r}; it has "
            f"{', '.join(splits)}.{carve}"
        )
    return len(builder.info.splits[split].file_instructions)


def _image_feature(builder: tfds.core.DatasetBuilder, label_key: str) -> str:
    """The name of the dataset's image feature: its supervised input, or `image`.

    Raises:
      UsageError: if that feature is not a TFDS `Image`, or there is no `label_key`.
    """
    keys = builder.info.supervised_keys
    name = keys[0] if isinstance(keys, tuple) and isinstance(keys[0], str) else FEATURE
    features = builder.info.features
    if name not in features or not isinstance(features[name], tfds.features.Image):
        raise UsageError(
            f"input_fn {NAME} reads image classification datasets; {builder.name!r} has no "
            f"image feature {name!r} (its features: {', '.join(sorted(features))}). Use "
            "--input_fn=tfds for other datasets."
        )
    if label_key not in features:
        raise UsageError(
            f"label_key={label_key!r} is not a feature of {builder.name!r}; it has "
            f"{', '.join(sorted(features))}. Pass --params=label_key=<one of them>."
        )
    return name


def input_fn(
    mode: str,
    input_context: Optional[tf.distribute.InputContext] = None,
    params: Optional[Mapping[str, Any]] = None,
) -> tf.data.Dataset:
    """`input_fn` of a prepared TFDS image dataset, every image resized to `image_size`.

    Args:
      mode: TRAIN reads `split` (default `train`), shuffled and repeated;
        EVAL and PREDICT read `eval_split` (default `test`) once, in order.
      input_context: This worker's pipeline id and count, or None.
      params: `dataset` (required), `image_size` (224), `resize` (`stretch`),
        `split`, `eval_split`, and the `PipelineParams` (`batch_size`
        global, `data_dir`, `seed`, ...).

    Returns:
      Batches of `({"image": float32 [b, image_size, image_size, C]} in
      [-1, 1], int32 label)`, per-replica sized when `input_context` is given.

    Raises:
      UsageError: for a missing or unknown dataset or split, a dataset
        without an image feature, or invalid parameters.
      DatasetNotFoundError: if the dataset is not prepared under `data_dir`.

    Example:
      >>> input_fn("train", None, {"dataset": "cats_vs_dogs",  # doctest: +SKIP
      ...     "split": "train[:90%]", "image_size": 160, "data_dir": "/data/tfds"})
    """
    params = params or {}
    settings = from_params(TfdsImagesParams, params, f"input_fn {NAME}", strict=False)
    if params.get("skip_bad_records"):
        raise UsageError(
            "skip_bad_records applies to the tfrecord and csv input_fns; TFDS files are "
            "read as written by `tfds build`. Remove it from --params."
        )
    training = mode == TRAIN
    split = settings.split if training else settings.eval_split
    builder = get_prepared_builder(
        dataset_param(settings.dataset, NAME, "tf_flowers"), settings.data_dir
    )
    num_files = _split_files(builder, split, "split" if training else "eval_split")
    image_key = _image_feature(builder, settings.label_key)
    image_feature = builder.info.features[image_key]
    sharding = decide_sharding(num_files, input_context)
    _, per_replica = batch_sizes(settings.batch_size, input_context)
    log_input(f"{NAME} {builder.name}", mode, split, settings, input_context, sharding)
    recording = training and settings.record_read_ids is not None
    read_config = tfds.ReadConfig(
        input_context=input_context if sharding.by_file else None,
        shuffle_seed=settings.seed,
        add_tfds_id=recording,
    )
    epoch = builder.as_dataset(
        split=tfds.even_splits(split, sharding.pipelines)[sharding.pipeline_id]
        if sharding.by_example
        else split,
        shuffle_files=training,
        read_config=read_config,
        decoders={image_key: tfds.decode.SkipDecoding()},
    )
    id_key = settings.id_feature or TFDS_ID
    keep = (settings.label_key, id_key) if recording else (settings.label_key,)
    epoch = epoch.map(
        lambda example: {FEATURE: example[image_key], **{key: example[key] for key in keep}}
    )
    if recording:
        path = ids.ids_path(settings.record_read_ids, sharding.pipeline_id, sharding.pipelines)
        header = (
            f"input_fn {NAME} {builder.name}, pipeline {sharding.pipeline_id} of "
            f"{sharding.pipelines}, sharding {sharding.describe()}"
        )
        epoch = ids.record_ids(
            epoch.batch(CHUNK), lambda batch: ids.as_id_strings(batch[id_key]), path, header
        ).unbatch()
    channels = image_feature.shape[-1] or 3

    def decode_one(encoded: tf.Tensor) -> tf.Tensor:
        image = image_feature.decode_example(encoded)
        return resize_image(image, settings.image_size, settings.resize)

    def decode(batch: Mapping[str, tf.Tensor]) -> tuple:
        images = tf.map_fn(
            decode_one,
            batch[FEATURE],
            fn_output_signature=tf.TensorSpec(
                [settings.image_size, settings.image_size, channels], tf.float32
            ),
        )
        features, label = to_model_inputs(
            {**batch, FEATURE: images}, settings.label_key, drop=(id_key,)
        )
        return {FEATURE: scale(features[FEATURE])}, label

    return assemble(epoch, mode, settings, per_replica, decode)


def prepare(params: Mapping[str, Any]) -> None:
    """Checks the dataset, its image feature and its splits, before any worker starts.

    Raises:
      UsageError: for a missing or unknown dataset or split, or invalid parameters.
      DatasetNotFoundError: if the dataset is not prepared under `data_dir`, with
        the `tfds build` command that prepares it.
    """
    settings = from_params(TfdsImagesParams, params, f"input_fn {NAME}", strict=False)
    builder = get_prepared_builder(
        dataset_param(settings.dataset, NAME, "tf_flowers"), settings.data_dir
    )
    _image_feature(builder, settings.label_key)
    _split_files(builder, settings.split, "split")
    _split_files(builder, settings.eval_split, "eval_split")


__all__ = ["FEATURE", "NAME", "TfdsImagesParams", "input_fn", "prepare", "resize_image", "scale"]
