"""TF_CONFIG parsing, validation, normalisation and local generation."""

import json

import pytest

from estimator_dist.base.errors import ClusterConfigError, UsageError
from estimator_dist.cluster.tf_config import (
    TF_CONFIG_SOURCE_NOTE,
    ClusterConfig,
    make_local_cluster,
    parse_tf_config,
)

TWO = {"chief": ["h0:2000"], "worker": ["h1:2000"]}


def tf_config(cluster=None, task=None, **extra):
    data = dict(extra)
    if cluster is not None:
        data["cluster"] = cluster
    if task is not None:
        data["task"] = task
    return json.dumps(data)


@pytest.mark.parametrize("raw", [None, "", "  ", "{}", '{"cluster": {}}'])
def test_no_cluster_means_single_process(raw):
    config = parse_tf_config(raw)
    assert not config.is_distributed
    assert config.role == "local"
    assert config.num_workers == 1
    assert config.is_chief
    assert config.to_tf_config() == {}


def test_chief_worker_and_ps_roles():
    cluster = {"chief": ["h0:1"], "worker": ["h1:1", "h2:1"], "ps": ["h3:1"]}
    worker = parse_tf_config(tf_config(cluster, {"type": "worker", "index": 1}))
    assert (worker.task_type, worker.task_index, worker.role) == ("worker", 1, "worker-1")
    assert worker.num_workers == 3 and worker.num_ps == 1
    assert not worker.is_chief
    assert parse_tf_config(tf_config(cluster, {"type": "chief", "index": 0})).is_chief
    assert worker.notes == ()


def test_master_is_renamed_chief():
    cluster = {"master": ["h0:1"], "worker": ["h1:1"]}
    config = parse_tf_config(
        tf_config(cluster, {"type": "master", "index": 0}, environment="cloud")
    )
    assert config.task_type == "chief"
    assert dict(config.jobs) == {"chief": ("h0:1",), "worker": ("h1:1",)}
    assert "master" not in config.to_json()
    assert config.to_tf_config()["environment"] == "cloud"
    assert any("master" in note for note in config.notes)


def test_kubeflow_evaluator_in_cluster_is_taken_out():
    cluster = {**TWO, "evaluator": ["h9:1"]}
    evaluator = parse_tf_config(tf_config(cluster, {"type": "evaluator", "index": 0}))
    assert evaluator.task_type == "evaluator"
    assert "evaluator" not in evaluator.jobs
    assert evaluator.to_tf_config()["cluster"] == {"chief": ["h0:2000"], "worker": ["h1:2000"]}
    chief = parse_tf_config(tf_config(cluster, {"type": "chief", "index": 0}))
    assert "evaluator" not in chief.jobs


def test_evaluator_outside_cluster():
    config = parse_tf_config(tf_config(TWO, {"type": "evaluator", "index": 0}))
    assert config.task_type == "evaluator" and config.num_workers == 2
    assert not config.is_chief


@pytest.mark.parametrize(
    "index, expected",
    [(0, ("chief", 0)), (1, ("worker", 0)), (2, ("worker", 1))],
)
def test_worker_only_cluster_promotes_worker_zero(index, expected):
    cluster = {"worker": ["h0:1", "h1:1", "h2:1"]}
    config = parse_tf_config(tf_config(cluster, {"type": "worker", "index": index}))
    assert (config.task_type, config.task_index) == expected
    assert dict(config.jobs) == {"chief": ("h0:1",), "worker": ("h1:1", "h2:1")}
    assert config.to_tf_config()["task"] == {"type": expected[0], "index": expected[1]}


def test_single_worker_only_cluster():
    config = parse_tf_config(tf_config({"worker": ["h0:1"]}, {"type": "worker", "index": 0}))
    assert dict(config.jobs) == {"chief": ("h0:1",)}
    assert config.task_type == "chief"


def test_ipv6_address_accepted():
    config = parse_tf_config(tf_config({"chief": ["[::1]:2222"]}, {"type": "chief"}))
    assert config.jobs["chief"] == ("[::1]:2222",)


# Each malformed TF_CONFIG and a fragment its message must contain.
MALFORMED = [
    ("not json", "not valid JSON"),
    ('{"cluster": ', "not valid JSON"),
    ("[1, 2]", "expected a JSON object"),
    ('"text"', "expected a JSON object"),
    (tf_config(["h0:1"], {"type": "chief"}), "`cluster` must map job names"),
    (tf_config({"chef": ["h0:1"]}, {"type": "chef"}), "unknown job name(s) 'chef'"),
    (
        tf_config({"chief": ["a:1"], "master": ["b:1"]}, {"type": "chief"}),
        "both a `chief` and a `master`",
    ),
    (tf_config({"chief": ["a:1", "b:1"]}, {"type": "chief"}), "exactly one address"),
    (
        tf_config({**TWO, "evaluator": ["e:1", "f:1"]}, {"type": "chief"}),
        "`cluster.evaluator` must have exactly one",
    ),
    (tf_config({"chief": "h0:1"}, {"type": "chief"}), "non-empty list"),
    # Kubeflow's sparse cluster (enableDynamicWorker): worker maps index to address.
    (
        tf_config({"worker": {"1": "w1:2222"}, "ps": ["p0:2222"]}, {"type": "worker", "index": 1}),
        "enableDynamicWorker: false",
    ),
    (tf_config({"worker": {}, "ps": []}, {"type": "ps", "index": 0}), "a sparse cluster"),
    (tf_config({"chief": []}, {"type": "chief"}), "non-empty list"),
    (tf_config({"chief": [2222]}, {"type": "chief"}), "must be a 'host:port' string"),
    (tf_config({"chief": ["h0"]}, {"type": "chief"}), "expected 'host:port'"),
    (tf_config({"chief": ["h0:0"]}, {"type": "chief"}), "port from 1 to 65535"),
    (tf_config({"chief": ["h0:70000"]}, {"type": "chief"}), "port from 1 to 65535"),
    (tf_config({"chief": ["h0:1"], "worker": ["h0:1"]}, {"type": "chief"}), "used twice"),
    (tf_config({"ps": ["h0:1"]}, {"type": "ps"}), "no `chief` or `worker` job"),
    (tf_config(TWO), "`task` must be an object"),
    (tf_config(TWO, "worker"), "`task` must be an object"),
    (tf_config(TWO, {"type": "wrker", "index": 0}), "`task.type` is 'wrker'"),
    (tf_config(TWO, {"index": 0}), "`task.type` is None"),
    (tf_config(TWO, {"type": "worker", "index": "0"}), "`task.index` must be an integer"),
    (tf_config(TWO, {"type": "worker", "index": True}), "`task.index` must be an integer"),
    (tf_config(TWO, {"type": "worker", "index": 1}), "out of range for job 'worker'"),
    (tf_config(TWO, {"type": "worker", "index": -1}), "out of range"),
    (tf_config(TWO, {"type": "ps", "index": 0}), "`cluster` has no such job"),
    (tf_config(TWO, {"type": "evaluator", "index": 1}), "only one evaluator"),
    (tf_config(None, {"type": "worker", "index": 0}), "`cluster` is missing or empty"),
    (tf_config(TWO, {"type": "chief"}, environment=5), "`environment` must be a string"),
]


@pytest.mark.parametrize("raw, fragment", MALFORMED)
def test_fail_with_malformed_tf_config(raw, fragment):
    with pytest.raises(ClusterConfigError) as raised:
        parse_tf_config(raw)
    message = str(raised.value)
    assert fragment in message
    assert message.startswith("Invalid TF_CONFIG: ")
    assert message.endswith(TF_CONFIG_SOURCE_NOTE)
    assert isinstance(raised.value, UsageError) and isinstance(raised.value, ValueError)


def test_error_quotes_the_value_received():
    with pytest.raises(ClusterConfigError, match=r"received 'not json'"):
        parse_tf_config("not json")


def test_config_is_frozen():
    config = parse_tf_config(tf_config(TWO, {"type": "chief"}))
    with pytest.raises(AttributeError):
        config.task_index = 3
    with pytest.raises(TypeError):
        config.jobs["ps"] = ("x:1",)


def test_local_cluster_configs_parse_back():
    cluster = make_local_cluster(3, ports=[2001, 2002, 2003, 2004], num_ps=1, evaluator=True)
    roles = [task.role for task in cluster.tasks]
    assert roles == ["chief-0", "worker-0", "worker-1", "ps-0", "evaluator-0"]
    assert [t.role for t in cluster.training_tasks] == ["chief-0", "worker-0", "worker-1"]
    for task in cluster.tasks:
        assert parse_tf_config(task.to_json()) == ClusterConfig(
            task.jobs, task.task_type, task.task_index
        )
    addresses = [a for task in cluster.tasks[:1] for job in task.jobs.values() for a in job]
    assert addresses == ["localhost:2001", "localhost:2002", "localhost:2003", "localhost:2004"]


def test_local_cluster_gives_each_task_its_tf_config_by_role():
    cluster = make_local_cluster(2, ports=[2001, 2002], evaluator=True, host="10.0.0.1")
    configs = cluster.tf_configs()
    assert list(configs) == ["chief-0", "worker-0", "evaluator-0"]
    for role, raw in configs.items():
        assert json.loads(raw)["cluster"] == {
            "chief": ["10.0.0.1:2001"],
            "worker": ["10.0.0.1:2002"],
        }
        assert parse_tf_config(raw).role == role


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"num_workers": 0, "ports": []}, "num_workers >= 1"),
        ({"num_workers": 2, "ports": [1]}, "expected 2 ports"),
        ({"num_workers": 1, "ports": [1], "num_ps": -1}, "num_ps >= 0"),
    ],
)
def test_fail_with_bad_local_cluster_arguments(kwargs, fragment):
    with pytest.raises(ValueError, match=fragment):
        make_local_cluster(**kwargs)


def test_a_task_reaches_its_peers_directly_when_it_inherited_a_proxy():
    # gRPC honours https_proxy: with it, worker-0's collectives went to the proxy and the chief
    # hung in session creation (a job whose data came through a proxy).
    cluster = ClusterConfig({"chief": ("localhost:2000",), "worker": ("[::1]:2001", "h2:2002")})
    environ = {"https_proxy": "http://127.0.0.1:3128", "NO_PROXY": "corp.example"}
    cluster.keep_peers_direct(environ)
    expected = "corp.example,localhost,::1,h2"
    assert (environ["NO_PROXY"], environ["no_proxy"]) == (expected, expected)
    assert environ["https_proxy"] == "http://127.0.0.1:3128"  # The task's data still uses it.


def test_without_a_proxy_the_environment_is_left_as_it_is():
    environ = {"NO_PROXY": "corp.example"}
    ClusterConfig({"chief": ("h0:2000",)}).keep_peers_direct(environ)
    assert environ == {"NO_PROXY": "corp.example"}
