"""Sharded `input_fn`s over TFDS datasets stored on disk.

Each worker of a multi-worker job calls `input_fn(mode, input_context,
params)` with its own `tf.distribute.InputContext`. Training data is sharded
by file with `tfds.ReadConfig(input_context=...)` when the split has at least
as many files as input pipelines (each worker opens only its files), and by
example otherwise (each worker reads everything and keeps every N-th
example). Evaluation reads the whole split on the evaluator.

Example:
  >>> import tensorflow as tf
  >>> dataset = tfds_dataset(  # doctest: +SKIP
  ...     "mnist", tf.estimator.ModeKeys.TRAIN, None,
  ...     {"batch_size": 64, "data_dir": "/data/tfds"})
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import tensorflow as tf
import tensorflow_datasets as tfds
from absl import logging

from estimator_dist.errors import DatasetNotFoundError
from estimator_dist.params import from_params

#: Raised when a dataset has not been prepared under data_dir.
DATASET_NOT_FOUND = (
    "Dataset {name!r} is not prepared in data_dir {data_dir!r} (looked for {path}). "
    "This job does not download data while it trains. Prepare it once where the "
    "network is reachable with `tfds build {name} --data_dir={data_dir}` and make "
    "that directory visible to every worker, or pass --data_dir pointing at it."
)


@dataclasses.dataclass(frozen=True)
class InputParams:
    """Input settings shared by the TFDS input functions.

    Attributes:
      batch_size: Global batch size, over all replicas of all workers.
      data_dir: TFDS data directory; None means TFDS's default
        (`~/tensorflow_datasets`).
      seed: Seed of file and example shuffling; None for unseeded.
      shuffle_buffer: Examples in the training shuffle buffer.
    """

    batch_size: int = 64
    data_dir: Optional[str] = None
    seed: Optional[int] = 0
    shuffle_buffer: int = 10_000

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, received {self.batch_size}.")
        if self.shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be at least 1, received {self.shuffle_buffer}.")


def get_prepared_builder(name: str, data_dir: Optional[str]) -> tfds.core.DatasetBuilder:
    """Returns the TFDS builder of `name`, checking that its data is on disk.

    Raises:
      DatasetNotFoundError: if the dataset is not prepared under `data_dir`.
    """
    builder = tfds.builder(name, data_dir=data_dir)
    if not builder.is_prepared():
        raise DatasetNotFoundError(
            DATASET_NOT_FOUND.format(
                name=name, data_dir=str(builder.data_dir_root), path=builder.data_path
            )
        )
    return builder


def _scale_image(features: Mapping[str, tf.Tensor]) -> tuple:
    image = tf.cast(features["image"], tf.float32) / 255.0
    return {"image": image}, tf.cast(features["label"], tf.int32)


def batch_sizes(global_batch: int, input_context: Optional[tf.distribute.InputContext]) -> tuple:
    """Returns (per-worker, per-replica) batch sizes for a global batch.

    Raises:
      ValueError: if the global batch does not divide evenly by replicas.
    """
    if input_context is None:
        return global_batch, global_batch
    per_replica = input_context.get_per_replica_batch_size(global_batch)
    return global_batch // input_context.num_input_pipelines, per_replica


def tfds_dataset(
    name: str,
    mode: str,
    input_context: Optional[tf.distribute.InputContext],
    params: Mapping[str, Any],
) -> tf.data.Dataset:
    """Reads a prepared TFDS image classification dataset as `(features, label)`.

    Args:
      name: TFDS name, such as `mnist`.
      mode: TRAIN reads the `train` split, shuffled and repeated; EVAL and
        PREDICT read `test` once, in order.
      input_context: This worker's pipeline id and count, or None.
      params: See `InputParams`.

    Returns:
      Batches of `({"image": float32 in [0, 1]}, int32 label)`, per-replica
      sized when `input_context` is given.
    """
    settings = from_params(InputParams, params, f"input_fn {name}", strict=False)
    training = mode == tf.estimator.ModeKeys.TRAIN
    split = "train" if training else "test"
    builder = get_prepared_builder(name, settings.data_dir)
    per_worker, per_replica = batch_sizes(settings.batch_size, input_context)
    pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    num_files = builder.info.splits[split].num_shards
    by_file = pipelines > 1 and num_files >= pipelines
    read_config = tfds.ReadConfig(
        input_context=input_context if by_file else None,
        shuffle_seed=settings.seed,
    )
    dataset = builder.as_dataset(split=split, shuffle_files=training, read_config=read_config)
    if pipelines > 1 and not by_file:
        dataset = dataset.shard(pipelines, pipeline_id)
    if pipelines > 1:
        sharding = (
            f"by file ({num_files} files over {pipelines} pipelines)"
            if by_file
            else f"by example ({num_files} file(s) < {pipelines} pipelines)"
        )
    else:
        sharding = "none (one input pipeline)"
    logging.info(
        "input_fn %s %s split=%s: global batch %d, per worker %d, per replica %d; "
        "pipeline %d of %d; sharding %s.",
        name,
        mode,
        split,
        settings.batch_size,
        per_worker,
        per_replica,
        pipeline_id,
        pipelines,
        sharding,
    )
    dataset = dataset.map(_scale_image, num_parallel_calls=tf.data.AUTOTUNE)
    if training:
        dataset = dataset.shuffle(settings.shuffle_buffer, seed=settings.seed).repeat()
    return dataset.batch(per_replica, drop_remainder=training).prefetch(tf.data.AUTOTUNE)


def mnist(
    mode: str,
    input_context: Optional[tf.distribute.InputContext] = None,
    params: Optional[Mapping[str, Any]] = None,
) -> tf.data.Dataset:
    """`input_fn` for TFDS `mnist`, prepared under `params["data_dir"]`.

    Example:
      >>> import tensorflow as tf
      >>> mnist(tf.estimator.ModeKeys.TRAIN, None,  # doctest: +SKIP
      ...       {"batch_size": 64, "data_dir": "/data/tfds"})
    """
    return tfds_dataset("mnist", mode, input_context, params or {})
