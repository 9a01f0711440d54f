"""Exporters wired into EvalSpec: which metric decides the best export, and bad settings."""

import pytest
import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.config.job import JobConfig
from estimator_dist.task import export
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
    better = best._exporter._compare_fn
    assert better({"accuracy": 0.5, "loss": 1.0}, {"accuracy": 0.6, "loss": 2.0})
    assert not better({"accuracy": 0.6, "loss": 1.0}, {"accuracy": 0.5, "loss": 0.1})


def test_fail_with_a_best_metric_the_evaluation_does_not_have():
    (best,) = export.make_exporters({"x": tf.TensorSpec([None, 2])}, ["best"], "auc", 2)
    with pytest.raises(UsageError, match="has no metric 'auc'; it has accuracy, loss"):
        best._exporter._compare_fn(
            {"accuracy": 0.5, "loss": 1.0, "global_step": 3}, {"accuracy": 0.6}
        )


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


def _bare_tensor_model_fn(features, labels, mode):
    # As legacy code wrote it: features is the tensor itself, not a dict.
    logits = tf.compat.v1.layers.dense(features, 3)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"class_ids": tf.argmax(logits, 1)})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_bare_tensor_features_export_a_model_that_serves_them(tmp_path):
    def input_fn():
        data = tf.data.Dataset.from_tensor_slices((tf.ones([8, 4]), tf.zeros([8], tf.int32)))
        return data.repeat().batch(4)

    estimator = tf.estimator.Estimator(_bare_tensor_model_fn, model_dir=str(tmp_path / "m"))
    estimator.train(input_fn, max_steps=2)
    receiver = export.serving_input_receiver_fn(tf.TensorSpec([4, 4], tf.float32))
    path = estimator.export_saved_model(str(tmp_path / "export"), receiver).decode()
    serve = tf.saved_model.load(path).signatures["serving_default"]
    assert list(serve.structured_input_signature[1]) == ["features"]
    assert serve(features=tf.ones([5, 4]))["class_ids"].shape == [5]


class _FailingExporter(tf.estimator.Exporter):
    name = "failing"

    def export(self, *args):
        raise ValueError("an export that fails for another reason")


def _train_two_steps(model_dir):
    def input_fn():
        data = tf.data.Dataset.from_tensor_slices((tf.ones([8, 4]), tf.zeros([8], tf.int32)))
        return data.repeat().batch(4)

    estimator = tf.estimator.Estimator(_bare_tensor_model_fn, model_dir=model_dir)
    estimator.train(input_fn, max_steps=2)
    return estimator


def test_an_export_skips_a_checkpoint_the_chief_deleted_after_its_evaluation(tmp_path):
    estimator = _train_two_steps(str(tmp_path / "m"))
    checkpoint = estimator.latest_checkpoint()
    (latest,) = export.make_exporters(tf.TensorSpec([4, 4], tf.float32), ["latest"], "loss", 2)
    exported = latest.export(estimator, str(tmp_path / "e"), checkpoint, {"loss": 1.0}, False)
    assert tf.io.gfile.exists(exported)
    for path in tf.io.gfile.glob(f"{checkpoint}.*"):  # As the chief's rotation deletes it.
        tf.io.gfile.remove(path)
    assert latest.export(estimator, str(tmp_path / "e"), checkpoint, {"loss": 1.0}, False) is None


def test_an_export_failing_for_another_reason_still_fails(tmp_path):
    estimator = _train_two_steps(str(tmp_path / "m"))
    wrapped = export._SkipVanishedCheckpoint(_FailingExporter())
    with pytest.raises(ValueError, match="another reason"):
        wrapped.export(estimator, str(tmp_path / "e"), estimator.latest_checkpoint(), {}, False)
