"""What every input function shares: parameters, sharding, batching, logging.

An input function builds one *epoch* of its worker's examples, unbatched and
undecoded, and hands it to `assemble`, which caches,
shuffles, repeats (training only), batches to the per-replica size, decodes
whole batches in parallel and prefetches. Training data repeats forever:
finite data makes the worker whose shard ends first leave the job, and the
others hang.

The sharding rule is the same for every file-based reader: by file when the
split has at least as many files as input pipelines (each worker opens only
its own files), by example otherwise (each worker keeps a disjoint,
position-based subset of the records), none with one pipeline.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import Any, Callable, ClassVar, Iterator, Mapping, Optional, Tuple, Type

import tensorflow as tf
from absl import logging

from estimator_dist.base.errors import UsageError
from input_fns import ids

#: `tf.estimator.ModeKeys` values, spelled out so that reading data (as
#: `estimator_dist.predict` does) never imports tensorflow_estimator.
TRAIN = "train"
EVAL = "eval"
PREDICT = "infer"
#: Records handled at once by the vectorised checks of the file readers.
CHUNK = 256


@dataclasses.dataclass(frozen=True)
class PipelineParams:
    """Settings every input function takes from `params`.

    Attributes:
      batch_size: Global batch size, over all replicas of all workers.
      data_dir: Dataset directory (TFDS data_dir); None means TFDS's default.
      seed: Seed of file and example shuffling. Any integer makes the order
        deterministic (the same on every run with the same workers); None
        lets tf.data produce elements out of order, which is faster.
      shuffle_buffer: Examples in the training shuffle buffer.
      cache: Keep this worker's examples in memory after the first epoch.
      label_key: The feature returned as the label.
      id_feature: Feature that identifies an example, for `record_read_ids`;
        None uses a content hash (TFRecord, CSV) or TFDS's `tfds_id`.
      record_read_ids: Directory where each input pipeline writes the ids of
        the examples it reads in its first training epoch, for
        `python -m input_fns.verify`; None records nothing.
    """

    batch_size: int = 64
    data_dir: Optional[str] = None
    seed: Optional[int] = 0
    shuffle_buffer: int = 10_000
    cache: bool = False
    label_key: str = "label"
    id_feature: Optional[str] = None
    record_read_ids: Optional[str] = None

    #: Smallest valid `shuffle_buffer`; an input function that can read its
    #: data in a fixed order lowers it to 0 (no shuffling).
    MIN_SHUFFLE_BUFFER: ClassVar[int] = 1

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, received {self.batch_size}.")
        if self.shuffle_buffer < self.MIN_SHUFFLE_BUFFER:
            raise ValueError(
                f"shuffle_buffer must be at least {self.MIN_SHUFFLE_BUFFER}, received "
                f"{self.shuffle_buffer}."
            )
        if not self.label_key:
            raise ValueError("label_key must name a feature, received an empty string.")
        if self.record_read_ids is not None and not self.record_read_ids:
            raise ValueError(
                "record_read_ids must be a directory, received an empty string; omit it to "
                "record nothing."
            )


@dataclasses.dataclass(frozen=True)
class Sharding:
    """How one input pipeline splits the data with the others.

    Attributes:
      pipelines: Number of input pipelines (workers) reading the data.
      pipeline_id: This pipeline's index.
      by_file: True when each pipeline reads only its own files.
      num_files: Files in the split.
    """

    pipelines: int
    pipeline_id: int
    by_file: bool
    num_files: int

    @property
    def by_example(self) -> bool:
        """True when every pipeline reads every file and keeps a subset of the records."""
        return self.pipelines > 1 and not self.by_file

    def describe(self) -> str:
        """The sharding decision, as logged."""
        if self.pipelines == 1:
            return "none (one input pipeline)"
        if self.by_file:
            return f"by file ({self.num_files} files over {self.pipelines} pipelines)"
        if not self.num_files:
            return f"by example (every {self.pipelines}th generated example)"
        return f"by example ({self.num_files} file(s) < {self.pipelines} pipelines)"


def decide_sharding(
    num_files: int, input_context: Optional[tf.distribute.InputContext]
) -> Sharding:
    """Shards by file when there are at least as many files as pipelines, else by example."""
    pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    return Sharding(pipelines, pipeline_id, pipelines > 1 and num_files >= pipelines, num_files)


def batch_sizes(global_batch: int, input_context: Optional[tf.distribute.InputContext]) -> tuple:
    """Returns (per-worker, per-replica) batch sizes for a global batch.

    Raises:
      ValueError: if the global batch does not divide evenly by replicas.
    """
    if input_context is None:
        return global_batch, global_batch
    per_replica = input_context.get_per_replica_batch_size(global_batch)
    return global_batch // input_context.num_input_pipelines, per_replica


def log_input(
    name: str,
    mode: str,
    split: str,
    settings: PipelineParams,
    input_context: Optional[tf.distribute.InputContext],
    sharding: Sharding,
) -> None:
    """Logs the batch sizes and the sharding decision of one input pipeline."""
    per_worker, per_replica = batch_sizes(settings.batch_size, input_context)
    logging.info(
        "input_fn %s %s split=%s: global batch %d, per worker %d, per replica %d; "
        "pipeline %d of %d; sharding %s.",
        name,
        mode,
        split,
        settings.batch_size,
        per_worker,
        per_replica,
        sharding.pipeline_id,
        sharding.pipelines,
        sharding.describe(),
    )


def list_files(pattern: str, param: str) -> Tuple[str, ...]:
    """Returns the files matching a glob, sorted, so every worker sees one order.

    Raises:
      UsageError: if no file matches (or the directory does not exist).
    """
    try:
        files = tuple(sorted(tf.io.gfile.glob(pattern)))
    except tf.errors.OpError as error:
        raise UsageError(
            f"{param}={pattern!r} cannot be listed: {error.message}. Pass a glob of "
            "existing, readable files."
        ) from None
    if not files:
        raise UsageError(
            f"{param}={pattern!r} matches no file. Check the path and that the directory "
            "is visible on this machine (every worker needs it), for example with "
            f"`ls {pattern}`."
        )
    return files


def keep_position(position: tf.Tensor, file_index: tf.Tensor, sharding: Sharding) -> tf.Tensor:
    """Whether a record belongs to this pipeline under example-level sharding.

    The choice depends only on where the record is, never on the order in
    which a parallel interleave happens to deliver it, so the pipelines
    stay disjoint and complete even when the order is not deterministic.
    """
    return tf.equal((position + file_index) % sharding.pipelines, sharding.pipeline_id)


def to_model_inputs(
    features: Mapping[str, tf.Tensor], label_key: str, drop: Tuple[str, ...] = ()
) -> tuple:
    """Splits decoded features into the `(features, label)` Estimator expects.

    `uint8` tensors (images) become float32 in [0, 1]; an integer label
    becomes int32; features named in `drop` (ids) are left out.

    Raises:
      UsageError: if there is no feature `label_key`.
    """
    if label_key not in features:
        raise UsageError(
            f"label_key={label_key!r} is not a feature; the data has "
            f"{', '.join(sorted(features))}. Pass --params=label_key=<one of them>."
        )
    inputs = {}
    for name, value in features.items():
        if name == label_key or name in drop:
            continue
        inputs[name] = tf.cast(value, tf.float32) / 255.0 if value.dtype == tf.uint8 else value
    label = features[label_key]
    if label.dtype.is_integer:
        label = tf.cast(label, tf.int32)
    return inputs, label


def make_options(seed: Optional[int]) -> tf.data.Options:
    """Options: elements in order when a seed is given, in any order (faster) otherwise."""
    options = tf.data.Options()
    options.deterministic = seed is not None
    return options


def assemble(
    epoch: tf.data.Dataset,
    mode: str,
    settings: PipelineParams,
    per_replica: int,
    decode_batch: Callable[[Any], tuple],
) -> tf.data.Dataset:
    """Caches, shuffles, repeats, batches, decodes and prefetches one worker's data.

    Args:
      epoch: One pass over this worker's examples, unbatched and undecoded.
      mode: A `tf.estimator.ModeKeys` value; TRAIN shuffles and repeats.
      settings: The input parameters.
      per_replica: Examples per batch.
      decode_batch: Turns a batch of raw examples into `(features, label)`.

    Returns:
      The dataset the input_fn returns.
    """
    training = mode == TRAIN
    data = epoch.cache() if settings.cache else epoch
    if training:
        data = data.shuffle(settings.shuffle_buffer, seed=settings.seed).repeat()
    data = data.batch(per_replica, drop_remainder=training)
    data = data.map(decode_batch, num_parallel_calls=tf.data.AUTOTUNE)
    return data.prefetch(tf.data.AUTOTUNE).with_options(make_options(settings.seed))


@dataclasses.dataclass(frozen=True)
class FileParams(PipelineParams):
    """Settings of the readers of files given by a glob (TFRecord, CSV).

    Attributes:
      files: Glob of the training files, such as `/data/mnist/train-*.tfrecord`.
      eval_files: Glob of the evaluation files; None evaluates on `files`.
      skip_bad_records: Skip and count bad records instead of stopping.
    """

    files: Optional[str] = None
    eval_files: Optional[str] = None
    skip_bad_records: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.files:
            raise ValueError(
                "files is required: the glob of the training files, such as "
                "--params=files=/data/mnist/train-*.tfrecord."
            )

    def pattern(self, mode: str) -> Tuple[str, str]:
        """Returns (glob, parameter name) of the files `mode` reads."""
        if mode == TRAIN or not self.eval_files:
            return self.files, "files"
        return self.eval_files, "eval_files"


class FileReader(abc.ABC):
    """Reads, checks and decodes one worker's share of files; a subclass per format.

    `epoch` is the same for every format: this pipeline's files (every file
    under example-level sharding), shuffled for training, read by a parallel
    interleave of `_read_file`, checked a chunk at a time by `_check_chunk`,
    and, when asked, their ids recorded. `decode` turns a batch into
    `(features, label)` with `_features`; the id feature is left out.

    Attributes:
      NAME: The input_fn's name, for the log and the id files.
    """

    NAME: ClassVar[str]

    def __init__(
        self, files: Tuple[str, ...], settings: FileParams, sharding: Sharding, training: bool
    ) -> None:
        self.files = files
        self.settings = settings
        self.sharding = sharding
        self.training = training

    @abc.abstractmethod
    def _read_file(self, index: tf.Tensor) -> tf.data.Dataset:
        """Chunks of file `index`, `(records [n], file index, positions [n], ...)`."""

    @abc.abstractmethod
    def _check_chunk(self, *chunk: tf.Tensor) -> tf.Tensor:
        """Returns this pipeline's good records of a chunk; fails on, or counts, bad ones."""

    @abc.abstractmethod
    def _id_values(self, records: tf.Tensor, name: str) -> tf.Tensor:
        """The string values of the feature `name` (the `id_feature`) of checked records."""

    @abc.abstractmethod
    def _features(self, records: tf.Tensor) -> dict:
        """Decodes a batch of checked records into one tensor per feature of the spec."""

    def _ids(self, records: tf.Tensor) -> tf.Tensor:
        name = self.settings.id_feature
        return ids.content_hash(records) if name is None else self._id_values(records, name)

    def epoch(self) -> tf.data.Dataset:
        """One pass over this worker's records, checked, still encoded."""
        sharding = self.sharding
        indexes = tf.data.Dataset.range(len(self.files))
        if sharding.by_file:
            indexes = indexes.shard(sharding.pipelines, sharding.pipeline_id)
        if self.training:
            indexes = indexes.shuffle(len(self.files), seed=self.settings.seed)
        own_files = (
            -(-len(self.files) // sharding.pipelines) if sharding.by_file else len(self.files)
        )
        items = indexes.interleave(
            self._read_file, cycle_length=min(own_files, 8), num_parallel_calls=tf.data.AUTOTUNE
        )
        chunks = items.map(self._check_chunk, num_parallel_calls=tf.data.AUTOTUNE)
        if self.training and self.settings.record_read_ids is not None:
            header = (
                f"input_fn {self.NAME}, pipeline {sharding.pipeline_id} of {sharding.pipelines}, "
                f"sharding {sharding.describe()}"
            )
            path = ids.ids_path(
                self.settings.record_read_ids, sharding.pipeline_id, sharding.pipelines
            )
            chunks = ids.record_ids(chunks, self._ids, path, header)
        return chunks.unbatch()

    def decode(self, records: tf.Tensor) -> tuple:
        """Parses a batch of checked records into `(features, label)`."""
        drop = (self.settings.id_feature,) if self.settings.id_feature else ()
        return to_model_inputs(self._features(records), self.settings.label_key, drop)


def read_files(
    mode: str,
    input_context: Optional[tf.distribute.InputContext],
    settings: FileParams,
    reader: Type[FileReader],
) -> tf.data.Dataset:
    """The input_fn of a file reader: lists, shards, logs, reads and assembles.

    Args:
      mode: TRAIN reads `files`; EVAL and PREDICT read `eval_files` (or
        `files`, with a warning).
      input_context: This worker's pipeline id and count, or None.
      settings: The reader's validated settings.
      reader: The `FileReader` of the format.

    Returns:
      The dataset the input_fn returns.

    Raises:
      UsageError: if the glob matches no file.
    """
    pattern, param = settings.pattern(mode)
    if mode != TRAIN and param == "files":
        logging.warning(
            "input_fn %s: no eval_files given; evaluating on files=%s.", reader.NAME, pattern
        )
    files = list_files(pattern, param)
    sharding = decide_sharding(len(files), input_context)
    _, per_replica = batch_sizes(settings.batch_size, input_context)
    log_input(reader.NAME, mode, pattern, settings, input_context, sharding)
    worker = reader(files, settings, sharding, mode == TRAIN)
    return assemble(worker.epoch(), mode, settings, per_replica, worker.decode)


def first_files(settings: FileParams) -> Iterator[Tuple[str, str, str]]:
    """Yields (parameter, glob, first file) of the training and evaluation files.

    Raises:
      UsageError: if a glob matches no file.
    """
    for mode in (TRAIN, EVAL):
        pattern, param = settings.pattern(mode)
        yield param, pattern, list_files(pattern, param)[0]
