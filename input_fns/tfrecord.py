"""TFRecord files of `tf.train.Example`, given by a glob and a feature spec.

Files are sorted, so every worker sees one order, and sharded by file when
there are at least as many as input pipelines, by record position
otherwise. Each worker reads its files with a parallel interleave and checks
every record before it is used:

- a file whose frames end early or fail their CRC (truncated or corrupt) is
  found by comparing the bytes read with the file's size;
- a record without a feature of the spec, with values of another dtype, or
  with the wrong number of values is found by decoding the Example's wire
  format, which never raises (`input_fns.example_check`).

By default the first bad record stops training with its file, record
position and problem (`DataError`, exit code 3); with `skip_bad_records` it
is dropped and counted. Batches are parsed whole with `tf.io.parse_example`.

Example:
  >>> import tensorflow as tf
  >>> dataset = input_fn(tf.estimator.ModeKeys.TRAIN, None, {  # doctest: +SKIP
  ...     "batch_size": 64,
  ...     "files": "/data/mnist/train-*.tfrecord",
  ...     "features": "image:uint8:28x28x1;label:int64"})
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Tuple, Union

import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.base.params import from_params
from input_fns import bad_data, ids
from input_fns.example_check import OK, describe_problems, example_problems, first_record_problem
from input_fns.pipeline import (
    CHUNK,
    FileParams,
    FileReader,
    Sharding,
    first_files,
    keep_position,
    read_files,
)
from input_fns.specs import FeatureSpec, check_keys, find_spec, format_specs, parse_spec_param

#: Bytes a TFRecord frame adds to its record: length, CRC of the length, CRC of the data.
FRAME_BYTES = 16


@dataclasses.dataclass(frozen=True)
class TFRecordParams(FileParams):
    """Settings of the `tfrecord` input_fn (and `files`, `skip_bad_records`, ...).

    Attributes:
      features: Feature spec of the records, `"name:dtype[:shape];..."`
        (see `input_fns.specs`); `python -m input_fns.convert` prints it.
    """

    features: Optional[Union[str, dict]] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.features is None:
            raise ValueError(
                "features is required: the feature spec of the records, such as "
                "--params='features=image:uint8:28x28x1;label:int64' (python -m "
                "input_fns.convert prints the spec of the files it writes)."
            )
        check_keys(self.specs(), "features", label_key=self.label_key, id_feature=self.id_feature)

    def specs(self) -> Tuple[FeatureSpec, ...]:
        """The parsed feature spec.

        Raises:
          ValueError: if the spec is malformed.
        """
        return parse_spec_param(self.features, "features")


class _Reader(FileReader):
    """Reads, checks and decodes one worker's share of TFRecord files."""

    NAME = "tfrecord"

    def __init__(
        self,
        files: Tuple[str, ...],
        settings: TFRecordParams,
        sharding: Sharding,
        training: bool,
    ) -> None:
        super().__init__(files, settings, sharding, training)
        self.sizes = tuple(tf.io.gfile.stat(path).length for path in files)
        self.specs = settings.specs()

    def _read_file(self, index: tf.Tensor) -> tf.data.Dataset:
        """Chunks of one file's records, then an empty end chunk.

        Each element is `(records [n], file index, positions [n], is_end,
        bytes read so far, records read so far)`; work is per chunk, not per
        record, which keeps the pipeline's CPU cost low. A frame that is
        truncated or fails its CRC ends the file's records (`ignore_errors`);
        the end chunk then shows fewer bytes read than the file holds, which
        `_check_chunk` reports. The file is opened first without
        `ignore_errors`, because a reader that cannot open its file would
        retry forever: a file removed since the job started fails with
        TensorFlow's NotFoundError, which names it.
        """
        path = tf.gather(tf.constant(self.files), index)
        opened = tf.data.FixedLengthRecordDataset(path, 1).take(1)
        chunks = opened.flat_map(
            lambda _: tf.data.TFRecordDataset(path).ignore_errors().batch(CHUNK)
        )
        end = tf.data.Dataset.from_tensors((tf.zeros([0], tf.string), True))
        items = chunks.map(lambda records: (records, False)).concatenate(end)

        def step(state: tuple, item: tuple) -> tuple:
            offset, count = state
            records, is_end = item
            size = tf.size(records, out_type=tf.int64)
            lengths = tf.cast(tf.strings.length(records), tf.int64) + FRAME_BYTES
            offset, positions = offset + tf.reduce_sum(lengths), count + tf.range(size)
            count = count + size
            return (offset, count), (records, index, positions, is_end, offset, count)

        return items.scan((tf.constant(0, tf.int64), tf.constant(0, tf.int64)), step)

    def _check_chunk(
        self,
        records: tf.Tensor,
        file_index: tf.Tensor,
        positions: tf.Tensor,
        is_end: tf.Tensor,
        offset: tf.Tensor,
        count: tf.Tensor,
    ) -> tf.Tensor:
        """Returns this pipeline's good records of a chunk; fails on, or counts, bad ones."""
        if self.sharding.by_example:
            keep = keep_position(positions, file_index, self.sharding)
            records, positions = tf.boolean_mask(records, keep), tf.boolean_mask(positions, keep)
        codes, details = example_problems(records, self.specs)
        records_ok = tf.reduce_all(tf.equal(codes, OK), axis=1)
        size = tf.gather(tf.constant(self.sizes, tf.int64), file_index)
        tail_ok = tf.logical_or(tf.logical_not(is_end), tf.equal(offset, size))
        # One more row for the end of the file, after the records.
        ok = tf.concat([records_ok, [tail_ok]], axis=0)
        path = tf.gather(tf.constant(self.files), file_index)

        def describe(bad: tf.Tensor) -> tuple:
            at_tail = tf.equal(bad, tf.size(records, out_type=tf.int64))
            where = tf.gather(tf.concat([positions, [count]], axis=0), bad)
            tail = tf.strings.join(
                [
                    "the file ends early or this record is corrupt (truncated frame or CRC "
                    "mismatch): only ",
                    tf.strings.as_string(offset),
                    " of its ",
                    tf.strings.as_string(size),
                    " bytes could be read",
                ]
            )
            padding = tf.zeros([1, len(self.specs)], tf.int64)
            problems = describe_problems(
                tf.gather(tf.concat([codes, padding], axis=0), bad),
                tf.gather(tf.concat([details, padding], axis=0), bad),
                self.specs,
            )
            files = tf.fill(tf.shape(bad), path)
            messages = tf.strings.join(
                [
                    files,
                    ", record ",
                    tf.strings.as_string(where),
                    ": ",
                    tf.where(at_tail, tail, problems),
                ]
            )
            return files, messages

        noted = bad_data.check(ok, describe, self.settings.skip_bad_records)
        with tf.control_dependencies([noted]):
            return tf.boolean_mask(records, records_ok)

    def _id_values(self, records: tf.Tensor, name: str) -> tf.Tensor:
        spec = find_spec(self.specs, name)
        parsed = tf.io.parse_example(records, {name: _parse_spec(spec)})[name]
        return ids.as_id_strings(parsed)

    def _features(self, records: tf.Tensor) -> dict:
        parsed = tf.io.parse_example(records, {spec.name: _parse_spec(spec) for spec in self.specs})
        for spec in self.specs:
            if spec.dtype == "uint8":
                pixels = tf.io.decode_raw(parsed[spec.name], tf.uint8, fixed_length=spec.size)
                parsed[spec.name] = tf.reshape(pixels, [-1, *spec.shape])
        return parsed


def _parse_spec(spec: FeatureSpec) -> tf.io.FixedLenFeature:
    if spec.dtype in ("uint8", "string"):
        return tf.io.FixedLenFeature([], tf.string)
    return tf.io.FixedLenFeature(spec.shape, spec.tf_dtype)


def read_settings(params: Mapping[str, Any]) -> TFRecordParams:
    """Validated `tfrecord` settings from the Estimator params.

    Raises:
      UsageError: for a missing or invalid parameter.
    """
    return from_params(TFRecordParams, params, "input_fn tfrecord", strict=False)


def input_fn(
    mode: str,
    input_context: Optional[tf.distribute.InputContext] = None,
    params: Optional[Mapping[str, Any]] = None,
) -> tf.data.Dataset:
    """`input_fn` for TFRecord files of `tf.train.Example`.

    Args:
      mode: TRAIN reads `files`, shuffled and repeated; EVAL and PREDICT read
        `eval_files` (or `files`) once.
      input_context: This worker's pipeline id and count, or None.
      params: `files`, `features` (required), `eval_files`, `label_key`,
        `skip_bad_records`, `id_feature`, `record_read_ids`, and the
        `PipelineParams` (`batch_size` global, `seed`, `shuffle_buffer`, `cache`).

    Returns:
      Batches of `(features, label)`: every feature of the spec except the
      label and the id feature; `uint8` features as float32 in [0, 1],
      integer labels as int32.

    Raises:
      UsageError: for missing or invalid parameters, or a glob that matches
        no file.

    Example:
      >>> import tensorflow as tf
      >>> input_fn(tf.estimator.ModeKeys.EVAL, None, {  # doctest: +SKIP
      ...     "batch_size": 100, "files": "/data/mnist/train-*.tfrecord",
      ...     "eval_files": "/data/mnist/test-*.tfrecord",
      ...     "features": "image:uint8:28x28x1;label:int64"})
    """
    return read_files(mode, input_context, read_settings(params or {}), _Reader)


def prepare(params: Mapping[str, Any]) -> None:
    """Checks, before any worker starts, that the files exist and match the spec.

    Reads the first record of the first training file and of the first
    evaluation file, so a wrong glob, wrong files or a wrong spec fail at
    once with exit code 2, instead of on every worker.

    Raises:
      UsageError: for invalid parameters, an empty glob, or a first record
        that does not match `features`.
    """
    settings = read_settings(params)
    specs = settings.specs()
    for param, pattern, first in first_files(settings):
        problem = first_record_problem(first, specs)
        if problem is not None:
            raise UsageError(
                f"{param}={pattern!r} does not match the feature spec: {first}, record 0: "
                f"{problem}. Check --params=features={format_specs(specs)!r} against how "
                "the files were written."
            )
