"""Canned estimator builders: registry, classes, parameters, a short real run."""

import pytest
import tensorflow as tf

from estimator_dist.base.errors import UsageError
from input_fns import tabular
from model_fns import ESTIMATORS, canned

TRAIN = tf.estimator.ModeKeys.TRAIN
EVAL = tf.estimator.ModeKeys.EVAL
PREDICT = tf.estimator.ModeKeys.PREDICT
BUILDERS = {
    "canned_dnn": (canned.build_dnn, "DNNClassifierV2", "DNNRegressorV2"),
    "canned_linear": (canned.build_linear, "LinearClassifierV2", "LinearRegressorV2"),
    "canned_wide_and_deep": (
        canned.build_wide_and_deep,
        "DNNLinearCombinedClassifierV2",
        "DNNLinearCombinedRegressorV2",
    ),
}


def params_for(name, dataset="iris", **extra):
    params = {"feature_specs": tabular.feature_specs(dataset), "learning_rate": 0.1, **extra}
    if name != "canned_linear":
        params["hidden_units"] = "8"
    return params


def test_builders_are_registered():
    for name, (build, _, _) in BUILDERS.items():
        assert ESTIMATORS.get(name) is build


@pytest.mark.parametrize("head", ["classification", "regression"])
@pytest.mark.parametrize("name", BUILDERS)
def test_builds_the_canned_estimator_of_each_head(name, head, tmp_path):
    build, classifier, regressor = BUILDERS[name]
    config = tf.estimator.RunConfig(model_dir=str(tmp_path), tf_random_seed=7)
    estimator = build(config, params_for(name, head=head))
    assert type(estimator).__name__ == (classifier if head == "classification" else regressor)
    assert estimator.config.tf_random_seed == 7
    assert estimator.model_dir == str(tmp_path)


@pytest.mark.parametrize(
    "params, message",
    [
        ({}, "feature_specs is required"),
        ({"feature_specs": {}, "warm_start_from": ""}, "warm_start_from must be a checkpoint"),
        ({"feature_specs": {}, "optimizer": "sgdd"}, "optimizer 'sgdd' is unknown"),
        ({"feature_specs": {}, "n_classes": 1}, "n_classes must be at least 2"),
    ],
)
def test_fail_with_invalid_params(params, message):
    with pytest.raises(UsageError, match=f"Invalid parameters for canned_dnn: {message}"):
        canned.build_dnn(tf.estimator.RunConfig(), params)


def test_fail_with_unknown_param():
    with pytest.raises(UsageError, match="Unknown parameter.* hidden_units for canned_linear"):
        canned.build_linear(tf.estimator.RunConfig(), params_for("canned_dnn"))


@pytest.mark.parametrize(
    "name, expected",
    [("adagrad", "Adagrad"), ("adam", "Adam"), ("ftrl", "Ftrl"), ("sgd", "SGD")],
)
def test_keras_optimizer_factories(name, expected):
    optimizer = canned.keras_optimizer(name, 0.25)()
    assert isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer)
    assert type(optimizer).__name__ == expected
    assert optimizer.get_config()["learning_rate"] == 0.25


# Small graphs keep this cheap: the linear parts on 4 iris features, the
# regression head on a DNN (a linear model on diabetes's 10 features takes
# several times longer to build).
@pytest.mark.slow
@pytest.mark.parametrize(
    "name, dataset, extra, metric",
    [
        ("canned_dnn", "diabetes", {"head": "regression"}, "average_loss"),
        (
            "canned_linear",
            "iris",
            {"n_classes": 3, "crosses": "petal_width_cm*sepal_width_cm"},
            "accuracy",
        ),
        ("canned_wide_and_deep", "iris", {"n_classes": 3}, "accuracy"),
    ],
)
def test_builds_trains_evaluates_predicts_and_warm_starts(name, dataset, extra, metric, tmp_path):
    data = {"dataset": dataset, "batch_size": 16, "shuffle_buffer": 0}
    params = {**params_for(name, dataset, **extra), **data}

    def input_fn(mode):
        return lambda input_context=None: tabular.input_fn(mode, input_context, params)

    config = tf.estimator.RunConfig(model_dir=str(tmp_path / "a"), tf_random_seed=0)
    estimator = ESTIMATORS.get(name)(config, params)
    estimator.train(input_fn(TRAIN), steps=3)
    metrics = estimator.evaluate(input_fn(EVAL))
    assert metrics["global_step"] == 3
    assert metric in metrics
    prediction = next(estimator.predict(input_fn(PREDICT)))
    assert ("predictions" if extra.get("head") == "regression" else "probabilities") in prediction
    warm = ESTIMATORS.get(name)(
        tf.estimator.RunConfig(model_dir=str(tmp_path / "b")),
        {**params, "warm_start_from": str(tmp_path / "a")},
    )
    assert warm._warm_start_settings.ckpt_to_initialize_from == str(tmp_path / "a")
