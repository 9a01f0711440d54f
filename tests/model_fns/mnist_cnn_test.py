"""The tutorial CNN: parameters, Estimator model_fn specs, and the Keras build."""

import numpy as np
import pytest
import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.base.params import from_params
from model_fns import KERAS_MODELS, MODEL_FNS, keras_cnn, mnist_cnn
from model_fns.mnist_cnn import CnnParams

TRAIN = tf.estimator.ModeKeys.TRAIN
EVAL = tf.estimator.ModeKeys.EVAL
PREDICT = tf.estimator.ModeKeys.PREDICT
PARAMS = {"learning_rate": 0.01, "batch_size": 4, "data_dir": "/unused", "seed": 0}


# --- CnnParams ----------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("learning_rate", 0.0, "learning_rate must be positive, received 0.0"),
        ("learning_rate", -0.1, "learning_rate must be positive, received -0.1"),
        ("optimizer", "rmsprop", "optimizer 'rmsprop' is unknown; valid: adam, sgd, momentum"),
        ("filters", 0, "filters must be at least 1, received 0"),
        ("dense_units", 0, "dense_units must be at least 1, received 0"),
        ("num_classes", -1, "num_classes must be at least 1, received -1"),
    ],
)
def test_fail_with_invalid_cnn_params(field, value, message):
    with pytest.raises(ValueError) as raised:
        CnnParams(**{field: value})
    assert message in str(raised.value)
    with pytest.raises(UsageError) as raised:
        from_params(CnnParams, {field: value}, "mnist_cnn")
    assert str(raised.value) == f"Invalid parameters for mnist_cnn: {message}."


@pytest.mark.parametrize("optimizer", mnist_cnn.OPTIMIZERS)
def test_cnn_params_accept_every_optimizer(optimizer):
    assert CnnParams(optimizer=optimizer).optimizer == optimizer


@pytest.mark.parametrize(
    "name, expected",
    [
        ("adam", tf.compat.v1.train.AdamOptimizer),
        ("sgd", tf.compat.v1.train.GradientDescentOptimizer),
        ("momentum", tf.compat.v1.train.MomentumOptimizer),
    ],
)
def test_make_optimizer(name, expected):
    with tf.Graph().as_default():
        optimizer = mnist_cnn.make_optimizer(name, 0.5)
    assert type(optimizer) is expected
    # AdamOptimizer keeps its step size as `_lr`, the others as `_learning_rate`.
    step_size = optimizer._lr if name == "adam" else optimizer._learning_rate
    assert step_size == 0.5
    if name == "momentum":
        assert optimizer._momentum == 0.9


# --- model_fn -----------------------------------------------------------------


def features(batch=4):
    return {"image": tf.zeros([batch, 8, 8, 1])}


def labels(batch=4):
    return tf.zeros([batch], tf.int32)


def test_model_fn_is_registered():
    assert MODEL_FNS.get("mnist_cnn") is mnist_cnn.model_fn
    assert KERAS_MODELS.get("mnist_cnn") is keras_cnn.build_mnist_cnn


def test_predict_spec():
    with tf.Graph().as_default():
        spec = mnist_cnn.model_fn(features(), None, PREDICT, PARAMS)
        assert spec.mode == PREDICT
        assert set(spec.predictions) == {"class_ids", "probabilities", "logits"}
        assert spec.predictions["logits"].shape.as_list() == [4, 10]
        assert spec.predictions["probabilities"].shape.as_list() == [4, 10]
        assert spec.predictions["class_ids"].shape.as_list() == [4]
        assert set(spec.export_outputs) == {"serving_default"}
        output = spec.export_outputs["serving_default"]
        assert isinstance(output, tf.estimator.export.PredictOutput)
        assert set(output.outputs) == {"class_ids", "probabilities", "logits"}
        assert spec.train_op is None
        assert spec.loss is None


def test_predict_accepts_a_bare_image_tensor():
    with tf.Graph().as_default():
        spec = mnist_cnn.model_fn(tf.zeros([3, 28, 28, 1]), None, PREDICT, {"num_classes": 5})
        assert spec.predictions["logits"].shape.as_list() == [3, 5]


def test_predict_probabilities_sum_to_one():
    with tf.Graph().as_default():
        images = tf.random.stateless_uniform([4, 8, 8, 1], seed=[1, 2])
        spec = mnist_cnn.model_fn({"image": images}, None, PREDICT, PARAMS)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            probabilities, class_ids, logits = session.run(
                [
                    spec.predictions["probabilities"],
                    spec.predictions["class_ids"],
                    spec.predictions["logits"],
                ]
            )
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    np.testing.assert_array_equal(class_ids, logits.argmax(axis=1))


def test_eval_spec():
    with tf.Graph().as_default():
        spec = mnist_cnn.model_fn(features(), labels(), EVAL, PARAMS)
        assert spec.mode == EVAL
        assert set(spec.eval_metric_ops) == {"accuracy"}
        assert spec.loss.shape.as_list() == []
        assert spec.train_op is None


def test_train_spec():
    with tf.Graph().as_default():
        spec = mnist_cnn.model_fn(features(), labels(), TRAIN, PARAMS)
        assert spec.mode == TRAIN
        assert spec.train_op is not None
        assert spec.loss.shape.as_list() == []
        assert spec.loss.dtype == tf.float32
        assert tf.compat.v1.train.get_global_step() is not None


@pytest.mark.parametrize("optimizer", mnist_cnn.OPTIMIZERS)
def test_train_op_updates_weights_and_global_step(optimizer):
    with tf.Graph().as_default():
        images = tf.random.stateless_uniform([4, 8, 8, 1], seed=[3, 4])
        targets = tf.constant([1, 2, 3, 4], tf.int32)
        params = {"learning_rate": 0.1, "optimizer": optimizer}
        spec = mnist_cnn.model_fn({"image": images}, targets, TRAIN, params)
        kernel = next(v for v in tf.compat.v1.trainable_variables() if "dense_1/kernel" in v.name)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            before = session.run(kernel)
            session.run(spec.train_op)
            after, step = session.run([kernel, tf.compat.v1.train.get_global_step()])
    assert step == 1
    assert not np.allclose(before, after)


def test_fail_with_unknown_param_key():
    with tf.Graph().as_default():
        with pytest.raises(UsageError) as raised:
            mnist_cnn.model_fn(features(), labels(), TRAIN, {"learning_rte": 0.1})
    message = str(raised.value)
    assert "Unknown parameter(s) learning_rte for mnist_cnn" in message
    assert "learning_rate" in message


def initial_weights(params):
    with tf.Graph().as_default():
        mnist_cnn.model_fn(features(), labels(), TRAIN, params)
        kernels = [v for v in tf.compat.v1.trainable_variables() if "kernel" in v.name]
        assert len(kernels) == 3
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return session.run(kernels)


def test_seeded_initialisers_give_equal_initial_weights():
    first = initial_weights({"seed": 7})
    second = initial_weights({"seed": 7})
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    # Not all zeros or constant: a real random initialisation.
    assert all(np.std(kernel) > 0 for kernel in first)


def test_different_seeds_give_different_initial_weights():
    first = initial_weights({"seed": 7})
    other = initial_weights({"seed": 8})
    assert not np.array_equal(first[0], other[0])


def test_layers_use_distinct_seed_offsets():
    params = CnnParams(seed=5)
    layers = mnist_cnn.build_layers(params).layers
    seeds = [
        layer.kernel_initializer.seed for layer in layers if hasattr(layer, "kernel_initializer")
    ]
    # Every layer is seeded from `seed`, each differently (equal seeds would
    # correlate the initial weights of equally shaped layers).
    assert None not in seeds
    assert seeds[0] == 5
    assert len(set(seeds)) == 3
    unseeded = mnist_cnn.build_layers(CnnParams(seed=None)).layers
    assert all(
        layer.kernel_initializer.seed is None
        for layer in unseeded
        if hasattr(layer, "kernel_initializer")
    )


# --- Keras model --------------------------------------------------------------


@pytest.mark.parametrize(
    "optimizer, expected",
    [("adam", tf.keras.optimizers.legacy.Adam), ("sgd", tf.keras.optimizers.legacy.SGD)],
)
def test_build_keras_model(optimizer, expected):
    model = keras_cnn.build_mnist_cnn(
        {"feature_shapes": {"image": [8, 8, 1]}, "optimizer": optimizer, "learning_rate": 0.02}
    )
    assert isinstance(model, tf.keras.Model)
    assert model.optimizer is not None
    assert isinstance(model.optimizer, expected)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.02)
    assert model.input_names == ["image"]
    assert model.input_shape == (None, 8, 8, 1)
    assert model.output_shape == (None, 10)
    assert model.loss is not None


def test_build_keras_model_defaults_to_mnist_shape():
    model = keras_cnn.build_mnist_cnn({})
    assert model.input_shape == (None, 28, 28, 1)


def test_build_keras_model_ignores_input_keys():
    model = keras_cnn.build_mnist_cnn(
        {"feature_shapes": {"image": [8, 8, 1]}, "batch_size": 32, "data_dir": "/d"}
    )
    assert model.input_names == ["image"]


def test_fail_with_momentum_for_keras_model():
    with pytest.raises(UsageError) as raised:
        keras_cnn.build_mnist_cnn({"feature_shapes": {"image": [8, 8, 1]}, "optimizer": "momentum"})
    message = str(raised.value)
    assert "optimizer 'momentum' is not available for the Keras model" in message
    assert "adam or sgd" in message


def test_fail_with_unknown_keras_param():
    with pytest.raises(UsageError, match="Unknown parameter\\(s\\) depth for keras mnist_cnn"):
        keras_cnn.build_mnist_cnn({"depth": 3})
