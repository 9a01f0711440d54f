"""ResNet for CIFAR: parameters, learning rate schedule, network size, specs, one real run."""

import numpy as np
import pytest
import tensorflow as tf

import input_fns  # noqa: F401  (registers the input keys, such as data_dir, every model accepts)
from estimator_dist.base.errors import UsageError
from estimator_dist.base.params import from_params
from model_fns import MODEL_FNS, resnet_cifar
from model_fns.resnet_cifar_network import ResnetCifar, count_parameters
from model_fns.resnet_cifar_params import ResnetParams, learning_rate_tensor
from tests.procs import run_module

TRAIN = tf.estimator.ModeKeys.TRAIN
EVAL = tf.estimator.ModeKeys.EVAL
PREDICT = tf.estimator.ModeKeys.PREDICT
#: What the driver passes besides `--params`.
DRIVER = {"batch_size": 4, "learning_rate": 0.001, "data_dir": "/unused", "seed": 0}


# --- ResnetParams -------------------------------------------------------------


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"depth": 21},
            "depth must be 6n + 2 with n >= 1 (8, 14, 20, 32, 56, 110, ...), received 21",
        ),
        (
            {"depth": 2},
            "depth must be 6n + 2 with n >= 1 (8, 14, 20, 32, 56, 110, ...), received 2",
        ),
        ({"num_classes": 0}, "num_classes must be at least 1, received 0"),
        ({"batch_size": 0}, "batch_size must be at least 1, received 0"),
        ({"num_train_examples": 0}, "num_train_examples must be at least 1, received 0"),
        ({"base_learning_rate": 0.0}, "base_learning_rate must be positive, received 0.0"),
        ({"momentum": 1.0}, "momentum must be in [0, 1), received 1.0"),
        ({"weight_decay": -1e-4}, "weight_decay must be 0 or more, received -0.0001"),
        ({"decay_rate": 0.0}, "decay_rate must be in (0, 1], received 0.0"),
        ({"batch_norm": "global"}, "batch_norm 'global' is unknown; valid: local, sync"),
        ({"dtype": "float16"}, "dtype 'float16' is unknown; valid: float32, float64"),
        ({"virtual_batch_size": 0}, "virtual_batch_size must be at least 1, received 0"),
        (
            {"virtual_batch_size": 16, "batch_size": 32, "batch_norm": "sync"},
            "virtual_batch_size works with batch_norm=local only; received "
            "virtual_batch_size=16 with batch_norm=sync",
        ),
        (
            {"virtual_batch_size": 12, "batch_size": 32},
            "virtual_batch_size must divide the per-replica batch; received "
            "virtual_batch_size=12, which does not even divide the global batch_size=32",
        ),
        (
            {"decay_epochs": "10", "decay_steps": "100"},
            "give decay_epochs or decay_steps, not both; received decay_epochs='10' and "
            "decay_steps='100'",
        ),
        (
            {"decay_epochs": "91;soon"},
            "decay_epochs must be numbers separated by ';' (such as 91;136;182), received "
            "'91;soon': 'soon' is not a number",
        ),
        ({"decay_steps": "10.5"}, "decay_steps must be whole steps, received '10.5'"),
        (
            {"decay_steps": "200;100"},
            "learning rate boundaries must be increasing steps of at least 1; "
            "decay_steps='200;100' gives steps [200, 100]",
        ),
        (
            {"decay_epochs": "0;1", "batch_size": 128},
            "learning rate boundaries must be increasing steps of at least 1; "
            "decay_epochs='0;1' over num_train_examples=50000 at 128 examples an update "
            "gives steps [0, 391]",
        ),
    ],
)
def test_fail_with_invalid_resnet_params(values, message):
    with pytest.raises(ValueError) as raised:
        ResnetParams(**values)
    assert message in str(raised.value)
    with pytest.raises(UsageError) as raised:
        from_params(ResnetParams, values, "resnet_cifar")
    assert str(raised.value) == f"Invalid parameters for resnet_cifar: {message}."


@pytest.mark.parametrize("depth, blocks", [(8, 1), (20, 3), (32, 5), (56, 9), (110, 18)])
def test_depth_is_6n_plus_2(depth, blocks):
    assert ResnetParams(depth=depth).blocks_per_stage == blocks


def test_fail_with_unknown_param_key_but_not_with_the_drivers_learning_rate():
    with tf.Graph().as_default():
        resnet_cifar.model_fn(images(), None, PREDICT, {**DRIVER, "depth": 8})
        with pytest.raises(UsageError) as raised:
            resnet_cifar.model_fn(images(), None, PREDICT, {**DRIVER, "dept": 8})
    assert "Unknown parameter(s) dept for resnet_cifar" in str(raised.value)


# --- Learning rate ------------------------------------------------------------


@pytest.mark.parametrize(
    "batch_size, base, initial",
    [(128, 0.1, 0.1), (256, 0.1, 0.2), (32, 0.1, 0.025), (64, 0.4, 0.2)],
)
def test_learning_rate_scales_linearly_with_the_global_batch(batch_size, base, initial):
    schedule = ResnetParams(batch_size=batch_size, base_learning_rate=base).schedule()
    assert schedule.values[0] == pytest.approx(initial)
    assert schedule.rate_at(0) == pytest.approx(initial)


def test_default_schedule_is_model_gardens_epochs_91_136_182():
    schedule = ResnetParams(batch_size=128).schedule()
    # Epoch e ends at step ceil(e x 50000 / 128), the package's one rule for epochs.
    assert schedule.boundaries == (35547, 53125, 71094)
    assert schedule.boundaries == tuple(-(-e * 50000 // 128) for e in (91, 136, 182))
    assert schedule.values == pytest.approx((0.1, 0.01, 0.001, 0.0001))
    assert schedule.rate_at(35547) == pytest.approx(0.1)
    assert schedule.rate_at(35548) == pytest.approx(0.01)
    assert schedule.rate_at(53126) == pytest.approx(0.001)
    assert schedule.rate_at(10**6) == pytest.approx(0.0001)
    # A larger global batch has fewer steps an epoch: the same epochs.
    assert ResnetParams(batch_size=1024).schedule().boundaries == (4444, 6641, 8887)


def test_accumulated_micro_batches_schedule_like_a_larger_batch():
    # 128 x 8 micro-batches make updates of 1024 examples: the schedule of batch 1024.
    accumulated = ResnetParams(batch_size=128, gradient_accumulation_steps=8).schedule()
    larger = ResnetParams(batch_size=1024).schedule()
    assert accumulated == larger
    assert accumulated.rate_at(0) == pytest.approx(0.8)


@pytest.mark.parametrize(
    "values, boundaries",
    [
        ({"decay_steps": "100;250"}, (100, 250)),
        ({"decay_steps": 100}, (100,)),
        ({"decay_epochs": [1, 2.5], "num_train_examples": 1000, "batch_size": 100}, (10, 25)),
        ({"decay_epochs": ""}, ()),
    ],
)
def test_schedule_boundaries_from_steps_or_epochs(values, boundaries):
    schedule = ResnetParams(**values).schedule()
    assert schedule.boundaries == boundaries
    assert len(schedule.values) == len(boundaries) + 1
    if not boundaries:
        assert schedule.describe() == "0.1 at every step"


def test_learning_rate_tensor_follows_the_schedule():
    schedule = ResnetParams(decay_steps="3;6", decay_rate=0.5, batch_size=256).schedule()
    with tf.Graph().as_default():
        step = tf.compat.v1.placeholder(tf.int64, [])
        rate = learning_rate_tensor(schedule, step)
        with tf.compat.v1.Session() as session:
            rates = [session.run(rate, {step: value}) for value in range(9)]
    assert rates == pytest.approx([schedule.rate_at(value) for value in range(9)])
    assert rates == pytest.approx([0.2] * 4 + [0.1] * 3 + [0.05] * 2)


# --- Network ------------------------------------------------------------------


def images(batch=4, size=32):
    return {"image": tf.random.stateless_uniform([batch, size, size, 3], seed=[1, 2])}


def labels(batch=4):
    return tf.range(batch, dtype=tf.int32) % 10


def trainable_count(depth):
    with tf.Graph().as_default():
        resnet_cifar.model_fn(images(), None, PREDICT, {"depth": depth})
        return sum(int(np.prod(v.shape)) for v in tf.compat.v1.trainable_variables())


def test_resnet20_has_0_27m_parameters_and_deeper_ones_grow_by_whole_blocks():
    # Each extra block in each stage: two 3x3 convolutions and two batch norms
    # of 16, 32 and 64 channels.
    per_block_each_stage = sum(2 * 9 * c * c + 4 * c for c in (16, 32, 64))
    assert per_block_each_stage == 97_216
    resnet8, resnet20 = trainable_count(8), trainable_count(20)
    assert resnet20 == 272_762
    assert resnet20 == resnet8 + 2 * per_block_each_stage
    assert count_parameters(8) == resnet8
    assert count_parameters(20) == resnet20
    assert count_parameters(32) == resnet20 + 2 * per_block_each_stage == 467_194
    assert count_parameters(56) == resnet20 + 6 * per_block_each_stage == 856_058


@pytest.mark.parametrize("depth, convolutions", [(8, 1 + 3 * 2 + 3), (20, 1 + 9 * 2 + 3)])
def test_weight_decay_covers_every_convolution_and_the_dense_layer_but_not_batch_norm(
    depth, convolutions
):
    with tf.Graph().as_default():
        network = ResnetCifar(ResnetParams(depth=depth))
        network(tf.zeros([2, 32, 32, 3]), training=True)
        decayed = network.weight_decay_variables()
        kernels = [v for v in network.trainable_variables if len(v.shape) == 4]
    # The stem, two per block, one shortcut per stage; then the dense kernel and bias.
    assert len(kernels) == convolutions
    assert {v.name for v in decayed} == {v.name for v in kernels} | {
        "resnet_cifar/dense/kernel:0",
        "resnet_cifar/dense/bias:0",
    }
    assert not [v for v in decayed if "/bn" in v.name or "_bn_" in v.name]


def test_model_fn_is_registered():
    assert MODEL_FNS.get("resnet_cifar") is resnet_cifar.model_fn


def test_predict_spec():
    with tf.Graph().as_default():
        spec = resnet_cifar.model_fn(images(), None, PREDICT, {**DRIVER, "depth": 8})
        assert set(spec.predictions) == {"class_ids", "probabilities", "logits"}
        assert spec.predictions["logits"].shape.as_list() == [4, 10]
        output = spec.export_outputs["serving_default"]
        assert isinstance(output, tf.estimator.export.PredictOutput)
        assert set(output.outputs) == {"class_ids", "probabilities", "logits"}
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            probabilities = session.run(spec.predictions["probabilities"])
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("num_classes, metrics", [(10, {"accuracy_top_5"}), (5, set())])
def test_eval_spec(num_classes, metrics):
    params = {**DRIVER, "depth": 8, "num_classes": num_classes}
    with tf.Graph().as_default():
        spec = resnet_cifar.model_fn(images(), labels() % num_classes, EVAL, params)
    assert set(spec.eval_metric_ops) == {"accuracy", "cross_entropy"} | metrics
    assert spec.loss.dtype == tf.float32


def bn_variables(name):
    return [v for v in tf.compat.v1.global_variables() if name in v.name]


@pytest.mark.slow
@pytest.mark.parametrize(
    "extra",
    [{}, {"batch_norm": "sync"}, {"virtual_batch_size": 2, "dtype": "float64"}],
    ids=["local", "sync", "ghost-float64"],
)
def test_train_step_updates_weights_and_batch_norm_moving_statistics(extra):
    params = {**DRIVER, "depth": 8, **extra}
    with tf.Graph().as_default():
        spec = resnet_cifar.model_fn(images(), labels(), TRAIN, params)
        # Keras layers in graph mode do not use UPDATE_OPS: the train_op must run them.
        assert not tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        watched = bn_variables("moving_mean") + bn_variables("moving_variance")
        watched += bn_variables("conv1/kernel:")
        assert len(watched) == 2 * 10 + 1
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            before = session.run(watched)
            session.run(spec.train_op)
            after, step = session.run([watched, tf.compat.v1.train.get_global_step()])
    assert step == 1
    unchanged = [v.name for v, a, b in zip(watched, after, before) if np.array_equal(a, b)]
    assert not unchanged


def initial_kernels(seed):
    with tf.Graph().as_default():
        resnet_cifar.model_fn(images(), None, PREDICT, {"depth": 8, "seed": seed})
        kernels = [v for v in tf.compat.v1.trainable_variables() if "kernel" in v.name]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            return session.run(kernels)


def test_seeded_initialisers_are_reproducible_and_distinct_per_layer():
    first, again, other = initial_kernels(3), initial_kernels(3), initial_kernels(4)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not np.array_equal(first[0], other[0])
    # Equally shaped layers get different weights (each has its own seed).
    same_shape = [k for k in first if k.shape == (3, 3, 16, 16)]
    assert len(same_shape) == 2 and not np.allclose(same_shape[0], same_shape[1])


def test_ghost_batch_norm_groups_examples_like_interleaved_replicas():
    """virtual_batch_size=B/N normalises examples i, i+N, i+2N, ... together.

    That is the set replica i sees when example-sharded data is read in
    order, which is why one worker with virtual_batch_size=B/2 can equal two
    workers with local batch norm.
    """
    with tf.Graph().as_default():
        inputs = tf.random.stateless_normal([8, 4, 4, 16], seed=[5, 6]) * 3.0 + 1.0
        inputs += tf.reshape(tf.range(8, dtype=tf.float32), [8, 1, 1, 1])
        ghost = ResnetCifar(ResnetParams(virtual_batch_size=4, batch_size=8))
        plain = ResnetCifar(ResnetParams(batch_size=8))
        grouped = ghost.stem_bn(inputs, training=True)
        parts = [plain.stem_bn(inputs[i::2], training=True) for i in range(2)]
        halves = plain.stem_bn(inputs[:4], training=True)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            grouped, parts, halves = session.run([grouped, parts, halves])
    np.testing.assert_allclose(grouped[0::2], parts[0], atol=1e-5)
    np.testing.assert_allclose(grouped[1::2], parts[1], atol=1e-5)
    assert np.abs(grouped[:4] - halves).max() > 0.1


# --- A real run ---------------------------------------------------------------


def checkpoint(model_dir, step):
    reader = tf.train.load_checkpoint(f"{model_dir}/model.ckpt-{step}")
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


@pytest.mark.multiprocess
def test_train_writes_checkpoint_and_eval_metrics_and_moves_batch_norm_statistics(tmp_path):
    model_dir = str(tmp_path / "resnet")
    run = run_module(
        "estimator_dist.train",
        [
            f"--model_dir={model_dir}",
            "--model_fn=resnet_cifar",
            "--input_fn=synthetic",
            "--params=image_shape=32x32x3,num_examples=32,depth=8,weight_decay=0.0005",
            "--batch_size=8",
            "--train_steps=3",
            "--save_checkpoints_steps=3",
            "--eval_steps=1",
        ],
        timeout=180,
        model_dir=model_dir,
    )
    record = run.json("eval_metrics.json")
    assert record["final"] is True
    assert record["metrics"]["global_step"] == 3
    assert 0.0 <= record["metrics"]["accuracy"] <= 1.0
    assert {"accuracy_top_5", "cross_entropy", "loss"} <= set(record["metrics"])
    # The loss includes the weight decay.
    assert record["metrics"]["loss"] > record["metrics"]["cross_entropy"]
    start, end = checkpoint(model_dir, 0), checkpoint(model_dir, 3)
    moving = [name for name in end if name.endswith(("moving_mean", "moving_variance"))]
    assert len(moving) == 2 * 10
    still = [name for name in moving if np.array_equal(start[name], end[name])]
    assert not still, f"batch norm statistics did not move: {still}"
