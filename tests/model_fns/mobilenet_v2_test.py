"""`--keras_model=mobilenet_v2`: parameters, classes from TFDS metadata, the bridge, 2 workers."""

import math
import os
import re

import pytest
import tensorflow as tf

import input_fns  # noqa: F401  (registers the input keys every model accepts)
from estimator_dist.base.errors import UsageError
from estimator_dist.task import pitfalls
from model_fns import KERAS_MODELS, mobilenet_v2
from model_fns.mobilenet_v2 import MobileNetParams, build_mobilenet_v2
from tests.input_fns.fake_images import prepare_mock_images
from tests.procs import run_module

SMALL = {"alpha": 0.35, "num_classes": 3, "feature_shapes": {"image": [32, 32, 3]}}


@pytest.fixture(scope="module")
def flowers_dir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("mock_tfds"))
    prepare_mock_images("tf_flowers", path, 40, num_shards=4)
    return path


# --- MobileNetParams -------------------------------------------------------------


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("alpha", 0.0, "alpha must be positive, received 0.0"),
        ("image_size", 31, "image_size must be at least 32 (MobileNetV2's smallest input)"),
        ("num_classes", 1, "num_classes must be at least 2, received 1"),
        ("learning_rate", 0.0, "learning_rate must be positive, received 0.0"),
        ("optimizer", "lamb", "optimizer 'lamb' is unknown; valid: adam, rmsprop, sgd, momentum"),
        ("momentum", 1.0, "momentum must be in [0, 1), received 1.0"),
        ("decay_per_epoch", 0.0, "decay_per_epoch must be in (0, 1], received 0.0"),
        ("decay_per_epoch", 1.5, "decay_per_epoch must be in (0, 1], received 1.5"),
        ("num_train_examples", 0, "num_train_examples must be at least 1, received 0"),
    ],
)
def test_fail_with_invalid_params(field, value, message):
    with pytest.raises(ValueError) as raised:
        MobileNetParams(**{field: value})
    assert message in str(raised.value)
    with pytest.raises(UsageError) as raised:
        build_mobilenet_v2({**SMALL, field: value})
    assert message in str(raised.value)


def test_fail_with_a_misspelt_param():
    with pytest.raises(UsageError, match="Unknown parameter\\(s\\) aplha for keras mobilenet_v2"):
        build_mobilenet_v2({**SMALL, "aplha": 0.5})


# --- the model ----------------------------------------------------------------------


def test_is_registered():
    assert KERAS_MODELS.get("mobilenet_v2") is build_mobilenet_v2


def test_builds_mobilenet_v2_for_the_inputs_images():
    model = build_mobilenet_v2({**SMALL, "feature_shapes": {"image": [96, 96, 3]}})
    assert model.input_names == ["image"]
    assert model.input_shape == (None, 96, 96, 3)
    assert model.output_shape == (None, 3)
    assert model.name == "mobilenetv2_0.35_96"
    # Logits: the last layer has no softmax, and the loss reads logits.
    assert model.layers[-1].activation is tf.keras.activations.linear
    assert model.loss.get_config()["from_logits"] is True
    # The package's own pre-flight finds nothing that keeps it from the bridge.
    assert pitfalls.check_keras_model(model, "mobilenet_v2") == []


def test_alpha_sets_the_width():
    narrow = build_mobilenet_v2(SMALL).count_params()
    wide = build_mobilenet_v2({**SMALL, "alpha": 0.5}).count_params()
    assert narrow < wide


def test_image_size_alone_sizes_the_input():
    model = build_mobilenet_v2({"alpha": 0.35, "num_classes": 2, "image_size": 64})
    assert model.input_shape == (None, 64, 64, 3)


@pytest.mark.parametrize(
    "name, expected, momentum",
    [
        ("adam", tf.keras.optimizers.legacy.Adam, None),
        ("rmsprop", tf.keras.optimizers.legacy.RMSprop, 0.8),
        ("sgd", tf.keras.optimizers.legacy.SGD, 0.0),
        ("momentum", tf.keras.optimizers.legacy.SGD, 0.8),
    ],
)
def test_compiles_a_legacy_optimizer(name, expected, momentum):
    hparams = MobileNetParams(optimizer=name, momentum=0.8, learning_rate=0.02)
    optimizer = mobilenet_v2.make_optimizer(hparams, 0.02)
    assert type(optimizer) is expected
    assert float(optimizer.learning_rate) == pytest.approx(0.02)
    if momentum is not None:
        assert float(optimizer.momentum) == pytest.approx(momentum)


@pytest.mark.parametrize(
    "shapes, message",
    [
        ({"image": [64, 64, 3]}, "image_size=96, but the input gives 64x64 images"),
        ({"image": [None, None, 3]}, "needs images of a known size"),
    ],
)
def test_fail_with_images_of_another_or_unknown_size(shapes, message):
    with pytest.raises(UsageError, match=message):
        build_mobilenet_v2({**SMALL, "image_size": 96, "feature_shapes": shapes})


def test_fail_with_images_too_small():
    with pytest.raises(UsageError, match="at least 32x32; the input gives 8x8"):
        build_mobilenet_v2({**SMALL, "feature_shapes": {"image": [8, 8, 1]}})


# --- classes and epochs from the TFDS metadata ----------------------------------------


def test_classes_come_from_the_prepared_dataset(flowers_dir):
    params = {**SMALL, "num_classes": None, "dataset": "tf_flowers", "data_dir": flowers_dir}
    assert build_mobilenet_v2(params).output_shape == (None, 5)


def test_classes_come_from_the_datasets_code_before_it_is_prepared(tmp_path):
    params = {**SMALL, "num_classes": None, "dataset": "cats_vs_dogs", "data_dir": str(tmp_path)}
    assert build_mobilenet_v2(params).output_shape == (None, 2)


@pytest.mark.parametrize(
    "extra, why",
    [
        ({}, "no num_classes nor dataset given"),
        ({"dataset": "no_such_dataset_xyz"}, "TFDS has no dataset 'no_such_dataset_xyz'"),
        ({"dataset": "tf_flowers", "label_key": "kind"}, "'tf_flowers' has no ClassLabel"),
    ],
)
def test_fail_without_a_number_of_classes(tmp_path, extra, why):
    params = {**SMALL, "num_classes": None, "data_dir": str(tmp_path), **extra}
    with pytest.raises(UsageError) as raised:
        build_mobilenet_v2(params)
    assert str(raised.value).startswith(f"mobilenet_v2 needs the number of classes: {why}")
    assert "--params=num_classes=<N>" in str(raised.value)


def test_learning_rate_decays_after_every_epoch():
    hparams = MobileNetParams(
        learning_rate=0.1, decay_per_epoch=0.5, num_train_examples=640, batch_size=64
    )
    schedule = mobilenet_v2.learning_rate(hparams, {})
    # 640 // 64 = 10 steps an epoch.
    rates = [float(schedule(step)) for step in (0, 9, 10, 19, 20, 35)]
    assert rates == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025, 0.0125])
    assert mobilenet_v2.learning_rate(MobileNetParams(learning_rate=0.1), {}) == 0.1


def test_an_epoch_is_the_size_of_the_inputs_split(flowers_dir):
    hparams = MobileNetParams(decay_per_epoch=0.5, batch_size=8)
    params = {"dataset": "tf_flowers", "data_dir": flowers_dir, "split": "train[:90%]"}
    schedule = mobilenet_v2.learning_rate(hparams, params)
    # 36 examples in train[:90%] of 40; 36 // 8 = 4 steps an epoch.
    assert schedule.get_config()["decay_steps"] == 4


def test_fail_with_decay_and_no_epoch_size(tmp_path):
    params = {
        **SMALL,
        "decay_per_epoch": 0.98,
        "dataset": "cats_vs_dogs",
        "data_dir": str(tmp_path),
    }
    with pytest.raises(UsageError, match="split 'train' of 'cats_vs_dogs' has no known size"):
        build_mobilenet_v2(params)


# --- 2 workers and an evaluator, through the launcher ------------------------------------


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_workers_and_evaluator_train_on_variable_size_images(tmp_path, flowers_dir):
    model_dir = str(tmp_path / "model")
    args = [
        "--num_workers=2",
        "--evaluator",
        "--timeout_secs=780",
        "--",
        f"--model_dir={model_dir}",
        f"--data_dir={flowers_dir}",
        "--keras_model=mobilenet_v2",
        "--input_fn=tfds_images",
        "--batch_size=8",
        "--train_steps=6",
        "--save_checkpoints_steps=3",
        "--eval_throttle_secs=1",
        "--params=dataset=tf_flowers,alpha=0.35,image_size=32,split=train[:90%],"
        "eval_split=train[90%:],optimizer=momentum,decay_per_epoch=0.9",
        "--learning_rate=0.01",
        "--communication=ring",
    ]
    run = run_module("estimator_dist.launch", args, 840, model_dir=model_dir)

    latest = tf.train.latest_checkpoint(model_dir)
    assert latest and latest.endswith("model.ckpt-6"), latest
    assert tf.train.load_checkpoint(latest).get_tensor("global_step") == 6
    final = run.json("eval_metrics.json")
    assert final["final"] is True
    metrics = final["metrics"]
    assert metrics["global_step"] == 6
    assert 0.0 <= metrics["accuracy"] <= 1.0
    assert math.isfinite(metrics["loss"]) and metrics["loss"] > 0
    assert re.search(r"\[launcher\] final evaluation: global_step=6, accuracy=", run.output)
    record = run.json("run_record.json")
    assert (record["num_workers"], record["num_replicas"]) == (2, 2)
    assert record["config"]["keras_model"] == "mobilenet_v2"
    assert record["input_fns"]["train"] == "tfds_images"
    for task in ("chief-0", "worker-0"):
        with open(os.path.join(model_dir, "logs", f"{task}.log")) as stream:
            log = stream.read()
        assert "split=train[:90%]: global batch 8, per worker 4, per replica 4" in log
        assert "sharding by file (4 files over 2 pipelines)" in log
