"""The `csv` input_fn: columns, header, quoting, sharding, and bad lines."""

import os

import numpy as np
import pytest
import tensorflow as tf

from estimator_dist.base.errors import DataError, UsageError
from input_fns import INPUT_FNS, bad_data, csv_input, prepare_input
from tests.input_fns import data
from tests.input_fns.data import read_all

TRAIN = tf.estimator.ModeKeys.TRAIN
EVAL = tf.estimator.ModeKeys.EVAL


pytestmark = pytest.mark.usefixtures("fresh_bad_data_counter")


def write(tmp_path, text, name="data.csv"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_registered_as_csv():
    assert INPUT_FNS.get("csv") is csv_input.input_fn


def test_columns_become_shaped_features(tmp_path):
    pattern = data.write_csv(str(tmp_path), 2, 20)
    dataset = csv_input.input_fn(TRAIN, None, data.csv_params(pattern))
    features, labels = next(iter(dataset))
    assert features["image"].shape == (8, 4, 4, 1)
    assert features["image"].dtype == tf.float32
    assert features["id"].dtype == tf.int64
    ids = features["id"].numpy()
    np.testing.assert_allclose(features["image"].numpy()[:, 3, 3, 0], (ids % 256) / 255.0)
    np.testing.assert_array_equal(labels.numpy(), ids % 10)
    assert labels.dtype == tf.int32
    assert dataset.element_spec[0]["image"].shape.as_list() == [8, 4, 4, 1]


def test_eval_reads_every_line_once_without_header(tmp_path):
    pattern = data.write_csv(str(tmp_path), 3, 25, header=False)
    params = data.csv_params(pattern, header=False)
    assert sorted(read_all(csv_input.input_fn(EVAL, None, params))) == list(range(25))


def test_floats_strings_quotes_delimiter_and_blank_lines(tmp_path):
    text = 'x;name;label\n1.5;"a;b";1\n\n-2e-3;plain;0\n  nan ;"say ""hi""";1\n'
    params = {
        "batch_size": 3,
        "files": write(tmp_path, text),
        "columns": "x:float32;name:string;label:int64",
        "delimiter": ";",
    }
    features, labels = next(iter(csv_input.input_fn(EVAL, None, params)))
    x = features["x"].numpy()
    assert x[0] == 1.5 and x[1] == pytest.approx(-0.002) and np.isnan(x[2])
    assert features["name"].numpy().tolist() == [b"a;b", b"plain", b'say "hi"']
    assert labels.numpy().tolist() == [1, 0, 1]


def test_multi_column_float_feature(tmp_path):
    params = {
        "batch_size": 2,
        "files": write(tmp_path, "a,b,c,y\n1,2,3,0\n4,5,6,1\n"),
        "columns": "x:float32:3;label:int64",
    }
    features, labels = next(iter(csv_input.input_fn(EVAL, None, params)))
    np.testing.assert_array_equal(features["x"].numpy(), [[1, 2, 3], [4, 5, 6]])


# --- bad lines ----------------------------------------------------------------

BAD_LINES = {
    "too few columns": ("7,7", "2 column(s); the column spec expects 18"),
    "too many columns": (data.csv_line(7) + ",9", "19 column(s); the column spec expects 18"),
    "not an integer": (
        data.csv_line(7).replace("7,7,", "7,seven,", 1),
        "column 2 (label) holds 'seven'; expected int64",
    ),
    "pixel out of range": (
        "7,7," + ",".join(["300"] * 16),
        "column 3 (image[0]) holds '300'; expected uint8",
    ),
    "quoted number": ('"7",' + data.csv_line(7)[2:], "column 1 (id) holds '<quoted>'"),
}


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_fail_with_bad_line_names_file_line_and_problem(tmp_path, case):
    line, problem = BAD_LINES[case]
    pattern = data.write_csv(str(tmp_path), 3, 30, replace={7: line})
    with pytest.raises(tf.errors.OpError) as raised:
        read_all(csv_input.input_fn(EVAL, None, data.csv_params(pattern)))
    error = bad_data.data_error_from(raised.value)
    assert isinstance(error, DataError)
    # Id 7 is the third row of file 1, after the header: line 4.
    path = os.path.join(str(tmp_path), "train-01.csv")
    assert f"Bad input data: {path}, line 4: {problem}" in str(error)


@pytest.mark.parametrize("case", sorted(BAD_LINES))
def test_skip_bad_line_and_count_it(tmp_path, case):
    line, _ = BAD_LINES[case]
    pattern = data.write_csv(str(tmp_path), 3, 30, replace={7: line, 8: line})
    ids = read_all(csv_input.input_fn(EVAL, None, data.csv_params(pattern, skip_bad_records=True)))
    assert sorted(ids) == [i for i in range(30) if i not in (7, 8)]
    assert bad_data.COUNTER.total() == 2
    assert "line 4" in bad_data.summary()


# --- parameters and preflight ---------------------------------------------------


@pytest.mark.parametrize(
    "params, fragment",
    [
        ({"files": "x"}, "columns is required"),
        ({"files": "x", "columns": "label:int64", "delimiter": ";;"}, "delimiter must be one"),
        ({"files": "x", "columns": "x:float32"}, "label_key='label' is not in columns"),
        ({"files": "x", "columns": "label;int64"}, "is not name:dtype"),
        ({"files": "x", "columns": "label:int64", "header": "no"}, "expected bool"),
    ],
)
def test_fail_with_invalid_params(params, fragment):
    with pytest.raises(UsageError, match=fragment):
        csv_input.input_fn(TRAIN, None, params)


def test_prepare_accepts_matching_files(tmp_path):
    pattern = data.write_csv(str(tmp_path), 2, 10)
    assert prepare_input("csv", data.csv_params(pattern)) is None


def test_prepare_fails_when_header_is_read_as_data(tmp_path):
    pattern = data.write_csv(str(tmp_path), 2, 10)
    with pytest.raises(UsageError) as raised:
        prepare_input("csv", data.csv_params(pattern, header=False))
    message = str(raised.value)
    assert "train-00.csv, first data line: column 1 (id) holds 'id'; expected int64" in message
    assert "header=False" in message


def test_prepare_fails_with_empty_glob(tmp_path):
    with pytest.raises(UsageError, match="matches no file"):
        prepare_input("csv", data.csv_params(str(tmp_path / "*.csv")))
