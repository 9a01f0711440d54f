"""Sharded `input_fn`s over TFDS datasets stored on disk, by name.

Each worker of a multi-worker job calls `input_fn(mode, input_context,
params)` with its own `tf.distribute.InputContext`. Training data is sharded
by file with `tfds.ReadConfig(input_context=...)` when the split has at least
as many files as input pipelines (each worker opens only its files), and by
example otherwise: each worker reads its own `tfds.even_splits` sub-split,
disjoint contiguous ranges of examples. Evaluation reads the whole split on
the evaluator. Nothing is downloaded while training: a dataset must have
been prepared (`tfds build <name> --data_dir=...`) where the network is
reachable.

Example:
  >>> import tensorflow as tf
  >>> dataset = tfds_dataset(  # doctest: +SKIP
  ...     "mnist", tf.estimator.ModeKeys.TRAIN, None,
  ...     {"batch_size": 64, "data_dir": "/data/tfds"})
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable, Mapping, Optional

import tensorflow as tf
import tensorflow_datasets as tfds

from estimator_dist.base.errors import DatasetNotFoundError, UsageError
from estimator_dist.base.params import from_params
from input_fns import ids
from input_fns.pipeline import (
    CHUNK,
    TRAIN,
    PipelineParams,
    assemble,
    batch_sizes,
    decide_sharding,
    log_input,
    to_model_inputs,
)

#: Raised when a dataset has not been prepared under data_dir.
DATASET_NOT_FOUND = (
    "Dataset {name!r} is not prepared in data_dir {data_dir!r} (looked for {path}). "
    "This job does not download data while it trains. Prepare it once where the "
    "network is reachable with `tfds build {name} --data_dir={data_dir}` and make "
    "that directory visible to every worker, or pass --data_dir pointing at it."
)
#: The id TFDS adds to each example with `ReadConfig(add_tfds_id=True)`.
TFDS_ID = "tfds_id"


@dataclasses.dataclass(frozen=True)
class TfdsParams(PipelineParams):
    """Settings of the TFDS input functions.

    Attributes:
      dataset: TFDS name (such as `mnist`); required by the generic `tfds`
        input_fn, fixed by the named ones.
      split: Split read for training; sub-splits such as `train[:90%]` work.
      eval_split: Split read for evaluation.
    """

    dataset: Optional[str] = None
    split: str = "train"
    eval_split: str = "test"


def get_prepared_builder(name: str, data_dir: Optional[str]) -> tfds.core.DatasetBuilder:
    """Returns the TFDS builder of `name`, checking that its data is on disk.

    Raises:
      UsageError: if TFDS has no dataset called `name`.
      DatasetNotFoundError: if the dataset is not prepared under `data_dir`.
    """
    try:
        builder = tfds.builder(name, data_dir=data_dir)
    except tfds.core.registered.DatasetNotFoundError as error:
        raise UsageError(
            f"TFDS has no dataset named {name!r}: {str(error).splitlines()[0]} "
            "See https://www.tensorflow.org/datasets/catalog for the names."
        ) from None
    if not builder.is_prepared():
        raise DatasetNotFoundError(
            DATASET_NOT_FOUND.format(
                name=name, data_dir=str(builder.data_dir_root), path=builder.data_path
            )
        )
    return builder


def _check_split(builder: tfds.core.DatasetBuilder, split: str, param: str) -> int:
    """Returns the number of files `split` reads.

    Raises:
      UsageError: if the split does not exist.
    """
    base = re.match(r"[\w-]*", split).group(0)
    if base not in builder.info.splits:
        raise UsageError(
            f"{param}={split!r}: dataset {builder.name!r} has no split {base!r}; it has "
            f"{', '.join(sorted(builder.info.splits))}."
        )
    return len(builder.info.splits[split].file_instructions)


def _supervised_input(builder: tfds.core.DatasetBuilder) -> Optional[str]:
    keys = builder.info.supervised_keys
    if isinstance(keys, tuple) and len(keys) == 2 and all(isinstance(k, str) for k in keys):
        return keys[0]
    return None


def tfds_dataset(
    name: str,
    mode: str,
    input_context: Optional[tf.distribute.InputContext],
    params: Mapping[str, Any],
) -> tf.data.Dataset:
    """Reads a prepared TFDS dataset as `(features, label)`.

    Args:
      name: TFDS name, such as `mnist`.
      mode: TRAIN reads `split` (default `train`), shuffled and repeated;
        EVAL and PREDICT read `eval_split` (default `test`) once, in order.
      input_context: This worker's pipeline id and count, or None.
      params: See `TfdsParams`.

    Returns:
      Batches of `(features, label)`, per-replica sized when `input_context`
      is given. Datasets with supervised keys (such as `("image", "label")`)
      give only their input feature; `uint8` images become float32 in
      [0, 1], integer labels int32.

    Raises:
      UsageError: for an unknown dataset or split or invalid parameters.
      DatasetNotFoundError: if the dataset is not prepared under `data_dir`.
    """
    settings = from_params(TfdsParams, params, f"input_fn {name}", strict=False)
    if params.get("skip_bad_records"):
        raise UsageError(
            "skip_bad_records applies to the tfrecord and csv input_fns; TFDS files are "
            "read as written by `tfds build`. Remove it from --params."
        )
    training = mode == TRAIN
    split = settings.split if training else settings.eval_split
    builder = get_prepared_builder(name, settings.data_dir)
    num_files = _check_split(builder, split, "split" if training else "eval_split")
    sharding = decide_sharding(num_files, input_context)
    _, per_replica = batch_sizes(settings.batch_size, input_context)
    log_input(name, mode, split, settings, input_context, sharding)
    recording = training and settings.record_read_ids is not None
    read_split = (
        tfds.even_splits(split, sharding.pipelines)[sharding.pipeline_id]
        if sharding.by_example
        else split
    )
    id_key = settings.id_feature or TFDS_ID
    supervised_input = _supervised_input(builder)

    def select(features: Mapping[str, tf.Tensor]) -> dict:
        if supervised_input is None:
            return dict(features)
        keep = {supervised_input, settings.label_key, id_key}
        return {key: value for key, value in features.items() if key in keep}

    def epoch() -> tf.data.Dataset:
        read_config = tfds.ReadConfig(
            input_context=input_context if sharding.by_file else None,
            shuffle_seed=settings.seed,
            add_tfds_id=recording,
        )
        dataset = builder.as_dataset(
            split=read_split, shuffle_files=training, read_config=read_config
        ).map(select)
        if not recording:
            return dataset
        path = ids.ids_path(settings.record_read_ids, sharding.pipeline_id, sharding.pipelines)
        header = (
            f"input_fn {name}, pipeline {sharding.pipeline_id} of {sharding.pipelines}, "
            f"sharding {sharding.describe()}"
        )
        chunks = ids.record_ids(
            dataset.batch(CHUNK), lambda batch: ids.as_id_strings(batch[id_key]), path, header
        )
        return chunks.unbatch()

    def decode(batch: Mapping[str, tf.Tensor]) -> tuple:
        return to_model_inputs(batch, settings.label_key, drop=(TFDS_ID, settings.id_feature))

    return assemble(epoch(), mode, settings, per_replica, decode)


def prepare(name: Optional[str], params: Mapping[str, Any]) -> None:
    """Checks that a TFDS dataset and its splits are prepared, before any worker starts.

    Raises:
      UsageError: for an unknown dataset or split, or a missing `dataset`.
      DatasetNotFoundError: if the dataset is not prepared under `data_dir`.
    """
    settings = from_params(TfdsParams, params, f"input_fn {name or 'tfds'}", strict=False)
    builder = get_prepared_builder(name or dataset_param(settings.dataset), settings.data_dir)
    _check_split(builder, settings.split, "split")
    _check_split(builder, settings.eval_split, "eval_split")


def dataset_param(dataset: Optional[str], input_name: str = "tfds", example: str = "mnist") -> str:
    """The `dataset` parameter of a TFDS input, which must be given.

    Raises:
      UsageError: naming the input, with an example dataset.
    """
    if not dataset:
        extra = ", or use --input_fn=mnist" if input_name == "tfds" else ""
        raise UsageError(
            f"input_fn {input_name} needs the dataset name: pass --params=dataset=<TFDS name>, "
            f"such as --params=dataset={example}{extra}."
        )
    return dataset


def input_fn(
    mode: str,
    input_context: Optional[tf.distribute.InputContext] = None,
    params: Optional[Mapping[str, Any]] = None,
) -> tf.data.Dataset:
    """`input_fn` for any prepared TFDS dataset, named by `params["dataset"]`.

    Args:
      mode: A `tf.estimator.ModeKeys` value.
      input_context: This worker's pipeline id and count, or None.
      params: `dataset` (required), `split`, `eval_split`, and the
        `PipelineParams` (`batch_size` global, `data_dir`, `seed`, ...).

    Returns:
      Batches of `(features, label)`; see `tfds_dataset`.

    Raises:
      UsageError: if `dataset` is missing or unknown.
      DatasetNotFoundError: if the dataset is not prepared under `data_dir`.

    Example:
      >>> import tensorflow as tf
      >>> input_fn(tf.estimator.ModeKeys.TRAIN, None,  # doctest: +SKIP
      ...          {"dataset": "fashion_mnist", "batch_size": 64, "data_dir": "/data/tfds"})
    """
    params = params or {}
    settings = from_params(TfdsParams, params, "input_fn tfds", strict=False)
    return tfds_dataset(dataset_param(settings.dataset), mode, input_context, params)


def _named(name: str, shape: str) -> Callable[..., tf.data.Dataset]:
    """Returns the input_fn of one TFDS image dataset, documented like the others."""

    def input_fn(
        mode: str,
        input_context: Optional[tf.distribute.InputContext] = None,
        params: Optional[Mapping[str, Any]] = None,
    ) -> tf.data.Dataset:
        return tfds_dataset(name, mode, input_context, params or {})

    input_fn.__name__ = input_fn.__qualname__ = name
    input_fn.__doc__ = f"""`input_fn` for TFDS `{name}` ({shape}) under `params["data_dir"]`.

    Args:
      mode: A `tf.estimator.ModeKeys` value.
      input_context: This worker's pipeline id and count, or None.
      params: `split`, `eval_split` and the `PipelineParams` (`batch_size`
        global, `data_dir`, `seed`, ...).

    Returns:
      Batches of `({{"image": float32 [b, {shape.replace("x", ", ")}]}}, int32 label)`.

    Raises:
      UsageError: for an unknown split or invalid parameters.
      DatasetNotFoundError: if the dataset is not prepared under `data_dir`.

    Example:
      >>> {name}("train", None, {{"batch_size": 64, "data_dir": "/data/tfds"}})  # doctest: +SKIP
    """
    return input_fn


mnist = _named("mnist", "28x28x1")
fashion_mnist = _named("fashion_mnist", "28x28x1")
cifar10 = _named("cifar10", "32x32x3")


__all__ = [
    "DATASET_NOT_FOUND",
    "TfdsParams",
    "batch_sizes",
    "cifar10",
    "fashion_mnist",
    "get_prepared_builder",
    "input_fn",
    "mnist",
    "prepare",
    "tfds_dataset",
]
