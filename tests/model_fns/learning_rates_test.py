"""Epochs as steps, and learning rates decayed by epoch for any model_fn."""

import pytest
import tensorflow as tf

from estimator_dist.base import params as params_lib
from estimator_dist.base.errors import UsageError
from model_fns import learning_rates
from model_fns.learning_rates import epoch_schedule, epochs_to_steps
from model_fns.optimizers import ACCUMULATION_STEPS, learning_rate, with_gradient_accumulation


@pytest.mark.parametrize(
    "epochs, examples, per_step, steps",
    [
        (2, 50_000, 128, 782),  # Model Garden's CIFAR-10 at batch 128: 781.25 -> 782.
        (1, 50_000, 128, 391),
        (1, 640, 64, 10),
        (0.1, 1000, 100, 1),  # 0.1 x 1000 is 100 examples exactly: one step.
        (0.5, 1000, 10, 50),
        (3, 10, 4, 8),
    ],
)
def test_epoch_e_ends_at_the_step_that_reads_its_last_example(epochs, examples, per_step, steps):
    assert epochs_to_steps(epochs, examples, per_step) == steps


def test_decay_epochs_become_boundaries_of_updates():
    params = {"decay_epochs": "1;2", "num_train_examples": 1000, "batch_size": 100}
    schedule = epoch_schedule(0.1, params)
    assert schedule.boundaries == (10, 20)
    assert schedule.values == pytest.approx((0.1, 0.01, 0.001))
    accumulated = epoch_schedule(0.1, {**params, ACCUMULATION_STEPS: 2, "decay_rate": 0.5})
    assert accumulated.boundaries == (5, 10)  # 200 examples an update.
    assert accumulated.values == pytest.approx((0.1, 0.05, 0.025))
    assert epoch_schedule(0.3, {}).describe() == "0.3 at every step"


@pytest.mark.parametrize(
    "params, message",
    [
        (
            {"decay_epochs": "30;60"},
            "decay_epochs='30;60' needs the examples in an epoch: pass --num_train_examples=N",
        ),
        (
            {"decay_epochs": "2;1", "num_train_examples": 100},
            "learning rate boundaries must be increasing steps of at least 1; "
            "decay_epochs='2;1' over num_train_examples=100 at 1 examples a step gives steps "
            "[200, 100]",
        ),
        ({"decay_epochs": "soon", "num_train_examples": 100}, "'soon' is not a number"),
        ({"decay_rate": 1.5}, "decay_rate must be in (0, 1], received 1.5"),
    ],
)
def test_fail_with_a_schedule_that_cannot_be(params, message):
    with pytest.raises(UsageError) as raised:
        epoch_schedule(0.1, params)
    assert message in str(raised.value)


def test_every_model_accepts_the_schedule_keys():
    assert {"decay_epochs", "decay_rate", "num_train_examples"} <= params_lib.SHARED_KEYS


def test_learning_rate_follows_the_epochs_and_is_shown():
    params = {"decay_epochs": "2", "num_train_examples": 640, "batch_size": 64}
    with tf.Graph().as_default() as graph:
        rate = learning_rate(params, 0.1)
        step = tf.compat.v1.train.get_global_step()
        assert learning_rates.tracked(graph) is rate
        summaries = graph.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
        assert [s.op.get_attr("T") for s in summaries] == [tf.float32]
        assert summaries[0].op.inputs[0].op.get_attr("value").string_val == [b"learning_rate"]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            rates = []
            for value in (0, 20, 21, 40):
                session.run(step.assign(value))
                rates.append(session.run(rate))
    assert rates == pytest.approx([0.1, 0.1, 0.01, 0.01])


def test_accumulation_refuses_decay_epochs_a_fixed_rate_would_ignore():
    params = {"decay_epochs": "2", "num_train_examples": 640, "batch_size": 64}
    fixed = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    with tf.Graph().as_default():
        with pytest.raises(UsageError) as raised:
            with_gradient_accumulation(fixed, params)
        assert "built its optimizer with a fixed learning rate, which would not decay" in str(
            raised.value
        )
        assert "model_fns.optimizers.learning_rate(params, base_rate)" in str(raised.value)
    with tf.Graph().as_default():
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(learning_rate(params, 0.1))
        assert with_gradient_accumulation(optimizer, params) is optimizer
    with tf.Graph().as_default():
        assert with_gradient_accumulation(fixed, {"decay_epochs": ""}) is fixed
