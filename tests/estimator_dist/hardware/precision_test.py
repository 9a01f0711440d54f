"""--mixed_precision: the decision from the hardware, the sessions' rewrite, the Keras policy."""

import pytest
import tensorflow as tf
from tensorflow.core.protobuf.rewriter_config_pb2 import RewriterConfig

from estimator_dist.base.errors import UsageError
from estimator_dist.hardware import cpus, precision

AMX = {"avx2", "avx512f", "amx_tile", "amx_bf16"}
AVX512_BF16 = {"avx2", "avx512f", "avx512_bf16"}
AVX2 = {"sse4_2", "avx", "avx2", "fma"}


@pytest.mark.parametrize(
    "requested, cpu_flags, gpus, used",
    [
        ("off", AMX, ((8, 0),), "off"),
        ("bfloat16", AMX, (), "bfloat16"),
        ("bfloat16", AVX512_BF16, (), "bfloat16"),
        ("float16", AVX2, ((7, 0), (8, 6)), "float16"),
        ("auto", AMX, ((8, 0),), "float16"),
        ("auto", AMX, (), "bfloat16"),
        ("auto", AMX, ((6, 1),), "bfloat16"),
        ("auto", AVX2, ((6, 1),), "off"),
        ("auto", AVX2, (), "off"),
    ],
)
def test_the_hardware_decides(requested, cpu_flags, gpus, used):
    decision = precision.decide(requested, cpu_flags, gpus, onednn=True)
    assert (decision.requested, decision.used) == (requested, used)


def test_auto_says_why():
    decision = precision.decide("auto", AMX, (), onednn=True)
    assert decision.reason == "auto: CPU flags amx_bf16: bfloat16"
    assert precision.decide("auto", AMX, (), onednn=False).reason == (
        "auto: no GPU of compute capability 7.0+ and oneDNN off: float32"
    )
    assert precision.decide("auto", AVX2, ((8, 0),), True).reason == (
        "auto: GPU compute capability 8.0: float16"
    )


def test_bfloat16_is_refused_on_a_cpu_without_it_naming_the_flags_found():
    with pytest.raises(UsageError) as raised:
        precision.decide("bfloat16", AVX2, (), onednn=True)
    message = str(raised.value)
    assert raised.value.exit_code == 2
    assert "this CPU reports avx, avx2, fma, sse4_2" in message
    assert "avx512_bf16 or amx_bf16" in message
    assert "--mixed_precision=off" in message


def test_bfloat16_is_refused_with_onednn_off():
    with pytest.raises(UsageError, match="oneDNN is off.*Use --onednn=on"):
        precision.decide("bfloat16", AMX, (), onednn=False)


@pytest.mark.parametrize("gpus, shown", [((), "none"), (((6, 1), (8, 0)), "6.1, 8.0")])
def test_float16_is_refused_without_gpus_that_compute_in_it(gpus, shown):
    with pytest.raises(UsageError, match=f"GPUs of capability {shown}. Use") as raised:
        precision.decide("float16", AMX, gpus, onednn=True)
    assert raised.value.exit_code == 2


def test_float16_is_refused_on_this_machine():
    """No GPU here: the task refuses float16 before training."""
    with pytest.raises(UsageError, match="needs GPUs of compute capability 7.0"):
        precision.resolve("float16")


def test_cpu_flags_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Some CPU\nflags\t\t: fpu avx2 avx512_bf16 amx_bf16\n\n"
        "processor\t: 1\nflags\t\t: fpu\n"
    )
    assert cpus.cpu_flags(str(cpuinfo)) == {"fpu", "avx2", "avx512_bf16", "amx_bf16"}
    assert cpus.cpu_flags(str(tmp_path / "missing")) == frozenset()


def test_resolve_reads_the_machine(monkeypatch):
    monkeypatch.setattr(cpus, "cpu_flags", lambda: frozenset(AVX2))
    with pytest.raises(UsageError, match="this CPU reports avx, avx2, fma, sse4_2"):
        precision.resolve("bfloat16")
    assert precision.resolve("auto").used == "off"
    monkeypatch.setattr(cpus, "cpu_flags", lambda: frozenset(AVX512_BF16))
    monkeypatch.setattr(cpus, "onednn_enabled", lambda: True)
    assert precision.resolve("auto").used == "bfloat16"


def _decided(used):
    return precision.Precision(used, used, "")


@pytest.mark.parametrize("distributed, remapping", [(True, "OFF"), (False, "DEFAULT")])
def test_bfloat16_turns_on_the_onednn_rewrite_and_keeps_the_config(distributed, remapping):
    given = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=3)
    config = precision.rewrite_session_config(_decided("bfloat16"), given, distributed)
    options = config.graph_options.rewrite_options
    assert options.auto_mixed_precision_onednn_bfloat16 == RewriterConfig.ON
    assert options.auto_mixed_precision == RewriterConfig.DEFAULT
    # On a cluster the remapper would fuse bfloat16 convolutions into _FusedConv2D,
    # which a worker rejects before oneDNN's layout pass renames them; in one
    # process it stays, and faster.
    assert options.remapping == getattr(RewriterConfig, remapping)
    assert config.intra_op_parallelism_threads == 3
    assert given.graph_options.rewrite_options.auto_mixed_precision_onednn_bfloat16 == 0


def test_float16_turns_on_the_cuda_rewrite():
    given = tf.compat.v1.ConfigProto()
    config = precision.rewrite_session_config(_decided("float16"), given, distributed=True)
    options = config.graph_options.rewrite_options
    assert options.auto_mixed_precision == RewriterConfig.ON
    assert options.auto_mixed_precision_onednn_bfloat16 == RewriterConfig.DEFAULT
    assert options.remapping == RewriterConfig.DEFAULT


def test_off_changes_nothing():
    given = tf.compat.v1.ConfigProto(allow_soft_placement=True)
    assert precision.rewrite_session_config(_decided("off"), given, distributed=True) == given


def test_the_multi_worker_strategy_keeps_the_rewrite():
    """What `update_config_proto` gives the multi-worker sessions still has the rewrite on."""
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    given = tf.compat.v1.ConfigProto()
    config = precision.rewrite_session_config(_decided("bfloat16"), given, distributed=True)
    merged = strategy.extended._update_config_proto(config)
    options = merged.graph_options.rewrite_options
    assert options.auto_mixed_precision_onednn_bfloat16 == RewriterConfig.ON
    assert options.remapping == RewriterConfig.OFF
    assert options.scoped_allocator_optimization == RewriterConfig.ON  # the strategy's own


def test_keras_models_get_the_float16_policy_and_a_loss_scaled_optimizer():
    before = tf.keras.mixed_precision.global_policy().name
    with precision.keras_policy(_decided("float16")) as name:
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
        model.compile(optimizer=tf.keras.optimizers.legacy.SGD(), loss="mse")
    assert name == "mixed_float16"
    assert model.layers[0].compute_dtype == "float16"
    assert model.layers[0].kernel.dtype == tf.float32
    assert type(model.optimizer).__name__ == "LossScaleOptimizer"
    assert model.optimizer.dynamic
    assert tf.keras.mixed_precision.global_policy().name == before


@pytest.mark.parametrize("used", ["off", "bfloat16"])
def test_keras_policy_is_left_alone_otherwise(used):
    before = tf.keras.mixed_precision.global_policy().name
    with precision.keras_policy(_decided(used)) as name:
        assert tf.keras.mixed_precision.global_policy().name == before == name
