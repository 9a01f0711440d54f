"""CSV files given by a glob and a column spec.

The column spec uses the feature grammar of `input_fns.specs`, in file
order; a feature with a shape takes that many consecutive columns, so the
popular MNIST CSV layout (label, then 784 pixels) is
`columns=label:int64;image:uint8:28x28x1`. Files are sorted and sharded like
TFRecord files: by file when there are at least as many as input pipelines,
by line otherwise. The first line of each file is a header unless
`header=false`; blank lines are skipped.

Every line is checked inside the pipeline before it is parsed: its number
of columns, and that each numeric column holds a number of its dtype
(`int64`: an integer of at most 18 digits; `uint8`: 0 to 255; `float32`: a
decimal, `nan` or `inf`). Numbers must not be quoted; `string` columns may
be. A bad line stops training with its file, line number and problem
(`DataError`, exit code 3), or is skipped and counted with
`skip_bad_records=true`.

Example:
  >>> import tensorflow as tf
  >>> dataset = input_fn(tf.estimator.ModeKeys.TRAIN, None, {  # doctest: +SKIP
  ...     "batch_size": 64, "files": "/data/mnist_csv/train-*.csv",
  ...     "columns": "label:int64;image:uint8:28x28x1"})
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Tuple, Union

import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.base.params import from_params
from input_fns import bad_data
from input_fns.pipeline import (
    CHUNK,
    FileParams,
    FileReader,
    Sharding,
    first_files,
    keep_position,
    list_files,
    read_files,
)
from input_fns.specs import FeatureSpec, check_keys, format_specs, parse_spec_param

#: What a column of each dtype must hold (RE2, whole field).
PATTERNS = {
    "int64": r"\s*-?[0-9]{1,18}\s*",
    "uint8": r"\s*(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\s*",
    "float32": r"\s*[+-]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?|(?i:nan|inf|infinity))\s*",
}
_DECODE_DTYPES = {"int64": tf.int64, "uint8": tf.int32, "float32": tf.float32, "string": tf.string}
#: Stands for a quoted field while columns are counted and checked.
QUOTED = "<quoted>"
_QUOTED_FIELD = r'"(?:[^"]|"")*"'


@dataclasses.dataclass(frozen=True)
class CsvParams(FileParams):
    """Settings of the `csv` input_fn (and `files`, `skip_bad_records`, ...).

    Attributes:
      columns: Column spec in file order, `"name:dtype[:shape];..."`.
      header: Whether the first line of each file is a header to skip.
      delimiter: The one-character field separator.
    """

    columns: Optional[Union[str, dict]] = None
    header: bool = True
    delimiter: str = ","

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.columns is None:
            raise ValueError(
                "columns is required: the column spec in file order, such as "
                "--params='columns=label:int64;image:uint8:28x28x1' or "
                "--params='columns=x1:float32;x2:float32;label:int64'."
            )
        if len(self.delimiter) != 1 or self.delimiter in '"\n\r':
            raise ValueError(
                f"delimiter must be one character other than a quote or newline, received "
                f"{self.delimiter!r}."
            )
        check_keys(self.specs(), "columns", label_key=self.label_key, id_feature=self.id_feature)

    def specs(self) -> Tuple[FeatureSpec, ...]:
        """The parsed column spec, in file order.

        Raises:
          ValueError: if the spec is malformed.
        """
        return parse_spec_param(self.columns, "columns")


class _Columns:
    """The columns of a spec, one per scalar, and the checks of a line against them."""

    def __init__(self, specs: Tuple[FeatureSpec, ...], delimiter: str) -> None:
        self.specs = specs
        self.delimiter = delimiter
        self.names = []
        self.dtypes = []
        for spec in specs:
            for index in range(spec.size):
                self.names.append(spec.name if spec.size == 1 else f"{spec.name}[{index}]")
                self.dtypes.append(spec.dtype)
        self.spec_text = format_specs(specs)

    def fields(self, lines: tf.Tensor) -> tuple:
        """(field strings [n, columns], number of fields [n]); quoted fields become `QUOTED`."""
        unquoted = tf.strings.regex_replace(lines, _QUOTED_FIELD, QUOTED)
        split = tf.strings.split(unquoted, sep=self.delimiter)
        return split.to_tensor("", shape=[None, len(self.names)]), split.row_lengths()

    def check(self, lines: tf.Tensor) -> tuple:
        """Returns (ok [n], first bad column [n], fields, counts) without raising."""
        fields, counts = self.fields(lines)
        valid = [tf.ones_like(fields[:, 0], tf.bool)] * len(self.names)
        for dtype, pattern in PATTERNS.items():
            columns = [index for index, name in enumerate(self.dtypes) if name == dtype]
            if columns:
                matches = tf.strings.regex_full_match(tf.gather(fields, columns, axis=1), pattern)
                for position, column in enumerate(columns):
                    valid[column] = matches[:, position]
        valid = tf.stack(valid, axis=1)
        count_ok = tf.equal(counts, len(self.names))
        ok = tf.logical_and(count_ok, tf.reduce_all(valid, axis=1))
        first_bad = tf.argmax(tf.cast(tf.logical_not(valid), tf.int32), axis=1)
        return ok, first_bad, fields, counts

    def describe(
        self, lines: tf.Tensor, first_bad: tf.Tensor, fields: tf.Tensor, counts: tf.Tensor
    ) -> tf.Tensor:
        """The problem of each (bad) line."""
        wrong_count = tf.strings.join(
            [
                tf.strings.as_string(counts),
                f" column(s); the column spec expects {len(self.names)} ({self.spec_text}): '",
                tf.strings.substr(lines, 0, 120),
                "'",
            ]
        )
        wrong_value = tf.strings.join(
            [
                "column ",
                tf.strings.as_string(first_bad + 1),
                " (",
                tf.gather(tf.constant(self.names), first_bad),
                ") holds '",
                tf.strings.substr(tf.gather(fields, first_bad, batch_dims=1), 0, 60),
                "'; expected ",
                tf.gather(tf.constant(self.dtypes), first_bad),
                " (numbers must not be quoted)",
            ]
        )
        return tf.where(tf.equal(counts, len(self.names)), wrong_value, wrong_count)

    def decode(self, lines: tf.Tensor) -> dict:
        """Parses checked lines into one tensor per feature of the spec."""
        defaults = [tf.constant([], _DECODE_DTYPES[dtype]) for dtype in self.dtypes]
        values = tf.io.decode_csv(lines, defaults, field_delim=self.delimiter)
        features, start = {}, 0
        for spec in self.specs:
            columns = values[start : start + spec.size]
            start += spec.size
            value = columns[0] if not spec.shape else tf.stack(columns, axis=1)
            if spec.shape:
                value = tf.reshape(value, [-1, *spec.shape])
            features[spec.name] = tf.cast(value, spec.tf_dtype)
        return features


class _Reader(FileReader):
    """Reads, checks and decodes one worker's share of CSV files."""

    NAME = "csv"

    def __init__(
        self, files: Tuple[str, ...], settings: CsvParams, sharding: Sharding, training: bool
    ) -> None:
        super().__init__(files, settings, sharding, training)
        self.columns = _Columns(settings.specs(), settings.delimiter)

    def _read_file(self, index: tf.Tensor) -> tf.data.Dataset:
        """Chunks `(lines [n], file index, positions [n])` of one file, header left out.

        Positions count data lines from 0; work is per chunk, not per line,
        which keeps the pipeline's CPU cost low.
        """
        path = tf.gather(tf.constant(self.files), index)
        lines = tf.data.TextLineDataset(path).skip(1 if self.settings.header else 0)

        def step(count: tf.Tensor, chunk: tf.Tensor) -> tuple:
            size = tf.size(chunk, out_type=tf.int64)
            return count + size, (chunk, index, count + tf.range(size))

        return lines.batch(CHUNK).scan(tf.constant(0, tf.int64), step)

    def _check_chunk(
        self, lines: tf.Tensor, file_index: tf.Tensor, positions: tf.Tensor
    ) -> tf.Tensor:
        """Returns this pipeline's good lines of a chunk; fails on, or counts, bad ones.

        Blank lines are left out; under example-level sharding, so are the
        lines of the other pipelines.
        """
        keep = tf.strings.length(tf.strings.strip(lines)) > 0
        if self.sharding.by_example:
            keep = tf.logical_and(keep, keep_position(positions, file_index, self.sharding))
        lines, positions = tf.boolean_mask(lines, keep), tf.boolean_mask(positions, keep)
        ok, first_bad, fields, counts = self.columns.check(lines)
        header_lines = 2 if self.settings.header else 1
        path = tf.gather(tf.constant(self.files), file_index)

        def describe(bad: tf.Tensor) -> tuple:
            files = tf.fill(tf.shape(bad), path)
            line_number = tf.gather(positions, bad) + header_lines
            problems = self.columns.describe(
                tf.gather(lines, bad),
                tf.gather(first_bad, bad),
                tf.gather(fields, bad),
                tf.gather(counts, bad),
            )
            messages = tf.strings.join(
                [files, ", line ", tf.strings.as_string(line_number), ": ", problems]
            )
            return files, messages

        noted = bad_data.check(ok, describe, self.settings.skip_bad_records)
        with tf.control_dependencies([noted]):
            return tf.boolean_mask(lines, ok)

    def _id_values(self, lines: tf.Tensor, name: str) -> tf.Tensor:
        fields, _ = self.columns.fields(lines)
        return tf.strings.strip(fields[:, self.columns.names.index(name)])

    def _features(self, lines: tf.Tensor) -> dict:
        return self.columns.decode(lines)


def read_settings(params: Mapping[str, Any]) -> CsvParams:
    """Validated `csv` settings from the Estimator params.

    Raises:
      UsageError: for a missing or invalid parameter.
    """
    return from_params(CsvParams, params, "input_fn csv", strict=False)


def input_fn(
    mode: str,
    input_context: Optional[tf.distribute.InputContext] = None,
    params: Optional[Mapping[str, Any]] = None,
) -> tf.data.Dataset:
    """`input_fn` for CSV files.

    Args:
      mode: TRAIN reads `files`, shuffled and repeated; EVAL and PREDICT read
        `eval_files` (or `files`) once.
      input_context: This worker's pipeline id and count, or None.
      params: `files`, `columns` (required), `eval_files`, `header`,
        `delimiter`, `label_key`, `skip_bad_records`, `id_feature`,
        `record_read_ids`, and the `PipelineParams` (`batch_size` global,
        `seed`, `shuffle_buffer`, `cache`).

    Returns:
      Batches of `(features, label)`: every feature of the spec except the
      label and the id feature, shaped by the spec; `uint8` features as
      float32 in [0, 1], integer labels as int32.

    Raises:
      UsageError: for missing or invalid parameters, or a glob that matches
        no file.

    Example:
      >>> import tensorflow as tf
      >>> input_fn(tf.estimator.ModeKeys.EVAL, None, {  # doctest: +SKIP
      ...     "batch_size": 100, "files": "/data/iris/*.csv",
      ...     "columns": "x:float32:4;label:int64"})
    """
    return read_files(mode, input_context, read_settings(params or {}), _Reader)


def raw_batches(settings: CsvParams, batch_size: int) -> tf.data.Dataset:
    """Every line of `settings.files`, checked, as batches of raw features (uint8 kept).

    For converting CSV files; `input_fn` is what training reads.

    Raises:
      UsageError: if the glob matches no file.
    """
    files = list_files(settings.files, "files")
    reader = _Reader(files, settings, Sharding(1, 0, False, len(files)), training=False)
    return reader.epoch().batch(batch_size).map(reader.columns.decode)


def _first_line_problem(path: str, settings: CsvParams) -> Optional[str]:
    """The problem of the first data line of `path`, or None; runs in a scratch graph."""
    columns = _Columns(settings.specs(), settings.delimiter)
    with tf.Graph().as_default():
        lines = tf.data.TextLineDataset(path).skip(1 if settings.header else 0)
        lines = lines.filter(lambda line: tf.strings.length(tf.strings.strip(line)) > 0)
        line = tf.compat.v1.data.make_one_shot_iterator(lines.take(1).batch(1)).get_next()
        ok, first_bad, fields, counts = columns.check(line)
        problem = columns.describe(line, first_bad, fields, counts)[0]
        with tf.compat.v1.Session() as session:
            try:
                is_ok, text = session.run([ok[0], problem])
            except tf.errors.OutOfRangeError:
                return "the file holds no data line"
    return None if is_ok else text.decode("utf-8", "replace")


def prepare(params: Mapping[str, Any]) -> None:
    """Checks, before any worker starts, that the files exist and match the columns.

    Raises:
      UsageError: for invalid parameters, an empty glob, or a first data
        line that does not match `columns`.
    """
    settings = read_settings(params)
    for param, pattern, first in first_files(settings):
        problem = _first_line_problem(first, settings)
        if problem is not None:
            raise UsageError(
                f"{param}={pattern!r} does not match the column spec: {first}, first data "
                f"line: {problem}. Check --params=columns (and header={settings.header})."
            )
