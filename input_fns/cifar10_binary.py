"""CIFAR-10's binary release read as it is unpacked: `cifar-10-batches-bin/`.

The folder TF Model Garden's ResNet reads with `--data_dir`: five training
files `data_batch_1.bin` to `data_batch_5.bin` and `test_batch.bin`, each a
run of 3,073-byte records, one label byte (0 to 9) then the 3,072 bytes of a
32x32 image stored channel-major (the 1,024 red values, then green, then
blue). Each record is read with `tf.data.FixedLengthRecordDataset`, decoded
to a 32x32x3 image (float32 in [0, 1], as the TFDS `cifar10` input gives) and
an int32 label. Training data is sharded **by file** over the workers with
the `input_context` (the five training files over up to five pipelines; by
example with more), shuffled and repeated; evaluation reads `test_batch.bin`
once, in order. `--input_fn=cifar10` (or no `--input_fn`) with a `--data_dir`
holding this layout reads it through this input.

A folder missing some of the six files is refused before training (exit 2),
and so is a file whose size is not a whole number of records (exit 3): it is
truncated or is not CIFAR-10's binary release.

Example:
  >>> import tensorflow as tf
  >>> features, labels = next(iter(input_fn(  # doctest: +SKIP
  ...     tf.estimator.ModeKeys.TRAIN, None,
  ...     {"batch_size": 8, "data_dir": "/data/cifar-10-batches-bin"})))
  >>> features["image"].shape  # doctest: +SKIP
  TensorShape([8, 32, 32, 3])
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional, Tuple

import tensorflow as tf

from estimator_dist.base.errors import DataError, DatasetNotFoundError, UsageError
from estimator_dist.base.params import from_params
from input_fns.pipeline import (
    TRAIN,
    PipelineParams,
    assemble,
    batch_sizes,
    decide_sharding,
    keep_position,
    log_input,
)

NAME = "cifar10_binary"
HEIGHT, WIDTH, CHANNELS = 32, 32, 3
IMAGE_BYTES = HEIGHT * WIDTH * CHANNELS
#: One label byte, then the image.
RECORD_BYTES = 1 + IMAGE_BYTES
TRAIN_FILES = tuple(f"data_batch_{index}.bin" for index in range(1, 6))
TEST_FILES = ("test_batch.bin",)
#: The `params` it reads: those every input function takes.
PARAMETERS = PipelineParams
#: Where the release comes from, for the messages.
SOURCE = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"


def holds_layout(data_dir: Optional[str]) -> bool:
    """Whether `data_dir` holds any file of the binary release (then it must hold them all).

    >>> holds_layout(None)
    False
    """
    if not data_dir:
        return False
    try:
        return any(
            tf.io.gfile.exists(os.path.join(data_dir, name)) for name in TRAIN_FILES + TEST_FILES
        )
    except tf.errors.OpError:
        return False


def check_layout(data_dir: Optional[str]) -> Mapping[str, int]:
    """Checks the six files of the release; returns the records of each file.

    Raises:
      DatasetNotFoundError: if `data_dir` is not given or lacks some files (exit 2).
      DataError: if a file's size is not a whole, positive number of
        3,073-byte records (exit 3).
    """
    if not data_dir:
        raise UsageError(
            f"input_fn {NAME} reads the folder of CIFAR-10's binary release; pass it as "
            "--data_dir=.../cifar-10-batches-bin."
        )
    expected = TRAIN_FILES + TEST_FILES
    missing = [name for name in expected if not tf.io.gfile.exists(os.path.join(data_dir, name))]
    if missing:
        raise DatasetNotFoundError(
            f"--data_dir={data_dir} lacks {', '.join(missing)} of CIFAR-10's binary release; "
            f"expected all of {', '.join(expected)}. Unpack {SOURCE} again and pass its "
            "cifar-10-batches-bin folder, visible to every worker."
        )
    records = {}
    for name in expected:
        size = tf.io.gfile.stat(os.path.join(data_dir, name)).length
        if size == 0 or size % RECORD_BYTES:
            raise DataError(
                f"{os.path.join(data_dir, name)} has {size:,} bytes; expected a positive "
                f"multiple of {RECORD_BYTES:,} (1 label byte + {IMAGE_BYTES:,} image bytes per "
                f"record; the release's files have 10,000 records, {10_000 * RECORD_BYTES:,} "
                f"bytes). It is truncated or is not CIFAR-10's binary release: unpack {SOURCE} "
                "again."
            )
        records[name] = size // RECORD_BYTES
    return records


def count_examples(data_dir: Optional[str], mode: str = TRAIN) -> int:
    """The records `mode` reads: the five training files, or the test file.

    Raises:
      DatasetNotFoundError, DataError: as `check_layout`.
    """
    records = check_layout(data_dir)
    return sum(records[name] for name in (TRAIN_FILES if mode == TRAIN else TEST_FILES))


def decode(records: tf.Tensor) -> tuple:
    """Decodes a batch of raw records into `({"image": float32 [b, 32, 32, 3]}, int32 label)`.

    The image bytes are channel-major (3x32x32) and become height x width x
    channels, in [0, 1].
    """
    values = tf.reshape(tf.io.decode_raw(records, tf.uint8), [-1, RECORD_BYTES])
    labels = tf.cast(values[:, 0], tf.int32)
    channel_major = tf.reshape(values[:, 1:], [-1, CHANNELS, HEIGHT, WIDTH])
    images = tf.transpose(channel_major, [0, 2, 3, 1])
    return {"image": tf.cast(images, tf.float32) / 255.0}, labels


def shard_files(
    mode: str, data_dir: str, input_context: Optional[tf.distribute.InputContext]
) -> Tuple[Tuple[str, ...], Any]:
    """The files this pipeline reads and the sharding decision.

    Training shards by file when there are at least as many training files as
    pipelines; evaluation reads the test file whole.
    """
    names = TRAIN_FILES if mode == TRAIN else TEST_FILES
    files = tuple(os.path.join(data_dir, name) for name in names)
    sharding = decide_sharding(len(files), input_context if mode == TRAIN else None)
    if sharding.by_file:
        files = files[sharding.pipeline_id :: sharding.pipelines]
    return files, sharding


def input_fn(
    mode: str,
    input_context: Optional[tf.distribute.InputContext] = None,
    params: Optional[Mapping[str, Any]] = None,
) -> tf.data.Dataset:
    """`input_fn` of CIFAR-10's binary release in `params["data_dir"]`.

    Args:
      mode: TRAIN reads `data_batch_1.bin` to `data_batch_5.bin`, shuffled and
        repeated; EVAL and PREDICT read `test_batch.bin` once, in order.
      input_context: This worker's pipeline id and count, or None.
      params: The `PipelineParams` (`batch_size` global, `data_dir`, `seed`,
        `shuffle_buffer`, `cache`).

    Returns:
      Batches of `({"image": float32 [b, 32, 32, 3] in [0, 1]}, int32 label)`.

    Raises:
      DatasetNotFoundError: if files of the release are missing (exit 2).
      DataError: if a file is not a whole number of records (exit 3).
    """
    settings = from_params(PipelineParams, params or {}, f"input_fn {NAME}", strict=False)
    check_layout(settings.data_dir)
    files, sharding = shard_files(mode, settings.data_dir, input_context)
    _, per_replica = batch_sizes(settings.batch_size, input_context)
    names = ", ".join(map(os.path.basename, files))
    log_input(NAME, mode, names, settings, input_context, sharding)

    def read(index: tf.Tensor, path: tf.Tensor) -> tf.data.Dataset:
        data = tf.data.FixedLengthRecordDataset(path, RECORD_BYTES)
        if not sharding.by_example:
            return data
        kept = data.enumerate().filter(lambda at, _: keep_position(at, index, sharding))
        return kept.map(lambda _, record: record)

    paths = tf.data.Dataset.from_tensor_slices(list(files)).enumerate()
    training = mode == TRAIN
    if training:
        paths = paths.shuffle(len(files), seed=settings.seed)
    epoch = paths.interleave(
        read, cycle_length=len(files), num_parallel_calls=tf.data.AUTOTUNE if training else None
    )
    return assemble(epoch, mode, settings, per_replica, decode)


def prepare(params: Mapping[str, Any]) -> None:
    """Checks the release's files before any worker starts.

    Raises:
      DatasetNotFoundError, DataError: as `check_layout`.
    """
    settings = from_params(PipelineParams, params, f"input_fn {NAME}", strict=False)
    check_layout(settings.data_dir)
