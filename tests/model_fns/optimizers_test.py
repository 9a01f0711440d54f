"""Micro-batches: k slices make one update, within one step or accumulated across k steps.

Medium tests train a small Estimator model for real, in one process, without
a strategy and under MirroredStrategy (the cross-replica path that
MultiWorkerMirroredStrategy takes); the 2-worker case runs in
`tests/estimator_dist/equivalence_test.py`.
"""

import numpy as np
import pytest
import tensorflow as tf

from model_fns.optimizers import (
    ACCUMULATION_STEPS,
    COLLECTION,
    MICRO_BATCH_COLLECTION,
    MICRO_BATCHES,
    GradientAccumulationOptimizer,
    minimize_in_micro_batches,
    with_gradient_accumulation,
)

FEATURES = 3


def test_one_step_returns_the_optimizer_itself():
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    assert with_gradient_accumulation(optimizer, {ACCUMULATION_STEPS: 1}) is optimizer
    assert with_gradient_accumulation(optimizer, {}) is optimizer
    wrapped = with_gradient_accumulation(optimizer, {ACCUMULATION_STEPS: 4})
    assert isinstance(wrapped, GradientAccumulationOptimizer) and wrapped.steps == 4


def test_fail_with_a_keras_optimizer():
    with pytest.raises(TypeError, match="tf.compat.v1.train optimizer, received SGD"):
        GradientAccumulationOptimizer(tf.keras.optimizers.legacy.SGD(), 2)


def test_fail_with_steps_below_one():
    with pytest.raises(ValueError, match="at least 1, received 0"):
        GradientAccumulationOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1), 0)


def test_micro_batches_wait_then_apply_their_mean_once_and_start_afresh():
    # loss = w . x, so each micro-batch's gradient is its x.
    micro_batches = np.float32([[1, 0, 0], [0, 3, 0], [0, 0, 6], [9, 9, 9], [3, 0, 0], [0, 0, 3]])
    with tf.Graph().as_default():
        w = tf.Variable(np.zeros(FEATURES, np.float32))
        x = tf.compat.v1.placeholder(tf.float32, [FEATURES])
        step = tf.compat.v1.train.get_or_create_global_step()
        optimizer = GradientAccumulationOptimizer(
            tf.compat.v1.train.GradientDescentOptimizer(1.0), 3
        )
        train_op = optimizer.minimize(tf.reduce_sum(w * x), global_step=step)
        assert len(tf.compat.v1.get_collection(COLLECTION)) == 1
        assert not [v for v in tf.compat.v1.global_variables() if "accumulator" in v.name]
        with tf.compat.v1.Session() as session:
            session.run(
                [
                    tf.compat.v1.global_variables_initializer(),
                    tf.compat.v1.local_variables_initializer(),
                ]
            )
            seen = []
            for batch in micro_batches:
                session.run(train_op, {x: batch})
                seen.append((session.run(step), session.run(w).copy()))
    first = -micro_batches[:3].mean(axis=0)
    second = first - micro_batches[3:].mean(axis=0)
    assert [s for s, _ in seen] == [0, 0, 1, 1, 1, 2]
    for (_, weights), expected in zip(seen, [0, 0, first, first, first, second]):
        np.testing.assert_allclose(weights, expected, rtol=1e-6)


def _input_fn(batch):
    def input_fn(mode, input_context=None):
        index = tf.data.Dataset.range(10**6)
        features = index.map(
            lambda i: {"x": tf.cast(tf.stack([i % 7, i % 5, i % 3]), tf.float32) / 5.0}
        )
        labels = index.map(lambda i: tf.cast(i % 4, tf.float32))
        return tf.data.Dataset.zip((features, labels)).batch(batch)

    return input_fn


def _model_fn(features, labels, mode, params):
    w = tf.compat.v1.get_variable("w", [FEATURES, 1], initializer=tf.zeros_initializer())
    predictions = tf.matmul(features["x"], w)
    loss = tf.reduce_mean(tf.square(predictions[:, 0] - labels))
    optimizer = tf.compat.v1.train.AdamOptimizer(0.05)
    optimizer = with_gradient_accumulation(optimizer, params)
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = optimizer.minimize(loss, global_step=step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _train(model_dir, batch, strategy, model_fn=None, **params):
    config = tf.estimator.RunConfig(
        model_dir=str(model_dir), train_distribute=strategy, save_checkpoints_steps=5
    )
    estimator = tf.estimator.Estimator(model_fn or _model_fn, config=config, params=params)
    estimator.train(_input_fn(batch), max_steps=5)
    return tf.train.load_checkpoint(str(model_dir))


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [None, "mirrored"])
def test_k_micro_batches_equal_one_batch_k_times_larger(tmp_path, strategy):
    def make():
        return tf.distribute.MirroredStrategy(["/cpu:0"]) if strategy else None

    whole = _train(tmp_path / "whole", 12, make(), **{ACCUMULATION_STEPS: 1})
    accumulated = _train(tmp_path / "accumulated", 4, make(), **{ACCUMULATION_STEPS: 3})
    assert accumulated.get_tensor("global_step") == whole.get_tensor("global_step") == 5
    moved = np.abs(whole.get_tensor("w")).max()
    assert moved > 0.1
    # Adam's slots too: its moments saw the same mean gradients.
    names = sorted(accumulated.get_variable_to_shape_map())
    assert names == sorted(whole.get_variable_to_shape_map())
    for name in names:
        if name != "global_step":
            np.testing.assert_allclose(
                accumulated.get_tensor(name), whole.get_tensor(name), atol=1e-6, err_msg=name
            )
    assert not [name for name in names if "accumulator" in name or "micro_batches" in name]


def test_micro_batches_in_a_step_run_one_slice_after_another_and_apply_their_mean():
    # loss = max over examples of x . w: its gradient is the arg-max row of the slice
    # it sees, so slices give the mean of two rows where the whole batch gives one.
    rows = np.float32([[1, 0, 0], [0, 2, 0], [0, 0, 3], [4, 0, 0]])
    seen = []

    def loss_fn(x, unused_labels):
        seen.append(x)
        return tf.reduce_max(tf.linalg.matvec(x, w))

    with tf.Graph().as_default() as graph:
        w = tf.Variable(np.ones(FEATURES, np.float32))
        loss, train_op = minimize_in_micro_batches(
            tf.compat.v1.train.GradientDescentOptimizer(1.0),
            loss_fn,
            tf.constant(rows),
            tf.zeros([4]),
            micro_batches=2,
        )
        assert [x.shape.as_list() for x in seen] == [[2, FEATURES], [2, FEATURES]]
        # The second slice waits for the first slice's gradients.
        assert not seen[0].op.control_inputs
        assert seen[1].op.control_inputs
        assert len(graph.get_collection(MICRO_BATCH_COLLECTION)) == 1
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            loss_value, _ = session.run([loss, train_op])
            weights = session.run(w)
    assert loss_value == pytest.approx((2 + 4) / 2)
    np.testing.assert_allclose(weights, 1 - (rows[1] + rows[3]) / 2)


def test_fail_when_micro_batches_do_not_divide_the_batch():
    with tf.Graph().as_default():
        w = tf.Variable(np.ones(FEATURES, np.float32))
        with pytest.raises(ValueError, match="--micro_batches=4 must divide .* 6 examples"):
            minimize_in_micro_batches(
                tf.compat.v1.train.GradientDescentOptimizer(1.0),
                lambda x, y: tf.reduce_mean(tf.linalg.matvec(x, w) - y),
                tf.zeros([6, FEATURES]),
                tf.zeros([6]),
                micro_batches=4,
            )


def _micro_batch_model_fn(features, labels, mode, params):
    w = tf.compat.v1.get_variable("w", [FEATURES, 1], initializer=tf.zeros_initializer())

    def loss_fn(features, labels):
        return tf.reduce_mean(tf.square(tf.matmul(features["x"], w)[:, 0] - labels))

    optimizer = with_gradient_accumulation(tf.compat.v1.train.AdamOptimizer(0.05), params)
    loss, train_op = minimize_in_micro_batches(
        optimizer,
        loss_fn,
        features,
        labels,
        params[MICRO_BATCHES],
        tf.compat.v1.train.get_or_create_global_step(),
    )
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _train_in_micro_batches(model_dir, batch, micro_batches, accumulation, strategy):
    params = {MICRO_BATCHES: micro_batches, ACCUMULATION_STEPS: accumulation}
    return _train(model_dir, batch, strategy, _micro_batch_model_fn, **params)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", [None, "mirrored"])
def test_micro_batches_and_accumulation_equal_one_whole_batch(tmp_path, strategy):
    def make():
        return tf.distribute.MirroredStrategy(["/cpu:0"]) if strategy else None

    whole = _train_in_micro_batches(tmp_path / "whole", 12, 1, 1, make())
    sliced = _train_in_micro_batches(tmp_path / "sliced", 12, 3, 1, make())
    # Both: 2 steps of 6 examples, each step in 2 slices of 3.
    both = _train_in_micro_batches(tmp_path / "both", 6, 2, 2, make())
    assert np.abs(whole.get_tensor("w")).max() > 0.1
    for other in (sliced, both):
        assert other.get_tensor("global_step") == 5
        for name in whole.get_variable_to_shape_map():
            np.testing.assert_allclose(
                other.get_tensor(name), whole.get_tensor(name), atol=1e-6, err_msg=name
            )


def test_float16_scales_the_loss_on_gpus_that_compute_in_it(monkeypatch):
    """No GPU here: GPUs are given, and the optimizer is wrapped as TensorFlow's rewrite does."""
    from estimator_dist.hardware import precision

    monkeypatch.setattr(precision, "gpu_capabilities", lambda num_gpus=None: ((8, 0),))
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    for requested in ("float16", "auto"):
        wrapped = with_gradient_accumulation(optimizer, {"mixed_precision": requested})
        assert type(wrapped).__name__ == "MixedPrecisionLossScaleOptimizer"
        assert wrapped._optimizer is optimizer
        assert type(wrapped._loss_scale).__name__ == "DynamicLossScale"
    assert with_gradient_accumulation(optimizer, {"mixed_precision": "off"}) is optimizer


def test_float16_without_a_gpu_is_refused():
    from estimator_dist.base.errors import UsageError

    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    with pytest.raises(UsageError, match="--mixed_precision=float16 needs GPUs"):
        with_gradient_accumulation(optimizer, {"mixed_precision": "float16"})
