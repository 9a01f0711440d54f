"""RunConfigOptions validation and the RunConfig built from it."""

import pytest
import tensorflow as tf

from estimator_dist.base.errors import UsageError
from run_config.run_config import (
    CHECKPOINT_SECS,
    RunConfigOptions,
    make_run_config,
    make_session_config,
)


def test_fail_with_empty_model_dir():
    with pytest.raises(UsageError, match="model_dir must be a non-empty path or None, received ''"):
        RunConfigOptions(model_dir="")


def test_no_model_dir_leaves_it_to_the_estimator_as_tensorflow_does():
    assert make_run_config(RunConfigOptions()).model_dir is None


def test_fail_with_both_checkpoint_steps_and_secs():
    with pytest.raises(UsageError, match="not both") as raised:
        RunConfigOptions("/m", save_checkpoints_steps=10, save_checkpoints_secs=60)
    assert "10 steps and 60 secs" in str(raised.value)


def test_fail_with_neither_checkpoint_steps_nor_secs():
    with pytest.raises(UsageError, match="no checkpoint is written"):
        RunConfigOptions("/m", save_checkpoints_steps=None, save_checkpoints_secs=None)


@pytest.mark.parametrize(
    "field, value",
    [
        ("save_checkpoints_steps", 0),
        ("save_checkpoints_steps", -5),
    ],
)
def test_fail_with_checkpoint_steps_below_one(field, value):
    with pytest.raises(UsageError) as raised:
        RunConfigOptions("/m", **{field: value})
    assert f"{field} must be at least 1 or None, received {value}" in str(raised.value)


@pytest.mark.parametrize("value", [0, -1])
def test_fail_with_checkpoint_secs_below_one(value):
    with pytest.raises(UsageError) as raised:
        RunConfigOptions("/m", save_checkpoints_steps=None, save_checkpoints_secs=value)
    assert f"save_checkpoints_secs must be at least 1 or None, received {value}" in str(
        raised.value
    )


@pytest.mark.parametrize(
    "field", ["keep_checkpoint_max", "save_summary_steps", "log_step_count_steps"]
)
@pytest.mark.parametrize("value", [0, -3])
def test_fail_with_count_below_one(field, value):
    with pytest.raises(UsageError) as raised:
        RunConfigOptions("/m", **{field: value})
    assert f"{field} must be at least 1, received {value}" in str(raised.value)


@pytest.mark.parametrize("field", ["intra_op_threads", "inter_op_threads"])
def test_fail_with_negative_threads(field):
    with pytest.raises(UsageError) as raised:
        RunConfigOptions("/m", **{field: -1})
    message = str(raised.value)
    assert f"{field} must be at least 0, received -1" in message


def test_options_accept_zero_threads_and_secs_alone():
    options = RunConfigOptions(
        "/m", save_checkpoints_steps=None, save_checkpoints_secs=1, intra_op_threads=0
    )
    assert options.save_checkpoints_secs == 1
    assert options.save_checkpoints_steps is None


def test_make_run_config_carries_options(tmp_path):
    options = RunConfigOptions(
        model_dir=str(tmp_path / "model"),
        save_checkpoints_steps=37,
        keep_checkpoint_max=3,
        save_summary_steps=11,
        log_step_count_steps=13,
        intra_op_threads=2,
        inter_op_threads=5,
        tf_random_seed=1234,
    )
    config = make_run_config(options)
    assert isinstance(config, tf.estimator.RunConfig)
    assert config.model_dir == str(tmp_path / "model")
    assert config.save_checkpoints_steps == 37
    assert config.save_checkpoints_secs is None
    assert config.keep_checkpoint_max == 3
    assert config.save_summary_steps == 11
    assert config.log_step_count_steps == 13
    assert config.tf_random_seed == 1234
    assert config.session_config.intra_op_parallelism_threads == 2
    assert config.session_config.inter_op_parallelism_threads == 5
    assert config.session_config.allow_soft_placement
    assert config.train_distribute is None
    assert config.eval_distribute is None


def test_make_session_config_threads():
    session_config = make_session_config(
        RunConfigOptions("/m", intra_op_threads=3, inter_op_threads=4)
    )
    assert session_config.intra_op_parallelism_threads == 3
    assert session_config.inter_op_parallelism_threads == 4
    assert session_config.allow_soft_placement


def test_num_gpus_limits_the_gpus_each_session_creates(tmp_path):
    options = RunConfigOptions(str(tmp_path))
    assert make_run_config(options, num_gpus=2).session_config.device_count["GPU"] == 2
    assert "GPU" not in make_run_config(options).session_config.device_count


def test_make_run_config_passes_strategies(tmp_path):
    train = tf.distribute.MirroredStrategy()
    evaluate = tf.distribute.OneDeviceStrategy("/cpu:0")
    config = make_run_config(RunConfigOptions(str(tmp_path)), train, evaluate)
    assert config.train_distribute is train
    assert config.eval_distribute is evaluate


def test_checkpoint_secs_allowed_without_strategy(tmp_path):
    options = RunConfigOptions(
        str(tmp_path), save_checkpoints_steps=None, save_checkpoints_secs=120
    )
    config = make_run_config(options, train_distribute=None)
    assert config.save_checkpoints_secs == 120
    assert config.save_checkpoints_steps is None


def test_checkpoint_secs_allowed_with_non_collective_strategy(tmp_path):
    options = RunConfigOptions(str(tmp_path), save_checkpoints_steps=None, save_checkpoints_secs=9)
    config = make_run_config(options, train_distribute=tf.distribute.MirroredStrategy())
    assert config.save_checkpoints_secs == 9


def test_fail_with_checkpoint_secs_and_multi_worker_mirrored(tmp_path):
    options = RunConfigOptions(str(tmp_path), save_checkpoints_steps=None, save_checkpoints_secs=60)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with pytest.raises(UsageError, match="deadlock") as raised:
        make_run_config(options, train_distribute=strategy)
    message = str(raised.value)
    assert message == CHECKPOINT_SECS.format(
        where="", value="=60", strategy=type(strategy).__name__
    )
    assert "save_checkpoints_secs=60" in message
    assert "--save_checkpoints_steps" in message


def test_fail_with_checkpoint_secs_and_v1_multi_worker_mirrored(tmp_path):
    # Estimator itself treats CollectiveAllReduceStrategyV1 (the class of
    # tf.compat.v1's MultiWorkerMirroredStrategy) as collective and switches
    # time-based checkpoints off for it, so it must be refused as well.
    options = RunConfigOptions(str(tmp_path), save_checkpoints_steps=None, save_checkpoints_secs=60)
    strategy = tf.compat.v1.distribute.experimental.MultiWorkerMirroredStrategy()
    with pytest.raises(UsageError, match="deadlock"):
        make_run_config(options, train_distribute=strategy)


def test_checkpoint_steps_allowed_with_multi_worker_mirrored(tmp_path):
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    config = make_run_config(
        RunConfigOptions(str(tmp_path), save_checkpoints_steps=25), train_distribute=strategy
    )
    assert config.save_checkpoints_steps == 25
    assert config.train_distribute is strategy


def test_every_session_of_a_bfloat16_job_gets_the_onednn_rewrite(tmp_path, monkeypatch):
    from tensorflow.core.protobuf.rewriter_config_pb2 import RewriterConfig

    from estimator_dist.hardware import cpus
    from run_config.options import PrecisionConfig

    monkeypatch.setattr(cpus, "cpu_flags", lambda: frozenset({"avx2", "avx512_bf16"}))
    monkeypatch.setattr(cpus, "onednn_enabled", lambda: True)
    options = RunConfigOptions(str(tmp_path), precision=PrecisionConfig("bfloat16"))
    config = make_run_config(options, tf.distribute.MultiWorkerMirroredStrategy())
    rewrites = config.session_config.graph_options.rewrite_options
    assert rewrites.auto_mixed_precision_onednn_bfloat16 == RewriterConfig.ON
    assert config.session_config.allow_soft_placement
    default = make_session_config(RunConfigOptions(str(tmp_path)))
    assert default.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 == 0


def test_a_cpu_without_bfloat16_refuses_the_job(tmp_path, monkeypatch):
    from estimator_dist.hardware import cpus
    from run_config.options import PrecisionConfig

    monkeypatch.setattr(cpus, "cpu_flags", lambda: frozenset({"sse4_2", "avx2"}))
    options = RunConfigOptions(str(tmp_path), precision=PrecisionConfig("bfloat16"))
    with pytest.raises(UsageError, match="this CPU reports avx2, sse4_2") as raised:
        make_run_config(options)
    assert raised.value.exit_code == 2


def test_fail_with_an_unknown_precision():
    from run_config.options import PrecisionConfig

    with pytest.raises(UsageError, match="Unknown mixed precision 'fp8'; valid values are off"):
        PrecisionConfig("fp8")
