"""Synthetic images for benchmarks: no files, no decoding, never the bottleneck.

`num_examples` random uint8 images of `image_shape` with labels `i %
num_classes` are generated once from `seed` (stateless, so every worker
computes the same pool), sharded by example, cached and repeated. Training
on them measures what a model consumes when input costs nothing.

Example:
  >>> import tensorflow as tf
  >>> features, labels = next(iter(input_fn(
  ...     tf.estimator.ModeKeys.TRAIN, None, {"batch_size": 8, "image_shape": "32x32x3"})))
  >>> features["image"].shape
  TensorShape([8, 32, 32, 3])
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Tuple

import tensorflow as tf

from estimator_dist.base.params import from_params
from input_fns import ids
from input_fns.pipeline import (
    CHUNK,
    TRAIN,
    PipelineParams,
    Sharding,
    assemble,
    batch_sizes,
    log_input,
    to_model_inputs,
)
from input_fns.specs import parse_specs


@dataclasses.dataclass(frozen=True)
class SyntheticParams(PipelineParams):
    """Settings of the `synthetic` input_fn.

    Attributes:
      image_shape: Height x width x channels, such as `28x28x1` (MNIST) or
        `32x32x3` (CIFAR-10).
      num_classes: Labels are `0 .. num_classes - 1`.
      num_examples: Size of the generated pool, shared by all workers.
    """

    image_shape: str = "28x28x1"
    num_classes: int = 10
    num_examples: int = 1024

    def __post_init__(self) -> None:
        super().__post_init__()
        (spec,) = parse_specs(f"image:uint8:{self.image_shape}", "image_shape")
        if len(spec.shape) != 3:
            raise ValueError(
                f"image_shape must be height x width x channels, received {self.image_shape!r}."
            )
        if self.num_classes < 1:
            raise ValueError(f"num_classes must be at least 1, received {self.num_classes}.")
        if self.num_examples < 1:
            raise ValueError(f"num_examples must be at least 1, received {self.num_examples}.")

    def shape(self) -> Tuple[int, ...]:
        """The image shape as integers."""
        return tuple(int(dim) for dim in self.image_shape.split("x"))


def input_fn(
    mode: str,
    input_context: Optional[tf.distribute.InputContext] = None,
    params: Optional[Mapping[str, Any]] = None,
) -> tf.data.Dataset:
    """`input_fn` of random images held in memory.

    Args:
      mode: TRAIN shuffles and repeats; EVAL and PREDICT read the pool once.
      input_context: This worker's pipeline id and count, or None.
      params: `image_shape`, `num_classes`, `num_examples`, and the
        `PipelineParams` (`batch_size` global, `seed`, ...).

    Returns:
      Batches of `({"image": float32 [b, h, w, c] in [0, 1]}, int32 label)`.

    Raises:
      UsageError: for invalid parameters.

    Example:
      >>> import tensorflow as tf
      >>> input_fn(tf.estimator.ModeKeys.TRAIN, None,  # doctest: +SKIP
      ...          {"batch_size": 64, "image_shape": "28x28x1"})
    """
    settings = from_params(SyntheticParams, params or {}, "input_fn synthetic", strict=False)
    settings = dataclasses.replace(settings, cache=True)
    pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    sharding = Sharding(pipelines, pipeline_id, False, 0)
    _, per_replica = batch_sizes(settings.batch_size, input_context)
    log_input(
        "synthetic", mode, f"{settings.num_examples} examples", settings, input_context, sharding
    )
    shape = settings.shape()
    seed = settings.seed or 0

    def example(index: tf.Tensor) -> dict:
        image = tf.random.stateless_uniform(
            shape, seed=tf.stack([tf.constant(seed, tf.int64), index]), maxval=256, dtype=tf.int32
        )
        return {
            "image": tf.cast(image, tf.uint8),
            "label": index % settings.num_classes,
            "id": index,
        }

    def epoch() -> tf.data.Dataset:
        data = tf.data.Dataset.range(settings.num_examples).shard(pipelines, pipeline_id)
        data = data.map(example, num_parallel_calls=tf.data.AUTOTUNE)
        if mode != TRAIN or settings.record_read_ids is None:
            return data
        header = f"input_fn synthetic, pipeline {pipeline_id} of {pipelines}, sharding by example"
        path = ids.ids_path(settings.record_read_ids, sharding.pipeline_id, sharding.pipelines)
        chunks = ids.record_ids(
            data.batch(CHUNK), lambda batch: ids.as_id_strings(batch["id"]), path, header
        )
        return chunks.unbatch()

    def decode(batch: Mapping[str, tf.Tensor]) -> tuple:
        return to_model_inputs(batch, "label", drop=("id",))

    return assemble(epoch(), mode, settings, per_replica, decode)
