"""Convert a TFDS dataset, CSV files or NumPy arrays into sharded TFRecord files.

  python -m input_fns.convert --source=tfds:mnist --data_dir=/data/tfds \\
      --output=/shared/mnist --num_shards=8
  python -m input_fns.convert --source=csv:/data/train-*.csv \\
      --columns='label:int64;image:uint8:28x28x1' --output=/shared/mnist_csv --num_shards=8
  python -m input_fns.convert --source=npz:/data/train.npz --output=/shared/mine --num_shards=8

Each split becomes `<output>/<split>-<i>-of-<n>.tfrecord`, example `k` in
file `k % n`, so files differ by at most one example. Choose `n` a multiple
of the number of workers, so that every worker reads the same number of
files (sharding by file); fewer files than workers fall back to sharding by
record, where every worker reads every file. Every example gets an int64
`id` (its index in the split) unless it has an `id` already, for
`--params=record_read_ids=...,id_feature=id`. The feature spec of the files
goes to `<output>/features.spec` and is printed with the `--params` that
train on them. Exit codes: 0 done, 2 usage error, 3 bad data in the source.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
from absl import flags

from estimator_dist.base.errors import DataError, UsageError
from input_fns import bad_data, csv_input, digits, tfds_input
from input_fns.specs import FeatureSpec, format_specs

PROGRAM = "input_fns.convert"
SOURCES = ("tfds", "csv", "npz")
SPEC_FILE = "features.spec"
ID = "id"


@dataclasses.dataclass(frozen=True)
class ConvertConfig:
    """What to convert, and where to.

    Attributes:
      source: `tfds:<name>`, `csv:<glob>` or `npz:<path>`.
      output: Directory for the TFRecord files.
      num_shards: Files per split.
      splits: TFDS splits to convert (default: all); for CSV and NumPy, the
        one name their examples get (default `train`).
      data_dir: TFDS data directory.
      columns: Column spec of CSV files (see `input_fns.specs`).
      header: Whether CSV files start with a header line.
      delimiter: CSV field separator.
    """

    source: str
    output: str
    num_shards: int
    splits: Tuple[str, ...] = ()
    data_dir: Optional[str] = None
    columns: Optional[str] = None
    header: bool = True
    delimiter: str = ","

    def __post_init__(self) -> None:
        kind, sep, location = self.source.partition(":")
        if not sep or kind not in SOURCES or not location:
            raise UsageError(
                f"--source={self.source!r} is not one of tfds:<name>, csv:<glob> or "
                "npz:<path>; for example --source=tfds:mnist."
            )
        if self.num_shards < 1:
            raise UsageError(f"--num_shards must be at least 1, received {self.num_shards}.")
        if not self.output:
            raise UsageError("--output is required: the directory for the TFRecord files.")
        if kind == "csv" and not self.columns:
            raise UsageError(
                "--source=csv needs --columns, the column spec in file order, such as "
                "--columns='label:int64;image:uint8:28x28x1'."
            )
        if kind != "csv" and self.columns:
            raise UsageError(f"--columns applies to --source=csv only, not {kind}.")
        if kind != "tfds" and len(self.splits) > 1:
            raise UsageError(
                f"--splits={','.join(self.splits)}: a {kind} source makes one split; pass "
                "one name, such as --splits=train, and convert other files separately."
            )

    @property
    def kind(self) -> str:
        return self.source.partition(":")[0]

    @property
    def location(self) -> str:
        return self.source.partition(":")[2]


@dataclasses.dataclass(frozen=True)
class ConvertResult:
    """What `convert` wrote.

    Attributes:
      spec: The feature spec of the records.
      files: The files of each split.
      counts: Examples written per split.
    """

    spec: Tuple[FeatureSpec, ...]
    files: Mapping[str, Tuple[str, ...]]
    counts: Mapping[str, int]


def _feature_spec(name: str, value: Any) -> FeatureSpec:
    array = np.asarray(value)
    if array.dtype == np.uint8:
        return FeatureSpec(name, "uint8", array.shape)
    if array.dtype.kind in "iub":
        return FeatureSpec(name, "int64", array.shape)
    if array.dtype.kind == "f":
        return FeatureSpec(name, "float32", array.shape)
    if array.dtype.kind in "SUO" and array.shape == ():
        return FeatureSpec(name, "string")
    raise UsageError(
        f"Feature {name!r} has dtype {array.dtype} and shape {array.shape}, which a "
        "tf.train.Example feature spec cannot hold; expected numbers, or a scalar string."
    )


def _to_feature(spec: FeatureSpec, value: Any, index: int) -> tf.train.Feature:
    array = np.asarray(value)
    if array.shape != spec.shape:
        raise UsageError(
            f"Feature {spec.name!r} of example {index} has shape {array.shape}; earlier "
            f"examples have {spec.shape}. Only fixed-shape features can be converted."
        )
    if spec.dtype == "uint8":
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[array.tobytes()]))
    if spec.dtype == "int64":
        return tf.train.Feature(int64_list=tf.train.Int64List(value=array.reshape(-1).tolist()))
    if spec.dtype == "float32":
        return tf.train.Feature(float_list=tf.train.FloatList(value=array.reshape(-1).tolist()))
    text = array.item()
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[data]))


def _tfds_examples(config: ConvertConfig) -> Dict[str, Iterator[dict]]:
    name = config.location
    if name in ("digits", digits.NAME):
        digits.prepare({"data_dir": config.data_dir})
        name = digits.NAME
    builder = tfds_input.get_prepared_builder(name, config.data_dir)
    splits = config.splits or tuple(sorted(builder.info.splits))
    for split in splits:
        if split not in builder.info.splits:
            raise UsageError(
                f"--splits: dataset {name!r} has no split {split!r}; it has "
                f"{', '.join(sorted(builder.info.splits))}."
            )
    return {
        split: iter(tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False)))
        for split in splits
    }


def _csv_examples(config: ConvertConfig) -> Iterator[dict]:
    params = {
        "files": config.location,
        "columns": config.columns,
        "header": config.header,
        "delimiter": config.delimiter,
    }
    batches = csv_input.raw_batches(csv_input.read_settings(params), 256)
    try:
        for batch in tfds.as_numpy(batches):
            size = len(next(iter(batch.values())))
            for row in range(size):
                yield {name: values[row] for name, values in batch.items()}
    except tf.errors.OpError as error:
        data_error = bad_data.data_error_from(error)
        if data_error is None:
            raise
        raise data_error from None


def _npz_examples(config: ConvertConfig) -> Iterator[dict]:
    try:
        arrays = dict(np.load(config.location, allow_pickle=False))
    except (OSError, ValueError) as error:
        raise UsageError(f"--source={config.source!r} cannot be read as .npz: {error}") from None
    lengths = {name: len(array) for name, array in arrays.items() if np.ndim(array) > 0}
    if not arrays or len(lengths) != len(arrays) or len(set(lengths.values())) != 1:
        raise UsageError(
            f"--source={config.source!r} holds arrays of lengths {lengths or 'none'}; expected "
            "one or more arrays with the same first dimension (one row per example)."
        )
    count = next(iter(lengths.values()))
    return ({name: array[row] for name, array in arrays.items()} for row in range(count))


def _write_split(
    examples: Iterator[dict], split: str, config: ConvertConfig
) -> Tuple[Tuple[FeatureSpec, ...], Tuple[str, ...], int]:
    n = config.num_shards
    paths = tuple(
        os.path.join(config.output, f"{split}-{i:05d}-of-{n:05d}.tfrecord") for i in range(n)
    )
    existing = [path for path in paths if tf.io.gfile.exists(path)]
    if existing:
        raise UsageError(
            f"{existing[0]} exists already; pass an empty --output directory (nothing is "
            "overwritten)."
        )
    temporary = [f"{path}.tmp-{os.getpid()}" for path in paths]
    writers = [tf.io.TFRecordWriter(path) for path in temporary]
    spec: Tuple[FeatureSpec, ...] = ()
    count = 0
    try:
        for index, example in enumerate(examples):
            if not spec:
                spec = tuple(_feature_spec(name, value) for name, value in example.items())
                if ID not in example:
                    spec += (FeatureSpec(ID, "int64"),)
            features = {
                item.name: _to_feature(item, example[item.name], index)
                for item in spec
                if item.name != ID or ID in example
            }
            features.setdefault(ID, tf.train.Feature(int64_list=tf.train.Int64List(value=[index])))
            writers[index % n].write(
                tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()
            )
            count = index + 1
    finally:
        for writer in writers:
            writer.close()
    if count < n:
        for path in temporary:
            tf.io.gfile.remove(path)
        raise UsageError(
            f"Split {split!r} has {count} example(s), fewer than --num_shards={n}; some files "
            "would be empty. Pass a smaller --num_shards."
        )
    for source, target in zip(temporary, paths):
        tf.io.gfile.rename(source, target)
    return spec, paths, count


def convert(config: ConvertConfig) -> ConvertResult:
    """Writes the source's examples as sharded TFRecord files of `tf.train.Example`.

    Args:
      config: The validated conversion settings.

    Returns:
      The spec, files and example counts written.

    Raises:
      UsageError: for a missing source, an existing output, features a spec
        cannot hold, or fewer examples than shards.
      DataError: for a bad CSV line.

    Example:
      >>> convert(ConvertConfig("npz:/data/train.npz", "/shared/mine", 4))  # doctest: +SKIP
    """
    tf.io.gfile.makedirs(config.output)
    if config.kind == "tfds":
        sources = _tfds_examples(config)
    elif config.kind == "csv":
        sources = {(config.splits or ("train",))[0]: _csv_examples(config)}
    else:
        sources = {(config.splits or ("train",))[0]: _npz_examples(config)}
    specs: List[Tuple[FeatureSpec, ...]] = []
    files, counts = {}, {}
    for split, examples in sources.items():
        spec, files[split], counts[split] = _write_split(examples, split, config)
        specs.append(spec)
    if any(spec != specs[0] for spec in specs):
        raise UsageError(
            f"The splits have different features: {[format_specs(spec) for spec in specs]}."
        )
    with tf.io.gfile.GFile(os.path.join(config.output, SPEC_FILE), "w") as stream:
        stream.write(format_specs(specs[0]) + "\n")
    return ConvertResult(specs[0], files, counts)


def training_params(result: ConvertResult, output: str) -> str:
    """The `--params` value that trains on converted files with the `tfrecord` input_fn."""
    splits = list(result.files)
    train = "train" if "train" in splits else splits[0]
    evaluation = next((s for s in ("test", "validation") if s in splits and s != train), None)
    params = [f"files={os.path.join(output, train)}-*.tfrecord"]
    if evaluation:
        params.append(f"eval_files={os.path.join(output, evaluation)}-*.tfrecord")
    params.append(f"features={format_specs(result.spec)}")
    return ",".join(params)


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines the command's flags on `flag_values`."""
    f = flag_values
    flags.DEFINE_string("source", None, "tfds:<name>, csv:<glob> or npz:<path>.", flag_values=f)
    flags.DEFINE_string("output", None, "Directory for the TFRecord files.", flag_values=f)
    flags.DEFINE_integer(
        "num_shards",
        None,
        "Files per split; a multiple of the number of workers.",
        lower_bound=1,
        flag_values=f,
    )
    flags.DEFINE_list(
        "splits",
        [],
        "TFDS splits (default all); for csv/npz the split name (default train).",
        flag_values=f,
    )
    flags.DEFINE_string("data_dir", None, "TFDS data directory.", flag_values=f)
    flags.DEFINE_string(
        "columns", None, "CSV column spec, such as 'label:int64;x:float32:4'.", flag_values=f
    )
    flags.DEFINE_boolean("header", True, "CSV files start with a header line.", flag_values=f)
    flags.DEFINE_string("delimiter", ",", "CSV field separator.", flag_values=f)
    flags.mark_flags_as_required(["source", "output", "num_shards"], flag_values=f)


def main(argv: Sequence[str]) -> int:
    """Flags in, one `convert` call, a summary out."""
    from estimator_dist.base.exit_codes import BAD_DATA
    from estimator_dist.report.cli import usage_exit

    if len(argv) > 1:
        usage_exit(PROGRAM, f"unexpected positional arguments {list(argv[1:])}.")
    f = flags.FLAGS
    try:
        config = ConvertConfig(
            source=f.source,
            output=f.output,
            num_shards=f.num_shards,
            splits=tuple(f.splits),
            data_dir=f.data_dir,
            columns=f.columns,
            header=f.header,
            delimiter=f.delimiter,
        )
        result = convert(config)
    except UsageError as error:
        usage_exit(PROGRAM, str(error))
    except DataError as error:
        sys.stderr.write(f"{PROGRAM}: error: {error} (exit code {BAD_DATA}: bad data)\n")
        return BAD_DATA
    for split, paths in result.files.items():
        print(
            f"Wrote {result.counts[split]} {split} examples to {len(paths)} files: {paths[0]} ..."
        )
    print(
        f"Feature spec: {format_specs(result.spec)} (in {os.path.join(config.output, SPEC_FILE)})"
    )
    print(f"Train with: --input_fn=tfrecord --params='{training_params(result, config.output)}'")
    return 0


def run() -> None:
    """Console-script entry point."""
    from estimator_dist.report.cli import run_program

    define_flags()
    run_program(main, PROGRAM)


if __name__ == "__main__":
    run()
