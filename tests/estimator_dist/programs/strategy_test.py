"""A script's estimator gets the strategy, and --mixed_precision's rewrite over its own config."""

import pytest
import tensorflow as tf
from tensorflow.core.protobuf.rewriter_config_pb2 import RewriterConfig

from estimator_dist.cluster.tf_config import ClusterConfig
from estimator_dist.hardware import cpus
from estimator_dist.programs import strategy
from estimator_dist.programs.config import ScriptConfig
from run_config.options import PrecisionConfig


def _estimator(model_dir):
    session = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=3)
    config = tf.estimator.RunConfig(model_dir=model_dir, session_config=session)
    return tf.estimator.Estimator(lambda features, labels, mode: None, config=config)


@pytest.mark.usefixtures("patches_installed")
def test_the_rewrite_is_added_to_the_scripts_session_config(tmp_path, monkeypatch):
    monkeypatch.setattr(cpus, "cpu_flags", lambda: frozenset({"avx2", "amx_bf16"}))
    monkeypatch.setattr(cpus, "onednn_enabled", lambda: True)
    estimator = _estimator(str(tmp_path))
    config = ScriptConfig(__file__, precision=PrecisionConfig("bfloat16"))
    distribution = strategy.distribute(estimator, ClusterConfig(), config)
    session = estimator._session_config
    assert session.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 == (
        RewriterConfig.ON
    )
    assert session.intra_op_parallelism_threads == 3
    assert estimator._config.session_config is session
    # The strategy built for the task, not a copy (RunConfig.replace would deep-copy it).
    assert estimator._config.train_distribute is distribution.train
    assert distribution.precision.used == "bfloat16"
    record = strategy.run_record(distribution, ClusterConfig(), config, str(tmp_path), 10)
    assert record["mixed_precision"]["reason"] == "CPU flags amx_bf16: bfloat16"


@pytest.mark.usefixtures("patches_installed")
def test_off_leaves_the_scripts_session_config_alone(tmp_path):
    estimator = _estimator(str(tmp_path))
    before = estimator.config.session_config
    distribution = strategy.distribute(estimator, ClusterConfig(), ScriptConfig(__file__))
    assert estimator._session_config == before
    assert distribution.precision.used == "off"
