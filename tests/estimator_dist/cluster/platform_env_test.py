"""The cluster read from a platform's environment: TF_CONFIG, CLUSTER_SPEC, SageMaker's mode.

The shapes are the platforms' own (see tests/estimator_dist/platforms_test.py for
where each comes from): Vertex AI writes CLUSTER_SPEC as compact JSON with a
`job` that is itself a JSON string, and sometimes `open_ports`.
"""

import json

import pytest

from estimator_dist.base.errors import ClusterConfigError, UsageError
from estimator_dist.cluster import pod_env
from estimator_dist.cluster.platform_env import (
    CLUSTER_SPEC_NOTE,
    CLUSTER_SPEC_SOURCE_NOTE,
    cluster_from_environment,
    parse_cluster_spec,
)
from estimator_dist.cluster.tf_config import TF_CONFIG_SOURCE_NOTE, ClusterConfig

POOLS = {
    "workerpool0": ["cmle-training-workerpool0-ab12-0:2222"],
    "workerpool1": [
        "cmle-training-workerpool1-ab12-0:2222",
        "cmle-training-workerpool1-ab12-1:2222",
    ],
    "workerpool2": ["cmle-training-workerpool2-ab12-0:2222"],
    "workerpool3": ["cmle-training-workerpool3-ab12-0:2222"],
}
JOB = json.dumps({"python_module": "", "package_uris": [], "job_args": []}, separators=(",", ":"))


def cluster_spec(pool, index, pools=None, **extra):
    """CLUSTER_SPEC as Vertex AI writes it: compact, `job` a JSON string."""
    data = {
        "cluster": POOLS if pools is None else pools,
        "environment": "cloud",
        "task": {"type": pool, "index": index, "trial": ""},
        "job": JOB,
        **extra,
    }
    return json.dumps(data, separators=(",", ":"))


@pytest.mark.parametrize(
    "pool, index, role, is_chief",
    [
        ("workerpool0", 0, "chief-0", True),
        ("workerpool1", 0, "worker-0", False),
        ("workerpool1", 1, "worker-1", False),
        ("workerpool2", 0, "ps-0", False),
        ("workerpool3", 0, "evaluator-0", False),
    ],
)
def test_cluster_spec_pools_become_tensorflow_jobs(pool, index, role, is_chief):
    config = parse_cluster_spec(cluster_spec(pool, index, open_ports=[3333]))
    assert (config.role, config.is_chief) == (role, is_chief)
    assert dict(config.jobs) == {
        "chief": ("cmle-training-workerpool0-ab12-0:2222",),
        "worker": (
            "cmle-training-workerpool1-ab12-0:2222",
            "cmle-training-workerpool1-ab12-1:2222",
        ),
        "ps": ("cmle-training-workerpool2-ab12-0:2222",),
    }
    assert (config.num_workers, config.num_ps, config.environment) == (3, 1, "cloud")
    assert config.notes[0] == CLUSTER_SPEC_NOTE
    assert "took 'evaluator' out of the cluster" in config.notes[1]


def test_cluster_spec_is_read_only_when_tf_config_names_no_cluster():
    spec = cluster_spec("workerpool1", 1)
    tf_config = json.dumps(
        {"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, "task": {"type": "worker"}}
    )
    from_tf_config = cluster_from_environment({"TF_CONFIG": tf_config, "CLUSTER_SPEC": spec})
    assert from_tf_config.role == "worker-0" and CLUSTER_SPEC_NOTE not in from_tf_config.notes
    for unset in ({}, {"TF_CONFIG": ""}, {"TF_CONFIG": "{}"}):
        assert cluster_from_environment({**unset, "CLUSTER_SPEC": spec}).role == "worker-1"


@pytest.mark.parametrize("environ", [{}, {"TF_CONFIG": "  "}, {"CLUSTER_SPEC": ""}])
def test_nothing_set_is_one_process(environ):
    assert cluster_from_environment(environ) == ClusterConfig()


def test_a_single_pool_job_is_a_chief_only_cluster():
    config = parse_cluster_spec(cluster_spec("workerpool0", 0, {"workerpool0": ["h0:2222"]}))
    assert (config.role, config.num_workers, dict(config.jobs)) == (
        "chief-0",
        1,
        {"chief": ("h0:2222",)},
    )


@pytest.mark.parametrize(
    "raw, fragment",
    [
        ("{oops", "not valid JSON"),
        ('["workerpool0"]', "expected an object with `cluster`"),
        ('{"cluster": {"workerpool0": ["h:1"]}}', "expected an object with `cluster`"),
        (cluster_spec("workerpool4", 0), "unknown worker pool(s) 'workerpool4'"),
        (cluster_spec("chief", 0), "unknown worker pool(s) 'chief'"),
        (cluster_spec("workerpool1", 2), "`task.index` 2 is out of range for job 'worker'"),
        (
            cluster_spec("workerpool0", 0, {**POOLS, "workerpool3": ["e:1", "f:1"]}),
            "`cluster.evaluator` must have exactly one address",
        ),
    ],
)
def test_fail_with_malformed_cluster_spec(raw, fragment):
    with pytest.raises(ClusterConfigError) as raised:
        cluster_from_environment({"CLUSTER_SPEC": raw})
    message = str(raised.value)
    assert fragment in message
    assert message.startswith("Invalid CLUSTER_SPEC: ")
    assert message.endswith(CLUSTER_SPEC_SOURCE_NOTE)
    assert TF_CONFIG_SOURCE_NOTE not in message
    assert isinstance(raised.value, UsageError)


def sagemaker_ps_master():
    """The TF_CONFIG the SageMaker toolkit gives the master in parameter-server mode."""
    cluster = {
        "master": ["algo-1:2222"],
        "ps": ["algo-1:2223", "algo-2:2223"],
        "worker": ["algo-2:2222"],
    }
    return json.dumps(
        {"cluster": cluster, "environment": "cloud", "task": {"index": 0, "type": "master"}}
    )


@pytest.mark.parametrize(
    "enabled",
    [
        '{"sagemaker_parameter_server_enabled":true}',
        '{"sagemaker_parameter_server_enabled":"True"}',
    ],
)
def test_fail_with_sagemaker_parameter_server_distribution(enabled):
    environ = {"TF_CONFIG": sagemaker_ps_master(), "SM_FRAMEWORK_PARAMS": enabled}
    with pytest.raises(ClusterConfigError) as raised:
        cluster_from_environment(environ)
    message = str(raised.value)
    assert "SM_FRAMEWORK_PARAMS has sagemaker_parameter_server_enabled=true" in message
    assert "lists 2 ps task(s)" in message
    assert '{"multi_worker_mirrored_strategy": {"enabled": True}}' in message


@pytest.mark.parametrize(
    "params", [None, "{}", '{"sagemaker_multi_worker_mirrored_strategy_enabled":true}', "not json"]
)
def test_the_same_tf_config_without_sagemakers_ps_mode_runs(params):
    environ = {"TF_CONFIG": sagemaker_ps_master()}
    if params is not None:
        environ["SM_FRAMEWORK_PARAMS"] = params
    config = cluster_from_environment(environ)
    assert (config.role, config.num_ps) == ("chief-0", 2)


# The pods of a JobSet (or a Kubeflow Trainer v2 TrainJob) and of plain Indexed Jobs: the
# environment the manifests of estimator_dist.manifest give them (pod_env.py).


def jobset_pod(group, index, replicas="chief=1,worker=2,ps=1,evaluator=1", **extra):
    """A JobSet pod's environment: JobSet's labels through the downward API, the literals."""
    env = {
        "ESTIMATOR_DIST_REPLICAS": replicas,
        "ESTIMATOR_DIST_SUBDOMAIN": "mnist",
        "ESTIMATOR_DIST_PORT": "2222",
        "ESTIMATOR_DIST_REPLICATED_JOB": group,
        "ESTIMATOR_DIST_JOBSET": "mnist",
        "ESTIMATOR_DIST_JOB_INDEX": "0",
        "JOB_COMPLETION_INDEX": str(index),
        "HOSTNAME": f"mnist-{group}-0-{index}",
    }
    env.update(extra)
    return {key: value for key, value in env.items() if value is not None}


@pytest.mark.parametrize(
    "group, index, role",
    [
        ("train", 0, "chief-0"),
        ("train", 1, "worker-0"),
        ("train", 2, "worker-1"),
        ("ps", 0, "ps-0"),
        ("evaluator", 0, "evaluator-0"),
    ],
)
def test_every_jobset_pod_builds_the_same_cluster_from_its_labels(group, index, role):
    config = cluster_from_environment(jobset_pod(group, index))
    assert config.role == role
    assert dict(config.jobs) == {
        "chief": ("mnist-train-0-0.mnist:2222",),
        "worker": ("mnist-train-0-1.mnist:2222", "mnist-train-0-2.mnist:2222"),
        "ps": ("mnist-ps-0-0.mnist:2222",),
    }
    assert config.notes[0] == pod_env.POD_NOTE.format(source="JobSet's labels")


def test_an_indexed_job_pod_builds_its_cluster_from_the_job_names():
    env = jobset_pod(
        "train",
        1,
        replicas="chief=1,worker=1,evaluator=1",
        ESTIMATOR_DIST_JOBSET=None,
        ESTIMATOR_DIST_JOB_INDEX=None,
        ESTIMATOR_DIST_NAME="mnist",
        HOSTNAME="mnist-train-1",
    )
    config = cluster_from_environment(env)
    assert config.role == "worker-0"
    assert dict(config.jobs) == {
        "chief": ("mnist-train-0.mnist:2222",),
        "worker": ("mnist-train-1.mnist:2222",),
    }
    evaluator = dict(env, ESTIMATOR_DIST_REPLICATED_JOB="evaluator", JOB_COMPLETION_INDEX="0")
    evaluator["HOSTNAME"] = "mnist-evaluator-0"
    assert cluster_from_environment(evaluator).role == "evaluator-0"


def test_an_explicit_tf_config_wins_over_the_pod_environment():
    tf_config = json.dumps({"cluster": {"chief": ["a:1"]}, "task": {"type": "chief", "index": 0}})
    env = jobset_pod("train", 1, TF_CONFIG=tf_config)
    assert dict(cluster_from_environment(env).jobs) == {"chief": ("a:1",)}
    # Without the manifest's variables nothing is built: a single process.
    assert not cluster_from_environment({"JOB_COMPLETION_INDEX": "1"}).is_distributed


@pytest.mark.parametrize(
    "changes, variable, received, source",
    [
        ({"JOB_COMPLETION_INDEX": None}, "JOB_COMPLETION_INDEX", "is unset", "completionMode"),
        ({"ESTIMATOR_DIST_REPLICATED_JOB": None}, "REPLICATED_JOB", "is unset", "replicatedjob"),
        ({"ESTIMATOR_DIST_REPLICATED_JOB": "worker"}, "REPLICATED_JOB", "'worker'", "literal"),
        ({"ESTIMATOR_DIST_JOBSET": ""}, "ESTIMATOR_DIST_JOBSET", "''", "jobset-name"),
        ({"ESTIMATOR_DIST_JOB_INDEX": "1"}, "JOB_INDEX", "'1'", "job-index"),
        ({"ESTIMATOR_DIST_SUBDOMAIN": None}, "SUBDOMAIN", "is unset", "network.subdomain"),
        ({"ESTIMATOR_DIST_PORT": "http"}, "ESTIMATOR_DIST_PORT", "'http'", "container port"),
        ({"ESTIMATOR_DIST_REPLICAS": "chief=1,gpu=2"}, "REPLICAS", "gpu=2", "a literal"),
        ({"ESTIMATOR_DIST_REPLICAS": "worker=2"}, "REPLICAS", "worker=2", "a literal"),
        ({"JOB_COMPLETION_INDEX": "3"}, "JOB_COMPLETION_INDEX", "'3'", "completions"),
        ({"HOSTNAME": "mnist-train-0-1-x7k2p"}, "HOSTNAME", "x7k2p", "enableDNSHostnames"),
    ],
)
def test_a_missing_or_wrong_piece_exits_2_naming_it_and_its_manifest_field(
    changes, variable, received, source
):
    with pytest.raises(ClusterConfigError) as raised:
        cluster_from_environment(jobset_pod("train", 1, **changes))
    message = str(raised.value)
    assert raised.value.exit_code == 2
    assert variable in message and received in message and source in message
    assert message.endswith(pod_env.FIX)
