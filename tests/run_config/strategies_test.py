"""Strategy configuration, construction and per-role choice.

Every test that builds a strategy unsets TF_CONFIG first:
MultiWorkerMirroredStrategy reads it, and a real multi-worker TF_CONFIG would
start a gRPC server and wait for peers. Roles are given as `ClusterConfig`s.
"""

import json
import logging
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.cluster.tf_config import ClusterConfig, parse_tf_config
from run_config import strategies
from run_config.names import (
    COMMUNICATIONS,
    EVAL_STRATEGY_NAMES,
    STRATEGY_NAMES,
    WIRE_DTYPES,
)
from run_config.strategies import (
    NCCL_WITHOUT_GPU_MESSAGE,
    StrategyConfig,
    check_cluster_fits,
    communication_for,
    communication_of,
    get_strategy,
    make_strategies,
)

Impl = tf.distribute.experimental.CommunicationImplementation

TWO_WORKERS = {"chief": ["h0:2000"], "worker": ["h1:2000"]}
CHIEF_ONLY = {"chief": ["h0:2000"]}
WITH_PS = {"chief": ["h0:2000"], "worker": ["h1:2000"], "ps": ["h2:2000"]}


# TF_CONFIG is unset for every test (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("patches_installed")


def cluster(jobs, task_type, index=0):
    return parse_tf_config(
        json.dumps({"cluster": jobs, "task": {"type": task_type, "index": index}})
    )


def mwms_options(strategy):
    return strategy.extended._communication_options


# --- StrategyConfig -----------------------------------------------------------


def test_defaults_are_multi_worker_mirrored_with_auto():
    config = StrategyConfig()
    assert config.name == "multi_worker_mirrored"
    assert config.communication == "AUTO"
    # Each collective with a deadline holds a thread for the deadline (TF 2.15);
    # partitions are caught by the stall watchdog instead.
    assert config.collective_timeout_seconds is None


@pytest.mark.parametrize(
    "name, communication, expected_name, expected_communication",
    [
        ("MULTI_WORKER_MIRRORED", "ring", "multi_worker_mirrored", "RING"),
        ("Mirrored", "Nccl", "mirrored", "NCCL"),
        ("one_device", "auto", "one_device", "AUTO"),
        ("OFF", "RING", "off", "RING"),
        ("Parameter_Server", "nCcL", "parameter_server", "NCCL"),
    ],
)
def test_config_normalises_case(name, communication, expected_name, expected_communication):
    config = StrategyConfig(name, communication=communication)
    assert config.name == expected_name
    assert config.communication == expected_communication


def test_config_keeps_positive_timeout():
    assert StrategyConfig(collective_timeout_seconds=2.5).collective_timeout_seconds == 2.5


def test_fail_with_unknown_strategy_name():
    with pytest.raises(UsageError) as raised:
        StrategyConfig("tpu")
    message = str(raised.value)
    assert "'tpu'" in message
    for name in STRATEGY_NAMES:
        assert name in message
    assert "--distribution_strategy" in message


def test_fail_with_unknown_communication():
    with pytest.raises(UsageError) as raised:
        StrategyConfig("multi_worker_mirrored", communication="gloo")
    message = str(raised.value)
    assert "'gloo'" in message
    for communication in COMMUNICATIONS:
        assert communication in message
    assert "--communication" in message


@pytest.mark.parametrize("timeout", [0, -1, -0.5])
def test_fail_with_non_positive_timeout(timeout):
    with pytest.raises(UsageError, match="collective_timeout_seconds must be positive"):
        StrategyConfig(collective_timeout_seconds=timeout)


def test_gradient_transport_defaults_to_one_float32_pack():
    config = StrategyConfig()
    assert (config.bytes_per_pack, config.gradient_wire_dtype) == (0, "float32")
    assert StrategyConfig(gradient_wire_dtype="BFloat16").gradient_wire_dtype == "bfloat16"


def test_fail_with_negative_bytes_per_pack():
    with pytest.raises(UsageError, match="bytes_per_pack must be at least 0, received -1"):
        StrategyConfig(bytes_per_pack=-1)


def test_fail_with_unknown_wire_dtype_lists_the_valid_ones():
    with pytest.raises(UsageError) as raised:
        StrategyConfig(gradient_wire_dtype="int8")
    assert "'int8'" in str(raised.value)
    for dtype in WIRE_DTYPES:
        assert dtype in str(raised.value)
    assert "--gradient_wire_dtype" in str(raised.value)


# --- communication_for / communication_of -------------------------------------


@pytest.mark.parametrize(
    "requested, num_gpus, expected",
    [
        ("RING", 0, "RING"),
        ("NCCL", 0, "RING"),
        ("AUTO", 0, "RING"),
        ("nccl", 0, "RING"),
        ("RING", 1, "RING"),
        ("NCCL", 1, "NCCL"),
        ("AUTO", 1, "AUTO"),
        ("RING", 2, "RING"),
        ("NCCL", 2, "NCCL"),
        ("AUTO", 2, "AUTO"),
        ("nccl", 2, "NCCL"),
    ],
)
def test_communication_for(requested, num_gpus, expected):
    assert communication_for(requested, num_gpus) == expected


@pytest.mark.parametrize("built, num_gpus, expected", [("AUTO", 2, "AUTO"), ("AUTO", 0, "RING")])
def test_communication_of_reads_a_strategy_built_elsewhere(built, num_gpus, expected):
    options = tf.distribute.experimental.CommunicationOptions(implementation=getattr(Impl, built))
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    assert communication_of(strategy, num_gpus) == expected


def test_communication_of_a_strategy_without_collectives_is_none():
    assert communication_of(tf.distribute.MirroredStrategy(["/cpu:0"]), 0) is None
    assert communication_of(None, 0) is None


# --- get_strategy -------------------------------------------------------------


@pytest.mark.parametrize("communication", COMMUNICATIONS)
def test_get_multi_worker_mirrored_with_gpus_uses_requested_collectives(communication):
    strategy = get_strategy(StrategyConfig("multi_worker_mirrored", communication), num_gpus=2)
    assert isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    assert mwms_options(strategy).implementation == getattr(Impl, communication)


@pytest.mark.parametrize("communication", ["RING", "AUTO"])
def test_get_multi_worker_mirrored_without_gpu_builds_ring_silently(communication, caplog):
    caplog.set_level(logging.WARNING)
    strategy = get_strategy(StrategyConfig("multi_worker_mirrored", communication), num_gpus=0)
    assert mwms_options(strategy).implementation == Impl.RING
    assert NCCL_WITHOUT_GPU_MESSAGE not in caplog.text


def test_get_multi_worker_mirrored_nccl_without_gpu_falls_back_to_ring(caplog):
    caplog.set_level(logging.WARNING)
    strategy = get_strategy(StrategyConfig("multi_worker_mirrored", "nccl"), num_gpus=0)
    assert isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
    assert mwms_options(strategy).implementation == Impl.RING
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any(NCCL_WITHOUT_GPU_MESSAGE in r.getMessage() for r in warnings)


def test_get_multi_worker_mirrored_nccl_without_gpu_warns_via_absl(monkeypatch):
    warned = []
    monkeypatch.setattr(strategies.logging, "warning", lambda msg, *a: warned.append(msg % a))
    get_strategy(StrategyConfig("multi_worker_mirrored", "NCCL"), num_gpus=0)
    assert warned == [NCCL_WITHOUT_GPU_MESSAGE]


@pytest.mark.parametrize("bytes_per_pack", [0, 65536])
def test_get_multi_worker_mirrored_passes_bytes_per_pack(bytes_per_pack):
    config = StrategyConfig("multi_worker_mirrored", "ring", bytes_per_pack=bytes_per_pack)
    assert mwms_options(get_strategy(config, num_gpus=0)).bytes_per_pack == bytes_per_pack


@pytest.mark.parametrize("timeout", [None, 30.0])
def test_get_multi_worker_mirrored_passes_timeout(timeout):
    config = StrategyConfig("multi_worker_mirrored", "ring", collective_timeout_seconds=timeout)
    strategy = get_strategy(config, num_gpus=0)
    assert mwms_options(strategy).timeout_seconds == timeout


@pytest.mark.parametrize(
    "name, expected_class",
    [
        ("mirrored", tf.distribute.MirroredStrategy),
        ("central_storage", tf.compat.v1.distribute.experimental.CentralStorageStrategy),
        ("parameter_server", tf.compat.v1.distribute.experimental.ParameterServerStrategy),
        ("one_device", tf.distribute.OneDeviceStrategy),
    ],
)
def test_get_strategy_class(name, expected_class):
    strategy = get_strategy(StrategyConfig(name), num_gpus=0)
    assert isinstance(strategy, expected_class)
    assert not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


@pytest.mark.parametrize("num_gpus, device", [(0, "CPU:0"), (2, "GPU:0")])
def test_get_one_device_picks_gpu_when_there_is_one(num_gpus, device):
    strategy = get_strategy(StrategyConfig("one_device"), num_gpus=num_gpus)
    (worker_device,) = strategy.extended.worker_devices
    assert worker_device.endswith(device)


def test_get_off_returns_none():
    assert get_strategy(StrategyConfig("off"), num_gpus=0) is None
    assert get_strategy(StrategyConfig("OFF")) is None


def test_get_strategy_counts_gpus_when_not_given(monkeypatch):
    monkeypatch.setattr(strategies, "count_gpus", lambda: 3)
    strategy = get_strategy(StrategyConfig("multi_worker_mirrored", "nccl"))
    assert mwms_options(strategy).implementation == Impl.NCCL
    monkeypatch.setattr(strategies, "count_gpus", lambda: 0)
    strategy = get_strategy(StrategyConfig("multi_worker_mirrored", "nccl"))
    assert mwms_options(strategy).implementation == Impl.RING


# --- make_strategies ----------------------------------------------------------


def test_make_strategies_on_evaluator_does_not_build_multi_worker_mirrored():
    evaluator = cluster(TWO_WORKERS, "evaluator")
    assert evaluator.task_type == "evaluator"
    result = make_strategies(
        StrategyConfig("multi_worker_mirrored", "ring"), "mirrored", evaluator, num_gpus=0
    )
    assert type(result.train_distribute) is tf.distribute.MirroredStrategy
    assert not isinstance(result.train_distribute, tf.distribute.MultiWorkerMirroredStrategy)
    assert result.train_name == "mirrored"
    assert result.effective_communication is None
    assert isinstance(result.eval_distribute, tf.distribute.MirroredStrategy)
    assert result.eval_name == "mirrored"
    assert result.communication == "RING"


@pytest.mark.parametrize("task_type, index", [("chief", 0), ("worker", 0)])
def test_make_strategies_on_training_task_builds_multi_worker_mirrored(task_type, index):
    task = cluster(TWO_WORKERS, task_type, index)
    result = make_strategies(StrategyConfig("multi_worker_mirrored", "nccl"), "off", task, 0)
    assert isinstance(result.train_distribute, tf.distribute.MultiWorkerMirroredStrategy)
    assert mwms_options(result.train_distribute).implementation == Impl.RING
    assert result.train_name == "multi_worker_mirrored"
    assert result.eval_distribute is None
    assert result.eval_name == "off"
    assert result.communication == "NCCL"
    assert result.effective_communication == "RING"


def test_make_strategies_with_gpus_reports_requested_communication():
    result = make_strategies(
        StrategyConfig("multi_worker_mirrored", "nccl"),
        "one_device",
        cluster(CHIEF_ONLY, "chief"),
        2,
    )
    assert result.effective_communication == "NCCL"
    assert isinstance(result.eval_distribute, tf.distribute.OneDeviceStrategy)


def test_make_strategies_single_process_non_collective_has_no_communication():
    result = make_strategies(StrategyConfig("mirrored"), "OFF", ClusterConfig(), num_gpus=0)
    assert type(result.train_distribute) is tf.distribute.MirroredStrategy
    assert result.train_name == "mirrored"
    assert result.eval_name == "off"
    assert result.effective_communication is None


@pytest.mark.parametrize("eval_name", ["multi_worker_mirrored", "central_storage", "tpu"])
def test_fail_with_unknown_eval_strategy(eval_name):
    with pytest.raises(UsageError) as raised:
        make_strategies(StrategyConfig(), eval_name, ClusterConfig(), num_gpus=0)
    message = str(raised.value)
    assert repr(eval_name) in message
    assert "evaluation strategy" in message
    for name in EVAL_STRATEGY_NAMES:
        assert name in message
    assert "--eval_distribution_strategy" in message


def test_make_strategies_checks_cluster_fit():
    with pytest.raises(UsageError, match="ps task"):
        make_strategies(StrategyConfig(), "off", cluster(WITH_PS, "chief"), num_gpus=0)


# --- check_cluster_fits -------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["multi_worker_mirrored", "mirrored", "central_storage", "one_device", "off"]
)
def test_fail_with_ps_tasks_and_non_parameter_server_strategy(name):
    with pytest.raises(UsageError) as raised:
        check_cluster_fits(StrategyConfig(name), cluster(WITH_PS, "worker"))
    message = str(raised.value)
    assert "1 ps task(s)" in message
    assert repr(name) in message
    assert "--distribution_strategy=parameter_server" in message


def test_fail_with_parameter_server_without_ps():
    with pytest.raises(UsageError, match="needs at least one ps task"):
        check_cluster_fits(StrategyConfig("parameter_server"), cluster(TWO_WORKERS, "chief"))


@pytest.mark.parametrize("name", ["mirrored", "one_device", "off", "central_storage"])
def test_fail_with_local_only_strategy_on_several_workers(name):
    with pytest.raises(UsageError) as raised:
        check_cluster_fits(StrategyConfig(name), cluster(TWO_WORKERS, "worker"))
    message = str(raised.value)
    assert f"--distribution_strategy={name}" in message
    assert "2 workers" in message
    assert "'multi_worker_mirrored'" in message


@pytest.mark.parametrize(
    "name, jobs",
    [
        ("parameter_server", WITH_PS),
        ("multi_worker_mirrored", TWO_WORKERS),
        ("multi_worker_mirrored", CHIEF_ONLY),
        ("mirrored", CHIEF_ONLY),
        ("off", CHIEF_ONLY),
    ],
)
def test_check_cluster_fits_accepts_matching_cluster(name, jobs):
    assert check_cluster_fits(StrategyConfig(name), cluster(jobs, "chief")) is None


@pytest.mark.parametrize("name", STRATEGY_NAMES)
def test_check_cluster_fits_accepts_any_strategy_in_one_process(name):
    assert check_cluster_fits(StrategyConfig(name), ClusterConfig()) is None


# --- check_nccl_gpus ----------------------------------------------------------

ONE_HOST = {"chief": ["localhost:2000"], "worker": ["localhost:2001"]}
TWO_HOSTS = {"chief": ["h0:1"], "worker": ["h1:1"]}
NCCL = StrategyConfig("multi_worker_mirrored", "NCCL")


@pytest.mark.parametrize("task_type", ["chief", "worker"])
def test_fail_with_nccl_and_fewer_gpus_than_processes_on_the_host(task_type):
    with pytest.raises(UsageError) as raised:
        strategies.check_nccl_gpus(NCCL, cluster(ONE_HOST, task_type), num_gpus=1)
    message = str(raised.value)
    assert "--communication=NCCL with 2 training processes on host localhost" in message
    assert "(chief-0, worker-0)" in message
    assert "1 visible GPU(s)" in message
    assert "CUDA_VISIBLE_DEVICES" in message
    assert "--communication=RING" in message


def test_nccl_lowercase_is_checked_too():
    config = StrategyConfig("multi_worker_mirrored", "nccl")
    with pytest.raises(UsageError, match="CUDA_VISIBLE_DEVICES"):
        strategies.check_nccl_gpus(config, cluster(ONE_HOST, "chief"), num_gpus=1)


@pytest.mark.parametrize("num_gpus", [2, 3])
def test_nccl_with_a_gpu_per_process_is_fine(num_gpus):
    assert strategies.check_nccl_gpus(NCCL, cluster(ONE_HOST, "chief"), num_gpus) is None


def test_nccl_without_gpus_is_fine_because_ring_runs():
    assert strategies.check_nccl_gpus(NCCL, cluster(ONE_HOST, "worker"), num_gpus=0) is None


@pytest.mark.parametrize("communication", ["RING", "AUTO"])
def test_other_communication_sharing_a_gpu_is_fine(communication):
    config = StrategyConfig("multi_worker_mirrored", communication)
    assert strategies.check_nccl_gpus(config, cluster(ONE_HOST, "chief"), num_gpus=1) is None


@pytest.mark.parametrize("name", ["mirrored", "parameter_server", "one_device", "off"])
def test_nccl_with_other_strategies_is_not_checked(name):
    config = StrategyConfig(name, "NCCL")
    assert strategies.check_nccl_gpus(config, cluster(ONE_HOST, "chief"), num_gpus=1) is None


@pytest.mark.parametrize("task_type", ["chief", "worker"])
def test_nccl_with_one_process_per_host_is_fine(task_type):
    assert strategies.check_nccl_gpus(NCCL, cluster(TWO_HOSTS, task_type), num_gpus=1) is None


def test_nccl_counts_only_training_processes_on_this_host():
    jobs = {
        "chief": ["h0:1"],
        "worker": ["h0:2", "h0:3", "h1:1"],
        "ps": ["h0:4", "h1:2"],
    }
    assert strategies.check_nccl_gpus(NCCL, cluster(jobs, "worker", 2), num_gpus=1) is None
    assert strategies.check_nccl_gpus(NCCL, cluster(jobs, "worker", 1), num_gpus=3) is None
    with pytest.raises(UsageError) as raised:
        strategies.check_nccl_gpus(NCCL, cluster(jobs, "worker", 0), num_gpus=2)
    message = str(raised.value)
    assert "3 training processes on host h0 (chief-0, worker-0, worker-1)" in message
    assert "worker-2" not in message
    assert "ps-" not in message


@pytest.mark.parametrize("task_type", ["ps", "evaluator"])
def test_nccl_is_not_checked_on_ps_and_evaluator(task_type):
    jobs = {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]}
    assert strategies.check_nccl_gpus(NCCL, cluster(jobs, task_type), num_gpus=1) is None


def test_nccl_is_not_checked_in_one_process():
    assert strategies.check_nccl_gpus(NCCL, ClusterConfig(), num_gpus=1) is None


def test_make_strategies_refuses_nccl_sharing_a_gpu_before_building():
    with pytest.raises(UsageError, match="CUDA_VISIBLE_DEVICES"):
        make_strategies(NCCL, "off", cluster(ONE_HOST, "worker"), num_gpus=1)


@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_get_strategy_works_in_a_program_that_imports_only_run_config():
    # A fresh interpreter, as a user's own program is: nothing of the driver has run, so the
    # multi-worker workarounds are not installed until get_strategy needs them.
    program = (
        "from estimator_dist.tf_runtime import patches\n"
        "from run_config.strategies import StrategyConfig, get_strategy\n"
        "assert not patches.installed()\n"
        "strategy = get_strategy(StrategyConfig(), num_gpus=0)\n"
        "print(type(strategy).__name__, patches.installed())\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == ["CollectiveAllReduceStrategy", "True"], result.stdout
