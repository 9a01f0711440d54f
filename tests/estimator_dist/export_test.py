"""Exporters wired into EvalSpec: which metric decides the best export, and bad settings."""

import pytest
import tensorflow as tf

from estimator_dist import export
from estimator_dist.driver import JobConfig
from estimator_dist.errors import UsageError
from run_config.run_config import RunConfigOptions


@pytest.mark.parametrize(
    "best_by, expected",
    [
        ("loss", ("loss", False)),
        ("rmse", ("rmse", False)),
        ("accuracy", ("accuracy", True)),
        ("auc", ("auc", True)),
        ("loss:max", ("loss", True)),
        ("accuracy:min", ("accuracy", False)),
    ],
)
def test_best_metric_direction(best_by, expected):
    assert export.best_metric(best_by) == expected


def test_best_export_compares_by_the_chosen_metric():
    (best,) = export.make_exporters({"x": tf.TensorSpec([None, 2])}, ["best"], "accuracy", 2)
    better = best._compare_fn
    assert better({"accuracy": 0.5, "loss": 1.0}, {"accuracy": 0.6, "loss": 2.0})
    assert not better({"accuracy": 0.6, "loss": 1.0}, {"accuracy": 0.5, "loss": 0.1})


def test_fail_with_a_best_metric_the_evaluation_does_not_have():
    (best,) = export.make_exporters({"x": tf.TensorSpec([None, 2])}, ["best"], "auc", 2)
    with pytest.raises(UsageError, match="has no metric 'auc'; it has accuracy, loss"):
        best._compare_fn({"accuracy": 0.5, "loss": 1.0, "global_step": 3}, {"accuracy": 0.6})


def test_serving_receiver_takes_each_feature_with_a_free_batch_dimension():
    specs = {"image": tf.TensorSpec([32, 8, 8, 1]), "age": tf.TensorSpec([32], tf.float32)}
    with tf.Graph().as_default():
        receiver = export.serving_input_receiver_fn(specs)()
    shapes = {name: t.shape.as_list() for name, t in receiver.receiver_tensors.items()}
    assert shapes == {"image": [None, 8, 8, 1], "age": [None]}


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"exports": ("latest", "newest")}, "--export names newest; valid: latest, best"),
        ({"export_best_by": "accuracy:up"}, "is not `metric`, `metric:min` or `metric:max`"),
        ({"exports_to_keep": 0}, "exports_to_keep must be at least 1"),
        ({"keras_model": "m", "estimator": "e"}, "Give --keras_model or --estimator, not both"),
        ({"keras_model": "m", "warm_start_from": "/c"}, "model.load_weights"),
    ],
)
def test_fail_with_bad_export_and_model_settings(settings, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        JobConfig(run=RunConfigOptions(model_dir="/tmp/x"), **settings)
