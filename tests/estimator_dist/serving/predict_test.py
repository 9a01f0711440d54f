"""Predicting from an export: finding the SavedModel, and reading every input training reads.

The input is read as `Estimator.predict` reads it, so legacy input
functions serve unchanged: a Dataset, `numpy_input_fn`'s queue, tensors
from an iterator's `get_next()`. Predictions are compared with
`Estimator.predict` on the checkpoint the export was made from. The fresh
process without `tensorflow_estimator` is in equivalence_test.py.
"""

import io
import json

import numpy as np
import pytest
import tensorflow as tf

from estimator_dist.base import exit_codes
from estimator_dist.base.errors import UsageError, UserCodeError
from estimator_dist.serving.predict import ENDLESS_INPUT, find_saved_model, run_predictions
from estimator_dist.task import export
from tests.legacy import layers_cnn, tensor_input
from tests.procs import run_module

HERE = "tests.estimator_dist.serving.predict_test"
#: How the input functions below were called: (mode, eager, has a global step, params).
CALLS = []


def _export(directory):
    directory.mkdir(parents=True)
    (directory / "saved_model.pb").write_bytes(b"")
    return str(directory)


def test_a_saved_model_directory_is_used_as_it_is(tmp_path):
    assert find_saved_model(_export(tmp_path / "m")) == str(tmp_path / "m")


def test_the_newest_timestamped_export_is_chosen(tmp_path):
    _export(tmp_path / "exports" / "999")
    newest = _export(tmp_path / "exports" / "1000")
    (tmp_path / "exports" / "1001").mkdir()  # an export still being written
    assert find_saved_model(str(tmp_path / "exports")) == newest


def test_a_model_dir_gives_its_best_export_before_its_latest(tmp_path):
    _export(tmp_path / "model" / "export" / "latest" / "2000")
    best = _export(tmp_path / "model" / "export" / "best" / "1000")
    assert find_saved_model(str(tmp_path / "model")) == best


def test_fail_with_a_directory_without_saved_model(tmp_path):
    with pytest.raises(UsageError, match="holds no SavedModel") as raised:
        find_saved_model(str(tmp_path))
    assert f"--export_dir={tmp_path}" in str(raised.value)


def _record_call(mode, params):
    step = tf.compat.v1.train.get_global_step()
    CALLS.append((mode, tf.executing_eagerly(), step is not None, params["batch_size"]))


def dataset_input_fn(mode, params):
    """The layers tutorial's evaluation data as a Dataset, batched by params."""
    _record_call(mode, params)
    data = ({"x": layers_cnn.eval_data}, layers_cnn.eval_labels)
    return tf.data.Dataset.from_tensor_slices(data).batch(params["batch_size"])


def numpy_input_fn(mode, params):
    """`numpy_input_fn`'s function called inside an input_fn: its queue must run."""
    _record_call(mode, params)
    return layers_cnn.eval_input_fn()


def constant_input_fn():
    """Tensors read from no Dataset and no queue: Estimator.predict would yield forever."""
    return {"x": tf.constant(layers_cnn.eval_data)}, tf.constant(layers_cnn.eval_labels)


def features_only_input_fn():
    """`numpy_input_fn` without labels, as for data to be labelled."""
    inputs = tf.compat.v1.estimator.inputs.numpy_input_fn
    return inputs({"x": layers_cnn.eval_data}, num_epochs=1, shuffle=False)()


def float64_input_fn():
    features = {"x": layers_cnn.eval_data.astype(np.float64)}  # trained on float32
    return tf.data.Dataset.from_tensor_slices(features).batch(8)


def three_items_input_fn():
    features, labels = constant_input_fn()
    return features, labels, labels


def raising_input_fn(params):
    raise ValueError(f"no such file: {params['data_dir']}/eval.csv")


def raising_while_read_input_fn():
    def fail(x):
        raise ValueError("bad record")

    data = tf.data.Dataset.from_tensor_slices({"x": layers_cnn.eval_data}).batch(8)
    return data.map(lambda batch: {"x": tf.numpy_function(fail, [batch["x"]], tf.float32)})


def _train_and_export(model_fn, input_fn, feature_specs, model_dir):
    estimator = tf.estimator.Estimator(model_fn, model_dir=str(model_dir))
    estimator.train(input_fn, max_steps=20)
    receiver = export.serving_input_receiver_fn(feature_specs)
    path = estimator.export_saved_model(str(model_dir / "export"), receiver).decode()
    return estimator, path


@pytest.fixture(scope="module")
def layers_export(tmp_path_factory):
    """The layers tutorial's CNN trained 20 steps, its export, and Estimator.predict's output."""
    model_dir = tmp_path_factory.mktemp("layers_cnn")
    specs = {"x": tf.TensorSpec([None, 8, 8], tf.float32)}
    estimator, path = _train_and_export(
        layers_cnn.cnn_model_fn, layers_cnn.train_input_fn, specs, model_dir
    )
    return path, list(estimator.predict(layers_cnn.eval_input_fn))


def _predict(path, input_fn, max_examples=None):
    output = io.StringIO()
    params = {"batch_size": 50, "data_dir": "/nonexistent", "seed": 0}
    summary = run_predictions(path, input_fn, params, output, max_examples)
    lines = [json.loads(line) for line in output.getvalue().splitlines()]
    assert summary["examples"] == len(lines)
    return summary, lines


def _assert_like_estimator(lines, expected):
    assert [line["classes"] for line in lines] == [int(p["classes"]) for p in expected]
    difference = max(
        float(np.max(np.abs(np.array(line["probabilities"]) - p["probabilities"])))
        for line, p in zip(lines, expected)
    )
    assert difference < 1e-6


@pytest.mark.slow
@pytest.mark.parametrize(
    "input_fn",
    ["tests.legacy.layers_cnn:eval_input_fn", f"{HERE}:numpy_input_fn", f"{HERE}:dataset_input_fn"],
)
def test_predicts_a_numpy_input_fn_and_a_dataset_as_estimator_predict(input_fn, layers_export):
    path, expected = layers_export
    del CALLS[:]
    summary, lines = _predict(path, input_fn)
    assert len(lines) == len(expected) == len(layers_cnn.eval_labels) == 297
    _assert_like_estimator(lines, expected)
    assert [line["label"] for line in lines] == layers_cnn.eval_labels.tolist()
    correct = sum(int(p["classes"]) == y for p, y in zip(expected, layers_cnn.eval_labels))
    assert summary["accuracy"] == correct / 297
    # Called once, as Estimator.predict calls it: mode PREDICT, in a graph with a global step.
    assert CALLS in ([], [(tf.estimator.ModeKeys.PREDICT, False, True, 50)])
    assert bool(CALLS) == (HERE in input_fn)


@pytest.mark.slow
def test_predicts_features_without_labels(layers_export):
    path, expected = layers_export
    summary, lines = _predict(path, f"{HERE}:features_only_input_fn")
    _assert_like_estimator(lines, expected)
    assert len(lines) == 297
    assert not any("label" in line for line in lines)
    assert "accuracy" not in summary


@pytest.mark.slow
def test_max_examples_ends_a_repeating_numpy_input(layers_export):
    path, _ = layers_export
    _, lines = _predict(path, "tests.legacy.layers_cnn:train_input_fn", max_examples=150)
    # Its batches hold 100: the second is cut short.
    assert [line["index"] for line in lines] == list(range(150))


@pytest.mark.slow
def test_max_examples_takes_the_first_examples_of_constant_tensors(layers_export):
    path, expected = layers_export
    _, lines = _predict(path, f"{HERE}:constant_input_fn", max_examples=7)
    _assert_like_estimator(lines, expected[:7])
    assert len(lines) == 7


@pytest.mark.slow
@pytest.mark.parametrize(
    "input_fn", ["tests.legacy.layers_cnn:train_input_fn", f"{HERE}:constant_input_fn"]
)
def test_fail_with_an_input_that_never_ends_and_no_max_examples(input_fn, layers_export):
    path, _ = layers_export
    with pytest.raises(UsageError) as raised:
        _predict(path, input_fn)
    assert str(raised.value) == ENDLESS_INPUT.format(name=input_fn)
    assert "--max_examples=N" in str(raised.value)


@pytest.mark.slow
@pytest.mark.parametrize(
    "input_fn, message",
    [
        ("three_items_input_fn", "returned 3 items; Estimator takes a Dataset, features, or"),
        (
            "float64_input_fn",
            "takes x float32(None, 8, 8), but the input_fn gives x float64(8, 8, 8)",
        ),
    ],
)
def test_fail_with_an_input_the_export_cannot_take(input_fn, message, layers_export):
    path, _ = layers_export
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _predict(path, f"{HERE}:{input_fn}", max_examples=8)


@pytest.mark.slow
@pytest.mark.parametrize(
    "input_fn, cause",
    [
        (f"{HERE}:raising_input_fn", "ValueError: no such file: /nonexistent/eval.csv"),
        (f"{HERE}:raising_while_read_input_fn", "ValueError: bad record"),
    ],
)
def test_fail_with_an_input_fn_that_raises(input_fn, cause, layers_export):
    path, _ = layers_export
    with pytest.raises(UserCodeError) as raised:
        _predict(path, input_fn)
    message = str(raised.value)
    assert raised.value.exit_code == exit_codes.USER_CODE
    assert message.startswith(f"--input_fn={input_fn} raised ")
    assert cause in message
    assert "Fix the input_fn" in message


@pytest.mark.slow
def test_predicts_a_tensor_returning_input_fn_as_estimator_predict(tmp_path):
    specs = {"measurements": tf.TensorSpec([None, 30], tf.float32)}
    estimator, path = _train_and_export(
        tensor_input.model_fn, tensor_input.train_input_fn, specs, tmp_path
    )
    expected = [int(p["malignant"]) for p in estimator.predict(tensor_input.eval_input_fn)]
    _, lines = _predict(path, "tests.legacy.tensor_input:eval_input_fn")
    assert len(lines) == len(expected) == 114
    assert [line["malignant"] for line in lines] == expected
    assert [line["label"] for line in lines] == tensor_input._y[455:].tolist()


#: A user's module for the program: importing this test module would define its flags twice.
USER_MODULE = """
def input_fn(params):
    raise ValueError("no such file: %s/eval.csv" % params["data_dir"])
"""


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_program_predicts_numpy_input_and_reports_a_raising_input_fn(layers_export, tmp_path):
    path, expected = layers_export
    served = tmp_path / "predictions.jsonl"
    args = [f"--export_dir={path}", f"--output={served}"]
    run = run_module(
        "estimator_dist.predict", [*args, "--input_fn=tests.legacy.layers_cnn:eval_input_fn"], 120
    )
    assert '"examples": 297' in run.output, run.describe()
    _assert_like_estimator([json.loads(line) for line in served.read_text().splitlines()], expected)
    (tmp_path / "failing_input.py").write_text(USER_MODULE)
    failed = run_module(
        "estimator_dist.predict",
        [*args, "--input_fn=failing_input:input_fn"],
        120,
        env={"PYTHONPATH": str(tmp_path)},
        check=False,
    )
    assert failed.returncode == exit_codes.USER_CODE, failed.describe()
    assert "Traceback" in failed.output  # logged for the user, before the message
    last = failed.output.strip().splitlines()[-1]
    assert last.startswith(
        "estimator_dist.predict: error: --input_fn=failing_input:input_fn raised ValueError: "
        "no such file: None/eval.csv. predict calls it as Estimator.predict does"
    ), failed.describe()
