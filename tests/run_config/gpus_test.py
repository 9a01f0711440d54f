"""`--num_gpus`: the GPUs of each task and the strategy they make, decided without GPUs.

This machine has no GPU: the decisions are tested as functions of the GPUs
given, and the strategies they lead to are built (MirroredStrategy over GPU
names builds in graph mode without the devices, and over logical CPU devices
it has the same replicas); the GPUs' own runs are not tested here.
"""

import json
import re

import pytest
import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.cluster.tf_config import ClusterConfig, parse_tf_config
from run_config import gpus
from run_config.gpus import check_gpus, use_gpus
from run_config.options import RunConfigOptions, plan_strategy
from run_config.run_config import make_session_config
from run_config.strategies import StrategyConfig, get_strategy, make_strategies

pytestmark = pytest.mark.usefixtures("patches_installed")

TWO_WORKERS = {"chief": ["h0:2000"], "worker": ["h1:2000"]}


def local(devices):
    """Device names without the job, which depends on how this process started TensorFlow."""
    return tuple(device[device.index("/replica:") :] for device in devices)


def chief():
    return parse_tf_config(
        json.dumps({"cluster": TWO_WORKERS, "task": {"type": "chief", "index": 0}})
    )


@pytest.mark.parametrize(
    "name, num_gpus, distributed, expected",
    [
        ("multi_worker_mirrored", None, False, ("multi_worker_mirrored", ())),
        ("multi_worker_mirrored", 8, True, ("multi_worker_mirrored", ())),
        ("multi_worker_mirrored", 0, True, ("multi_worker_mirrored", ())),
        ("multi_worker_mirrored", 1, False, ("multi_worker_mirrored", ())),
        ("multi_worker_mirrored", 2, False, ("mirrored", ("/gpu:0", "/gpu:1"))),
        ("mirrored", 3, False, ("mirrored", ("/gpu:0", "/gpu:1", "/gpu:2"))),
        ("mirrored", 0, False, ("mirrored", ("/cpu:0",))),
        ("one_device", 1, False, ("one_device", ("/gpu:0",))),
        ("one_device", 0, False, ("one_device", ("/cpu:0",))),
        ("off", 1, False, ("off", ())),
        ("parameter_server", 4, True, ("parameter_server", ())),
    ],
)
def test_the_strategy_each_num_gpus_makes(name, num_gpus, distributed, expected):
    assert plan_strategy(name, num_gpus, distributed) == expected


@pytest.mark.parametrize("name", ["off", "one_device"])
def test_fail_with_several_gpus_on_one_device(name):
    with pytest.raises(UsageError, match=f"--distribution_strategy={name} trains on one device"):
        StrategyConfig(name, num_gpus=2)


def test_fail_with_more_gpus_than_visible_naming_both():
    with pytest.raises(UsageError) as raised:
        check_gpus(8, 0)
    assert str(raised.value).startswith(
        "--num_gpus=8 asks for 8 GPU(s) on each worker, but this task sees 0"
    )
    assert "Pass --num_gpus=0 (0 trains on the CPU)" in str(raised.value)
    assert (check_gpus(None, 3), check_gpus(2, 3), check_gpus(0, 3)) == (3, 2, 0)


def test_make_strategies_refuses_more_gpus_than_visible_before_building():
    with pytest.raises(UsageError, match="--num_gpus=1 asks for 1 GPU.s. on each worker"):
        make_strategies(StrategyConfig(num_gpus=1), "off", chief())


def test_zero_gpus_hide_them_from_the_runtime_and_the_sessions():
    use_gpus(0)
    assert tf.config.get_visible_devices("GPU") == []
    assert make_session_config(RunConfigOptions("/tmp/m"), 0).device_count["GPU"] == 0
    assert "GPU" not in make_session_config(RunConfigOptions("/tmp/m")).device_count


def test_fail_when_the_runtime_started_with_the_gpus(monkeypatch):
    def too_late(devices, device_type):
        raise RuntimeError("Visible devices cannot be modified after being initialized")

    monkeypatch.setattr(gpus.tf.config, "set_visible_devices", too_late)
    with pytest.raises(UsageError, match="Set CUDA_VISIBLE_DEVICES to the first 2 GPU"):
        use_gpus(2)


def test_one_process_with_two_gpus_builds_mirrored_over_them():
    # In a graph, as Estimator builds it: eagerly its ordering variable would need GPU:0.
    with tf.Graph().as_default():
        built = make_strategies(
            StrategyConfig("multi_worker_mirrored", num_gpus=2), "off", ClusterConfig(), num_gpus=2
        )
    assert type(built.train_distribute) is tf.distribute.MirroredStrategy
    assert built.train_name == "mirrored"
    assert built.train_distribute.num_replicas_in_sync == 2
    assert local(built.devices) == (
        "/replica:0/task:0/device:GPU:0",
        "/replica:0/task:0/device:GPU:1",
    )
    assert built.num_gpus == 2 and built.effective_communication is None


def test_mirrored_over_logical_cpu_devices_has_one_replica_each():
    with tf.Graph().as_default():
        strategy = get_strategy(StrategyConfig("mirrored"), 0, ("/cpu:0", "/cpu:1"))
    assert strategy.num_replicas_in_sync == 2
    assert local(strategy.extended.worker_devices) == (
        "/replica:0/task:0/device:CPU:0",
        "/replica:0/task:0/device:CPU:1",
    )


def test_a_cluster_worker_with_gpus_runs_collectives_and_says_what_it_built():
    built = make_strategies(
        StrategyConfig("multi_worker_mirrored", "auto", num_gpus=2), "off", chief(), num_gpus=4
    )
    assert isinstance(built.train_distribute, tf.distribute.MultiWorkerMirroredStrategy)
    assert (built.num_gpus, built.effective_communication) == (2, "AUTO")
    cpu = make_strategies(StrategyConfig(num_gpus=0), "off", chief(), num_gpus=0)
    assert re.fullmatch(
        r"training strategy multi_worker_mirrored \(CollectiveAllReduceStrategy\) over "
        r"(/job:\w+)?/replica:0/task:0/device:CPU:0; 0 GPU\(s\); collectives RING; "
        r"evaluation strategy off",
        cpu.describe(),
    )


def test_the_evaluator_names_no_training_devices():
    evaluator = parse_tf_config(
        json.dumps({"cluster": TWO_WORKERS, "task": {"type": "evaluator", "index": 0}})
    )
    built = make_strategies(StrategyConfig(num_gpus=0), "off", evaluator, num_gpus=0)
    assert built.devices == ()
    assert "over no device of its own" in built.describe()
