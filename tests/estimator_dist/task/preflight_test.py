"""The pre-flight calls legacy user code as the training tasks do, and refuses what cannot run."""

import logging

import numpy as np
import pytest
import tensorflow as tf

from estimator_dist.base import exit_codes
from estimator_dist.base.errors import UsageError, UserCodeError
from estimator_dist.config.job import JobConfig
from estimator_dist.config.train_args import job_from_args
from estimator_dist.task import diagnose, user_code
from estimator_dist.task.preflight import EVAL, TRAIN, preflight
from run_config.run_config import RunConfigOptions
from tests.procs import run_module

HERE = __name__


def train_input_fn():
    features = {"x": np.linspace(0, 1, 32, dtype=np.float32).reshape(16, 2)}
    return tf.data.Dataset.from_tensor_slices((features, np.arange(16) % 2)).repeat().batch(4)


def eval_input_fn():
    features = {"x": np.ones([8, 2], np.float32), "unused": np.zeros([8], np.float32)}
    return tf.data.Dataset.from_tensor_slices((features, np.zeros(8, np.int64))).batch(4)


def repeating_eval_input_fn():
    return eval_input_fn().repeat()


def decaying_model_fn(features, labels, mode):
    # No params; the learning rate decays with the global step, as TF1 ports do.
    logits = tf.compat.v1.layers.dense(features["x"], 2)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = tf.compat.v1.train.get_global_step()
    rate = tf.compat.v1.train.exponential_decay(0.1, step, 100, 0.96)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(rate).minimize(loss, step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def raising_model_fn(features, labels, mode, config):
    raise KeyError("hidden_units")


def raising_input_fn(mode):
    raise FileNotFoundError("/data/train.csv")


def adam_keras_model():
    inputs = tf.keras.Input([2], name="x")
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(2)(inputs))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model


def build_v1_linear(config):
    columns = [tf.compat.v1.feature_column.numeric_column("x", shape=[2])]
    return tf.compat.v1.estimator.LinearClassifier(columns, config=config)


def build_without_config(params):
    return None


def _job(tmp_path, **settings):
    return JobConfig(run=RunConfigOptions(model_dir=str(tmp_path / "model")), **settings)


def test_a_model_fn_without_params_using_the_global_step_passes(tmp_path):
    job = _job(
        tmp_path,
        model_fn=f"{HERE}:decaying_model_fn",
        input_fn=f"{HERE}:train_input_fn",
        eval_input_fn=f"{HERE}:eval_input_fn",
    )
    checked = preflight(job)
    assert checked.model_fn is decaying_model_fn
    assert set(checked.feature_specs) == {"x", "unused"}, "specs come from the eval input"
    assert checked.eval_steps is None
    assert not (tmp_path / "model").exists()


def test_an_evaluation_input_that_repeats_is_bounded_to_estimators_default(tmp_path, caplog):
    job = _job(
        tmp_path,
        model_fn=f"{HERE}:decaying_model_fn",
        input_fn=f"{HERE}:train_input_fn",
        eval_input_fn=f"{HERE}:repeating_eval_input_fn",
    )
    assert preflight(job).eval_steps == user_code.DEFAULT_EVAL_STEPS == 100
    assert f"The evaluation input {HERE}:repeating_eval_input_fn repeats forever" in caplog.text
    explicit = JobConfig(**{**job.__dict__, "eval_steps": 7})
    assert preflight(explicit).eval_steps == 7


def test_a_keras_model_compiled_with_adam_by_name_passes_as_in_the_tasks(tmp_path):
    # In graph mode, as the tasks run, 'adam' resolves to the legacy optimizer.
    job = _job(
        tmp_path,
        keras_model=f"{HERE}:adam_keras_model",
        input_fn=f"{HERE}:train_input_fn",
        eval_input_fn=f"{HERE}:eval_input_fn",
    )
    assert preflight(job).pitfalls == ()


def test_a_v1_canned_estimator_builder_taking_only_config_passes(tmp_path):
    job = _job(tmp_path, estimator=f"{HERE}:build_v1_linear", input_fn=f"{HERE}:train_input_fn")
    assert preflight(job).model_fn is None


def test_fail_with_an_estimator_builder_without_config(tmp_path):
    job = _job(
        tmp_path, estimator=f"{HERE}:build_without_config", input_fn=f"{HERE}:train_input_fn"
    )
    with pytest.raises(UsageError, match="it must take `config`"):
        preflight(job)


@pytest.mark.parametrize(
    "settings, message",
    [
        (
            {"model_fn": f"{HERE}:raising_model_fn"},
            f"--model_fn={HERE}:raising_model_fn raised KeyError: 'hidden_units'",
        ),
        (
            {"input_fn": f"{HERE}:raising_input_fn"},
            f"--input_fn={HERE}:raising_input_fn (mode TRAIN) raised FileNotFoundError",
        ),
    ],
)
def test_fail_with_user_code_that_raises(tmp_path, settings, message):
    job = _job(tmp_path, **{"input_fn": f"{HERE}:train_input_fn", **settings})
    with pytest.raises(UserCodeError) as raised:
        preflight(job)
    assert message in str(raised.value)
    assert "fix the code" in str(raised.value)
    assert raised.value.exit_code == exit_codes.USER_CODE


def test_a_collective_shape_mismatch_is_not_a_lost_peer():
    error = tf.errors.InternalError(
        None,
        None,
        "Collective ops is aborted by: Shape mismatch in the collective instance 100. Op at "
        "device /job:worker/replica:0/task:1 expected shape [7,4] but another member",
    )
    explained = diagnose.explain_training_error(error, 12, 3.0)
    assert explained.exit_code == exit_codes.COLLECTIVE_MISMATCH
    assert not exit_codes.is_retryable(explained.exit_code)
    assert "at global step 12: the tasks all-reduced tensors of different shapes" in str(explained)


def train_only_model_fn(features, labels, mode):
    # As the TF1 example of the migration guide: no PREDICT branch, labels always used.
    prediction = tf.compat.v1.layers.dense(features["x"], 1)
    loss = tf.compat.v1.losses.mean_squared_error(labels, tf.squeeze(prediction, 1))
    step = tf.compat.v1.train.get_global_step()
    train_op = tf.compat.v1.train.AdagradOptimizer(0.05).minimize(loss, step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def full_model_fn(features, labels, mode):
    logits = tf.compat.v1.layers.dense(features["x"], 2)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"logits": logits})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    step = tf.compat.v1.train.get_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def test_a_model_fn_without_predict_skips_exports_instead_of_failing_after_training(
    tmp_path, caplog
):
    job = _job(tmp_path, model_fn=f"{HERE}:train_only_model_fn", input_fn=f"{HERE}:train_input_fn")
    assert preflight(job).exports == ()
    assert "cannot build its PREDICT graph" in caplog.text
    assert "mode == tf.estimator.ModeKeys.PREDICT" in caplog.text
    with_predict = JobConfig(**{**job.__dict__, "model_fn": f"{HERE}:full_model_fn"})
    assert preflight(with_predict).exports == ("latest", "best")


def build_ignoring_warm_start(config, params):
    return build_v1_linear(config)


def test_fail_with_a_warm_start_the_estimator_builder_drops(tmp_path):
    job = _job(
        tmp_path,
        estimator=f"{HERE}:build_ignoring_warm_start",
        input_fn=f"{HERE}:train_input_fn",
        warm_start_from=str(tmp_path),
    )
    with pytest.raises(UsageError, match=r"warm_start_from=params\['warm_start_from'\]"):
        preflight(job)


def proximal_model_fn(features, labels, mode):
    logits = tf.compat.v1.layers.dense(features["x"], 2)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    optimizer = tf.compat.v1.train.ProximalAdagradOptimizer(0.1)
    train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


@pytest.mark.multiprocess
def test_an_optimizer_no_strategy_can_run_is_named_with_its_replacements(tmp_path):
    run = run_module(
        "estimator_dist.train",
        [
            f"--model_dir={tmp_path}",
            f"--model_fn={HERE}:proximal_model_fn",
            f"--input_fn={HERE}:train_input_fn",
            "--train_steps=5",
            "--communication=RING",
        ],
        timeout=180,
        check=False,
    )
    assert run.returncode == exit_codes.USER_CODE, run.describe()
    assert diagnose.DISTRIBUTED_OPTIMIZER_HINT in run.output


def curriculum_input_fn(mode):
    # As some TF1 programs wrote: the input reads the global step, which Estimator creates first.
    difficulty = tf.minimum(1.0, tf.cast(tf.compat.v1.train.get_global_step(), tf.float32) / 100)
    features, labels = tf.compat.v1.data.make_one_shot_iterator(train_input_fn()).get_next()
    return {"x": features["x"] * difficulty}, labels


def test_an_input_fn_reading_the_global_step_passes_as_under_estimator(tmp_path):
    job = _job(
        tmp_path,
        model_fn=f"{HERE}:decaying_model_fn",
        input_fn=f"{HERE}:curriculum_input_fn",
        eval_input_fn=f"{HERE}:eval_input_fn",
    )
    assert set(preflight(job).feature_specs) == {"x", "unused"}
    # The control: the same input_fn fails in a graph without a global step.
    with tf.Graph().as_default(), pytest.raises(ValueError):
        curriculum_input_fn(TRAIN)


def test_evaluating_on_the_training_input_is_warned_naming_eval_input_fn(tmp_path, caplog):
    job = _job(tmp_path, model_fn=f"{HERE}:decaying_model_fn", input_fn=f"{HERE}:train_input_fn")
    found = {pitfall.code: pitfall for pitfall in preflight(job).pitfalls}
    assert not found["eval-on-training-input"].fatal
    message = found["eval-on-training-input"].message
    assert f"--input_fn={HERE}:train_input_fn takes no `mode`" in message
    assert "evaluation reads the training data" in message and "--eval_input_fn=" in message
    assert caplog.text.count("[eval-on-training-input]") == 1, "warned once"
    # Not with an evaluation input, nor for an input_fn that reads `mode`.
    separate = JobConfig(**{**job.__dict__, "eval_input_fn": f"{HERE}:eval_input_fn"})
    assert "eval-on-training-input" not in [p.code for p in preflight(separate).pitfalls]
    by_mode = JobConfig(**{**job.__dict__, "input_fn": f"{HERE}:recording_input_fn"})
    assert "eval-on-training-input" not in [p.code for p in preflight(by_mode).pitfalls]


def job_args(job):
    return {"model_dir": job.run.model_dir, "model_fn": job.model_fn, "input_fn": job.input_fn}


def filtered_eval_input_fn():
    return eval_input_fn().filter(lambda x, y: tf.reduce_all(y >= 0))  # unknown cardinality


def tensor_eval_input_fn():
    return tf.compat.v1.data.make_one_shot_iterator(repeating_eval_input_fn()).get_next()


def test_evaluation_tensors_of_unknown_number_read_eval_specs_default_batches(tmp_path, caplog):
    job = _job(
        tmp_path,
        model_fn=f"{HERE}:decaying_model_fn",
        input_fn=f"{HERE}:train_input_fn",
        eval_input_fn=f"{HERE}:tensor_eval_input_fn",
    )
    with caplog.at_level(logging.WARNING):
        checked = preflight(job)
    assert checked.eval_steps == user_code.DEFAULT_EVAL_STEPS
    assert (
        f"The evaluation input {HERE}:tensor_eval_input_fn returns tensors (as from an "
        "iterator's get_next()), whose number is unknown and --eval_steps is not set: each "
        f"evaluation reads at most {user_code.DEFAULT_EVAL_STEPS} batches" in caplog.text
    )
    assert preflight(JobConfig(**{**job.__dict__, "eval_steps": 5})).eval_steps == 5
    for dataset in ("eval_input_fn", "filtered_eval_input_fn"):  # Datasets: read whole
        known = JobConfig(**{**job.__dict__, "eval_input_fn": f"{HERE}:{dataset}"})
        assert preflight(known).eval_steps is None, dataset


SEEN_PARAMS = {}


def recording_input_fn(mode, params):
    SEEN_PARAMS[mode] = dict(params)
    return train_input_fn() if mode == TRAIN else eval_input_fn()


@pytest.mark.parametrize("separate", [False, True])
def test_eval_params_reach_only_the_evaluation_input(tmp_path, separate):
    recording = f"{HERE}:recording_input_fn"
    args = [
        f"--model_dir={tmp_path}",
        f"--model_fn={HERE}:decaying_model_fn",
        f"--input_fn={recording}",
        "--params=split=train,shuffle=true",
        "--eval_params=split=test",
        *([f"--eval_input_fn={recording}"] if separate else []),
    ]
    checked = preflight(job_from_args(args))
    SEEN_PARAMS.clear()
    with tf.Graph().as_default():  # The functions TrainSpec and EvalSpec receive.
        checked.input_fn(TRAIN)
        checked.eval_input_fn(EVAL)
    assert (SEEN_PARAMS[TRAIN]["split"], SEEN_PARAMS[EVAL]["split"]) == ("train", "test")
    assert SEEN_PARAMS[EVAL]["shuffle"] is True, "--params reach evaluation under --eval_params"
