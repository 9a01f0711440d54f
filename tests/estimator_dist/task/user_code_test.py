"""Calling user code as tf.estimator does: signatures, binding, return shapes, endless input."""

import functools
import inspect

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.util import function_utils

from estimator_dist.base.errors import UsageError
from estimator_dist.task import user_code

EVAL = tf.estimator.ModeKeys.EVAL
TRAIN = tf.estimator.ModeKeys.TRAIN


def _dataset():
    return tf.data.Dataset.from_tensor_slices(({"x": tf.ones([4, 2])}, tf.zeros([4]))).batch(2)


# --- input_fn signatures --------------------------------------------------------


def premade_input_fn(features, labels, training=True, batch_size=256):
    return _dataset()


def test_fail_with_input_fn_arguments_estimator_cannot_supply():
    with pytest.raises(UsageError) as raised:
        user_code.check_input_fn_args(premade_input_fn, "iris:premade_input_fn", "--input_fn")
    message = str(raised.value)
    assert "--input_fn=iris:premade_input_fn takes features, labels" in message
    assert "premade_input_fn(features, labels, training=True, batch_size=256)" in message
    assert "functools.partial(premade_input_fn, features=..., labels=...)" in message
    assert "--input_fn=iris:premade_input_fn_bound" in message


@pytest.mark.parametrize(
    "input_fn",
    [
        lambda: None,
        lambda mode: None,
        lambda mode, params, config, input_context: None,
        functools.partial(premade_input_fn, "f", "l"),
        functools.partial(premade_input_fn, features="f", labels="l", training=False),
        lambda *args, **kwargs: None,
    ],
)
def test_input_fns_estimator_can_call_pass(input_fn):
    user_code.check_input_fn_args(input_fn, "m:f", "--input_fn")


# --- model_fn signatures --------------------------------------------------------


class _Model:
    def model_fn(self, features, labels, mode):
        return None

    def __call__(self, features, labels, mode, config):
        return None


@pytest.mark.parametrize(
    "model_fn, takes_params",
    [
        (lambda features, labels, mode: None, False),
        (lambda features, labels, mode, params: None, True),
        (lambda features, labels, mode, config: None, False),
        (lambda features: None, False),
        (_Model().model_fn, False),
        (_Model(), False),
        (functools.partial(lambda features, labels, mode, params, depth: None, depth=2), True),
    ],
)
def test_model_fns_estimator_can_call_pass(model_fn, takes_params):
    user_code.check_model_fn_args(model_fn, "m:f")
    assert user_code.takes_params(model_fn) is takes_params


def test_fail_with_a_model_fn_argument_estimator_never_passes():
    def model_fn(features, labels, mode, hidden_units):
        return None

    with pytest.raises(UsageError) as raised:
        user_code.check_model_fn_args(model_fn, "my.models:model_fn")
    message = str(raised.value)
    assert (
        "--model_fn=my.models:model_fn takes hidden_units, which Estimator never passes" in message
    )
    assert "functools.partial(model_fn, hidden_units=...)" in message


def test_fail_with_a_model_fn_without_features():
    with pytest.raises(UsageError, match="has no `features` argument"):
        user_code.check_model_fn_args(lambda inputs, mode: None, "m:f")


# --- what Estimator is handed ----------------------------------------------------


def test_call_input_fn_passes_only_what_the_function_declares():
    seen = {}

    def input_fn(mode, config, params):
        seen.update(mode=mode, config=config, params=params)
        return _dataset()

    config = tf.estimator.RunConfig(model_dir="/tmp/x")
    presented = user_code.present_input_fn(input_fn, {"batch_size": 2})
    user_code.call_input_fn(presented, TRAIN, config=config)
    assert seen == {"mode": TRAIN, "config": config, "params": {"batch_size": 2}}
    assert presented.user_fn is input_fn
    assert not user_code.takes_input_context(presented)


def test_call_input_fn_gives_a_default_config_when_none_is_given():
    configs = []
    user_code.call_input_fn(lambda config: configs.append(config) or _dataset(), EVAL)
    assert isinstance(configs[0], tf.estimator.RunConfig)


def test_call_input_fn_passes_input_context_to_a_function_that_shards():
    contexts = []

    def input_fn(input_context=None):
        contexts.append(input_context)
        return _dataset()

    context = tf.distribute.InputContext(2, 1, 2)
    presented = user_code.present_input_fn(input_fn)
    user_code.call_input_fn(presented, TRAIN, input_context=context)
    assert contexts == [context]
    assert user_code.takes_input_context(presented)


def test_a_presented_input_fn_declares_what_the_users_declares():
    # TPUEstimator refuses an input_fn without `params`; Estimator passes only
    # what an input_fn declares: the function handed to them must read the same.
    def input_fn(params, mode=None):
        return _dataset()

    presented = user_code.present_input_fn(input_fn)
    assert function_utils.fn_args(presented) == ("params", "mode")
    assert inspect.signature(presented) == inspect.signature(input_fn)
    assert presented.__name__ == "input_fn"


def test_a_presented_input_fn_with_bound_params_declares_the_rest():
    def input_fn(mode, params):
        return params["batch_size"]

    presented = user_code.present_input_fn(input_fn, {"batch_size": 3})
    assert function_utils.fn_args(presented) == ("mode",)
    assert user_code.call_input_fn(presented, TRAIN, params={"batch_size": 9}) == 3


def test_tpu_estimator_trains_on_a_presented_input_fn(tmp_path):
    # The wrapper is called with TPUEstimator's params (its batch_size), as the
    # user's input_fn would be.
    batches = []

    def input_fn(params):
        batches.append(params["batch_size"])
        examples = ({"x": tf.ones([8, 2])}, tf.zeros([8]))
        dataset = tf.data.Dataset.from_tensor_slices(examples).repeat()
        return dataset.batch(params["batch_size"], drop_remainder=True)

    def model_fn(features, labels, mode, params):
        prediction = tf.compat.v1.layers.dense(features["x"], 1)
        loss = tf.compat.v1.losses.mean_squared_error(labels[:, None], prediction)
        step = tf.compat.v1.train.get_global_step()
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, step)
        return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

    config = tf.compat.v1.estimator.tpu.RunConfig(model_dir=str(tmp_path))
    estimator = tf.compat.v1.estimator.tpu.TPUEstimator(
        model_fn, config=config, use_tpu=False, train_batch_size=4
    )
    with tf.Graph().as_default():
        estimator.train(user_code.present_input_fn(input_fn), max_steps=2)
    assert batches == [4]
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("-2")


def _tensors():
    features, labels = tf.compat.v1.data.make_one_shot_iterator(_dataset().repeat()).get_next()
    return features, labels


def test_tensors_are_returned_as_they_are_without_a_strategy():
    with tf.Graph().as_default():
        result = user_code.call_input_fn(user_code.present_input_fn(_tensors), TRAIN)
        assert isinstance(result, tuple) and isinstance(result[0]["x"], tf.Tensor)


def test_tensors_become_a_per_device_callable_under_a_strategy():
    calls = []

    def input_fn():
        calls.append(1)
        return _tensors()

    with tf.Graph().as_default(), tf.distribute.MirroredStrategy(["/cpu:0"]).scope():
        result = user_code.call_input_fn(user_code.present_input_fn(input_fn), TRAIN)
        assert callable(result) and len(calls) == 1
        first, second = result(), result()
    assert len(calls) == 2, "the second device must get batches of its own"
    assert first[0]["x"] is not second[0]["x"]


def test_a_tensor_input_fn_trains_under_a_strategy(tmp_path):
    # numpy_input_fn's queues, fed through the strategy's input iterator.
    x = np.arange(40, dtype=np.float32).reshape(20, 2) / 40
    input_fn = tf.compat.v1.estimator.inputs.numpy_input_fn(
        {"x": x}, x.sum(1), batch_size=5, num_epochs=None, shuffle=False
    )

    def model_fn(features, labels, mode):
        prediction = tf.squeeze(tf.compat.v1.layers.dense(features["x"], 1), 1)
        loss = tf.compat.v1.losses.mean_squared_error(labels, prediction)
        step = tf.compat.v1.train.get_global_step()
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, step)
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)

    config = tf.estimator.RunConfig(
        model_dir=str(tmp_path), train_distribute=tf.distribute.MirroredStrategy(["/cpu:0"])
    )
    with tf.Graph().as_default():
        estimator = tf.estimator.Estimator(model_fn, config=config)
        estimator.train(user_code.present_input_fn(input_fn), max_steps=3)
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("-3")


# --- endless evaluation input -----------------------------------------------------


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda: _dataset(), False),
        (lambda: _dataset().repeat(), True),
        (lambda: _dataset().repeat().filter(lambda features, labels: True), None),
        (_tensors, None),
    ],
)
def test_repeats_forever_reads_the_dataset_cardinality(make, expected):
    with tf.Graph().as_default():
        assert user_code.repeats_forever(make, make()) is expected


@pytest.mark.parametrize("epochs, expected", [(None, True), (1, False)])
def test_repeats_forever_reads_numpy_input_fn_epochs(epochs, expected):
    input_fn = tf.compat.v1.estimator.inputs.numpy_input_fn(
        {"x": np.zeros([4, 1])}, np.zeros(4), num_epochs=epochs, shuffle=False
    )
    bound = user_code.present_input_fn(input_fn)
    assert user_code.numpy_input_epochs(bound) == (True, epochs)
    assert user_code.repeats_forever(bound, None) is expected
    assert user_code.numpy_input_epochs(_tensors) == (False, None)
