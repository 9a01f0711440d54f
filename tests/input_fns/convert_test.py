"""The convert command: TFDS, CSV and NumPy sources into sharded TFRecord files."""

import os

import numpy as np
import pytest
import tensorflow as tf

from estimator_dist.base.errors import DataError, UsageError
from estimator_dist.base.params import parse_params_flag
from input_fns import digits, tfrecord
from input_fns.convert import SPEC_FILE, ConvertConfig, convert, training_params
from tests.input_fns import data
from tests.procs import run_module

EVAL = tf.estimator.ModeKeys.EVAL


def read_back(result, output, split="train"):
    params = parse_params_flag(training_params(result, output))
    params.update(batch_size=1000, files=os.path.join(output, f"{split}-*.tfrecord"))
    (batch,) = list(tfrecord.input_fn(EVAL, None, params))
    order = np.argsort(batch[0]["id"].numpy())
    return {key: value.numpy()[order] for key, value in batch[0].items()}, batch[1].numpy()[order]


def write_npz(tmp_path, count=10):
    path = str(tmp_path / "arrays.npz")
    rng = np.random.RandomState(0)
    arrays = {
        "image": rng.randint(0, 256, (count, 4, 4, 1)).astype(np.uint8),
        "x": rng.rand(count, 3).astype(np.float32),
        "label": np.arange(count) % 3,
    }
    np.savez(path, **arrays)
    return path, arrays


def test_npz_round_trip(tmp_path):
    path, arrays = write_npz(tmp_path)
    output = str(tmp_path / "out")
    result = convert(ConvertConfig(f"npz:{path}", output, 4))
    assert [os.path.basename(p) for p in result.files["train"]] == [
        f"train-0000{i}-of-00004.tfrecord" for i in range(4)
    ]
    assert result.counts == {"train": 10}
    spec = "image:uint8:4x4x1;x:float32:3;label:int64;id:int64"
    assert open(os.path.join(output, SPEC_FILE)).read().strip() == spec
    # Example k is in file k % 4: 3, 3, 2, 2 records.
    sizes = [sum(1 for _ in tf.data.TFRecordDataset(p)) for p in result.files["train"]]
    assert sizes == [3, 3, 2, 2]
    features, labels = read_back(result, output)
    np.testing.assert_array_equal(features["id"], np.arange(10))
    np.testing.assert_allclose(features["image"], arrays["image"] / 255.0, rtol=1e-6)
    np.testing.assert_allclose(features["x"], arrays["x"])
    np.testing.assert_array_equal(labels, arrays["label"])


def test_csv_round_trip(tmp_path):
    pattern = data.write_csv(str(tmp_path / "csv"), 2, 12)
    output = str(tmp_path / "out")
    result = convert(ConvertConfig(f"csv:{pattern}", output, 3, columns=data.COLUMNS))
    assert result.counts == {"train": 12}
    # The CSV has an id column, so no id is added.
    assert [str(spec) for spec in result.spec] == ["id:int64", "label:int64", "image:uint8:4x4x1"]
    features, labels = read_back(result, output)
    np.testing.assert_array_equal(features["id"], np.arange(12))
    np.testing.assert_allclose(features["image"][:, 0, 0, 0], np.arange(12) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(labels, np.arange(12) % 10)


def test_fail_with_bad_csv_line(tmp_path):
    pattern = data.write_csv(str(tmp_path / "csv"), 1, 12, replace={5: "5,5"})
    with pytest.raises(DataError, match="train-00.csv, line 7: 2 column"):
        convert(ConvertConfig(f"csv:{pattern}", str(tmp_path / "out"), 2, columns=data.COLUMNS))


def test_tfds_splits_and_training_params(tmp_path, data_dir):
    output = str(tmp_path / "out")
    result = convert(ConvertConfig(f"tfds:{digits.NAME}", output, 3, data_dir=data_dir))
    assert result.counts == {"test": digits.NUM_TEST, "train": 1797 - digits.NUM_TEST}
    assert training_params(result, output) == (
        f"files={output}/train-*.tfrecord,eval_files={output}/test-*.tfrecord,"
        "features=image:uint8:8x8x1;label:int64;id:int64"
    )


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"source": "parquet:/x"}, "is not one of tfds:<name>, csv:<glob> or npz:<path>"),
        ({"source": "npz:"}, "is not one of"),
        ({"num_shards": 0}, "--num_shards must be at least 1"),
        ({"source": "csv:/x/*.csv"}, "--source=csv needs --columns"),
        ({"columns": "a:int64"}, "--columns applies to --source=csv only"),
        ({"splits": ("train", "test")}, "a npz source makes one split"),
    ],
)
def test_fail_with_invalid_config(kwargs, fragment):
    values = {"source": "npz:/x.npz", "output": "/tmp/out", "num_shards": 2, **kwargs}
    with pytest.raises(UsageError) as raised:
        ConvertConfig(**values)
    assert fragment in str(raised.value)


def test_fail_with_fewer_examples_than_shards(tmp_path):
    path, _ = write_npz(tmp_path, count=3)
    output = str(tmp_path / "out")
    with pytest.raises(UsageError, match="has 3 example\\(s\\), fewer than --num_shards=4"):
        convert(ConvertConfig(f"npz:{path}", output, 4))
    assert not [name for name in os.listdir(output) if "tfrecord" in name]


def test_fail_instead_of_overwriting(tmp_path):
    path, _ = write_npz(tmp_path)
    output = str(tmp_path / "out")
    convert(ConvertConfig(f"npz:{path}", output, 2))
    with pytest.raises(UsageError, match="train-00000-of-00002.tfrecord exists already"):
        convert(ConvertConfig(f"npz:{path}", output, 2))


def test_fail_with_arrays_of_different_lengths(tmp_path):
    path = str(tmp_path / "bad.npz")
    np.savez(path, x=np.zeros((3, 2)), label=np.zeros(4))
    with pytest.raises(UsageError, match="same first dimension"):
        convert(ConvertConfig(f"npz:{path}", str(tmp_path / "out"), 2))


@pytest.mark.multiprocess
def test_command_prints_what_to_train_with(tmp_path):
    path, _ = write_npz(tmp_path)
    output = str(tmp_path / "out")
    run = run_module(
        "input_fns.convert", [f"--source=npz:{path}", f"--output={output}", "--num_shards=2"], 120
    )
    assert "Wrote 10 train examples to 2 files" in run.output
    assert "Feature spec: image:uint8:4x4x1;x:float32:3;label:int64;id:int64" in run.output
    assert (
        f"Train with: --input_fn=tfrecord --params='files={output}/train-*.tfrecord," in run.output
    )
    again = run_module(
        "input_fns.convert",
        [f"--source=npz:{path}", f"--output={output}", "--num_shards=2"],
        120,
        check=False,
    )
    assert again.returncode == 2, again.describe()
    assert "input_fns.convert: error: " in again.output
    assert "exists already" in again.output
