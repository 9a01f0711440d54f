"""Tabular model_fns: parameters, heads, training, export outputs, estimator run."""

import numpy as np
import pytest
import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.base.params import from_params
from input_fns import tabular as tabular_input
from model_fns import MODEL_FNS, tabular
from model_fns.heads import Head

TRAIN = tf.estimator.ModeKeys.TRAIN
EVAL = tf.estimator.ModeKeys.EVAL
PREDICT = tf.estimator.ModeKeys.PREDICT
MODELS = {
    "dnn_classifier": (tabular.dnn_classifier, tabular.DnnParams),
    "linear_classifier": (tabular.linear_classifier, tabular.LinearParams),
    "wide_and_deep": (tabular.wide_and_deep, tabular.WideDeepParams),
}
SMALL = {"hidden_units": "8x4", "learning_rate": 0.1}


def small(model):
    """Small hyper-parameters that `model` accepts (linear has no hidden_units)."""
    return {"learning_rate": 0.1} if model == "linear_classifier" else SMALL


#: The three heads, each on 32 real examples: (dataset, head params, label).
HEADS = {
    "binary": ("iris", {}, lambda y: (y == 0).astype(np.int32)),
    "multiclass": ("iris", {"n_classes": 3}, lambda y: y),
    "regression": ("diabetes", {"head": "regression"}, lambda y: y),
}


def batch(head):
    dataset, params, label = HEADS[head]
    data = tabular_input.load(dataset)
    features = {name: tf.constant(data.train_x[:32, i]) for i, name in enumerate(data.columns)}
    return features, tf.constant(label(data.train_y[:32])), params


def test_model_fns_are_registered():
    for name, (model_fn, _) in MODELS.items():
        assert MODEL_FNS.get(name) is model_fn


@pytest.mark.parametrize(
    "cls, params, message",
    [
        (tabular.DnnParams, {"head": "ranking"}, "head 'ranking' is unknown; valid: "),
        (tabular.DnnParams, {"n_classes": 1}, "n_classes must be at least 2 for head=class"),
        (tabular.DnnParams, {"learning_rate": 0.0}, "learning_rate must be positive, received 0.0"),
        (tabular.DnnParams, {"hidden_units": "64xa"}, "hidden_units must be positive layer"),
        (tabular.DnnParams, {"hidden_units": 0}, "hidden_units must be positive layer sizes"),
        (tabular.DnnParams, {"dropout": 1.0}, "dropout must be in [0, 1), received 1.0"),
        (tabular.DnnParams, {"optimizer": "rmsprop"}, "optimizer 'rmsprop' is unknown; valid: "),
        (tabular.LinearParams, {"optimizer": "lbfgs"}, "optimizer 'lbfgs' is unknown"),
        (tabular.LinearParams, {"boundaries": "2;1"}, "boundaries must increase strictly"),
        (tabular.WideDeepParams, {"linear_optimizer": "x"}, "linear_optimizer 'x' is unknown"),
        (
            tabular.WideDeepParams,
            {"linear_learning_rate": -1.0},
            "linear_learning_rate must be positive or None, received -1.0",
        ),
    ],
)
def test_fail_with_invalid_params(cls, params, message):
    with pytest.raises(UsageError) as raised:
        from_params(cls, params, "tabular model")
    assert str(raised.value).startswith("Invalid parameters for tabular model: ")
    assert message in str(raised.value)


def test_fail_with_unknown_param_names():
    with tf.Graph().as_default():
        features, labels, _ = batch("binary")
        with pytest.raises(UsageError, match="Unknown parameter.* hidden_unit "):
            tabular.dnn_classifier(features, labels, TRAIN, {"hidden_unit": "8"})


def test_params_accept_what_the_command_line_gives():
    params = tabular.WideDeepParams(hidden_units=64, boundaries="-2;2", crosses="a*b")
    assert params.units == (64,)
    assert tabular.DnnParams(hidden_units="128x64x32").units == (128, 64, 32)
    assert from_params(tabular.DnnParams, {"dropout": 0}, "dnn").dropout == 0.0


@pytest.mark.parametrize(
    "name, expected",
    [
        ("adagrad", tf.compat.v1.train.AdagradOptimizer),
        ("adam", tf.compat.v1.train.AdamOptimizer),
        ("ftrl", tf.compat.v1.train.FtrlOptimizer),
        ("sgd", tf.compat.v1.train.GradientDescentOptimizer),
    ],
)
def test_optimizers_are_v1_train_optimizers(name, expected):
    with tf.Graph().as_default():
        assert type(tabular.make_optimizer(name, 0.1)) is expected


@pytest.mark.parametrize(
    "model, head",
    [(model, head) for model in MODELS for head in ("binary", "regression")]
    + [("dnn_classifier", "multiclass")],
)
def test_training_lowers_the_loss(model, head):
    with tf.Graph().as_default():
        features, labels, params = batch(head)
        spec = MODELS[model][0](features, labels, TRAIN, {**small(model), **params})
        assert spec.loss.shape.as_list() == []
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            first = session.run(spec.loss)
            for _ in range(10):
                session.run(spec.train_op)
            last = session.run(spec.loss)
            assert session.run(tf.compat.v1.train.get_global_step()) == 10
    assert last < 0.9 * first


def test_wide_and_deep_trains_both_parts_with_their_own_optimizers():
    with tf.Graph().as_default():
        features, labels, _ = batch("binary")
        spec = tabular.wide_and_deep(features, labels, TRAIN, SMALL)
        variables = tf.compat.v1.trainable_variables()
        linear = [v for v in variables if v.name.startswith("linear/")]
        dnn = [v for v in variables if v.name.startswith("dnn/")]
        assert linear and dnn and len(linear) + len(dnn) == len(variables)
        slots = {v.name for v in tf.compat.v1.global_variables()}
        assert any("/Ftrl" in name for name in slots if name.startswith("linear/"))
        assert any("/Adagrad" in name for name in slots if name.startswith("dnn/"))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            before = session.run(linear + dnn)
            session.run(spec.train_op)
            after = session.run(linear + dnn)
            assert session.run(tf.compat.v1.train.get_global_step()) == 1
    changed = [not np.array_equal(b, a) for b, a in zip(before, after)]
    assert any(changed[: len(linear)]) and any(changed[len(linear) :])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["dnn_classifier", "wide_and_deep"])
def test_initial_weights_depend_only_on_the_seed(model):
    def initial(seed, graph_seed):
        with tf.Graph().as_default():
            tf.compat.v1.set_random_seed(graph_seed)
            features, labels, _ = batch("binary")
            MODELS[model][0](features, labels, TRAIN, {**small(model), "seed": seed})
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                return session.run(tf.compat.v1.trainable_variables())

    first = initial(0, 1)
    for same, other in zip(first, initial(0, 2)):
        np.testing.assert_array_equal(same, other)
    assert not all(np.array_equal(a, b) for a, b in zip(first, initial(5, 1)))


@pytest.mark.parametrize(
    "head, metrics",
    [
        ("binary", {"accuracy", "auc", "precision", "recall"}),
        ("multiclass", {"accuracy"}),
        ("regression", {"rmse", "mae"}),
    ],
)
def test_eval_metrics_of_each_head(head, metrics):
    with tf.Graph().as_default():
        features, labels, params = batch(head)
        spec = tabular.dnn_classifier(features, labels, EVAL, {**SMALL, **params})
        assert set(spec.eval_metric_ops) == metrics
        assert spec.train_op is None


def test_regression_metrics_match_numpy():
    with tf.Graph().as_default():
        features, labels, params = batch("regression")
        spec = tabular.linear_classifier(features, labels, EVAL, params)
        assert set(spec.eval_metric_ops) == {"rmse", "mae"}
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(tf.compat.v1.local_variables_initializer())
            session.run([update for _, update in spec.eval_metric_ops.values()])
            rmse = session.run(spec.eval_metric_ops["rmse"][0])
            mae = session.run(spec.eval_metric_ops["mae"][0])
            loss, y = session.run([spec.loss, labels])
    # Zero-initialised linear model: every prediction is 0.
    assert rmse == pytest.approx(np.sqrt(np.mean(y**2)), rel=1e-5)
    assert mae == pytest.approx(np.mean(np.abs(y)), rel=1e-5)
    assert loss == pytest.approx(np.mean(y**2), rel=1e-5)


@pytest.mark.parametrize(
    "head, signature, serving, keys",
    [
        (
            "binary",
            "classification",
            tf.estimator.export.ClassificationOutput,
            {"logits", "probabilities", "class_ids", "logistic"},
        ),
        (
            "multiclass",
            "classification",
            tf.estimator.export.ClassificationOutput,
            {"logits", "probabilities", "class_ids"},
        ),
        ("regression", "regression", tf.estimator.export.RegressionOutput, {"predictions"}),
    ],
)
def test_predict_export_outputs(head, signature, serving, keys):
    with tf.Graph().as_default():
        features, _, params = batch(head)
        spec = tabular.wide_and_deep(features, None, PREDICT, {**SMALL, **params})
        assert spec.loss is None and spec.train_op is None
        assert set(spec.predictions) == keys
        assert isinstance(spec.export_outputs["serving_default"], tf.estimator.export.PredictOutput)
        assert set(spec.export_outputs["serving_default"].outputs) == keys
        assert isinstance(spec.export_outputs[signature], serving)
        predict = spec.export_outputs["predict"]
        assert isinstance(predict, tf.estimator.export.PredictOutput)
        assert set(predict.outputs) == keys
        if head == "regression":
            return
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            probabilities, class_ids = session.run(
                [spec.predictions["probabilities"], spec.predictions["class_ids"]]
            )
    assert probabilities.shape == (32, Head(n_classes=params.get("n_classes", 2)).n_classes)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(class_ids, probabilities.argmax(axis=1))


def test_feature_specs_from_params_select_the_features():
    with tf.Graph().as_default():
        features, labels, _ = batch("binary")
        specs = {"petal_width_cm": tf.TensorSpec([None], tf.float32)}
        tabular.dnn_classifier(features, labels, TRAIN, {**SMALL, "feature_specs": specs})
        kernel = next(
            v for v in tf.compat.v1.trainable_variables() if "hiddenlayer_0/kernel" in v.name
        )
        assert kernel.shape.as_list() == [1, 8]


@pytest.mark.slow
def test_estimator_trains_evaluates_predicts_and_exports(tmp_path):
    params = {**SMALL, "dataset": "iris", "n_classes": 3, "batch_size": 16, "shuffle_buffer": 0}

    def input_fn(mode):
        return lambda input_context=None: tabular_input.input_fn(mode, input_context, params)

    estimator = tf.estimator.Estimator(
        tabular.wide_and_deep,
        model_dir=str(tmp_path / "model"),
        params=params,
        config=tf.estimator.RunConfig(tf_random_seed=0, save_summary_steps=1000),
    )
    estimator.train(input_fn(TRAIN), steps=30)
    metrics = estimator.evaluate(input_fn(EVAL))
    assert metrics["global_step"] == 30
    assert metrics["accuracy"] > 0.6
    predictions = list(estimator.predict(input_fn(PREDICT)))
    assert len(predictions) == 30
    # Classify and Regress signatures take serialized tf.Examples, so they
    # exist with a parsing receiver; serving_default predicts from either.
    columns = [
        tf.feature_column.numeric_column(name) for name in tabular_input.load("iris").columns
    ]
    receiver = tf.estimator.export.build_parsing_serving_input_receiver_fn(
        tf.feature_column.make_parse_example_spec(columns)
    )
    exported = estimator.export_saved_model(str(tmp_path / "export"), receiver)
    signatures = tf.saved_model.load(exported).signatures
    assert {"serving_default", "classification", "predict"} <= set(signatures)
    example = tf.train.Example()
    for name, value in zip(tabular_input.load("iris").columns, [0.5, -0.2, 1.0, 1.2]):
        example.features.feature[name].float_list.value.append(value)
    serialized = tf.constant([example.SerializeToString()])
    scores = signatures["classification"](serialized)["scores"]
    np.testing.assert_allclose(scores.numpy().sum(), 1.0, rtol=1e-5)
    probabilities = signatures["serving_default"](serialized)["probabilities"]
    np.testing.assert_allclose(probabilities.numpy(), scores.numpy(), rtol=1e-6)
