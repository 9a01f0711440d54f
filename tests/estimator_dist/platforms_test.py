"""Every platform's TF_CONFIG, exactly as the platform writes it, for every role.

Where each shape comes from (read at the commit named; the builders below are
written from that reading, not copied):

* SageMaker, aws/sagemaker-tensorflow-training-toolkit at 18813ea3 (2022-12-06),
  src/sagemaker_tensorflow_container/training.py. With
  `multi_worker_mirrored_strategy` every host is a `worker` on port 8890 and
  nothing else is in `cluster`. With `parameter_server`, the first host is the
  `master` on 2222, every host also runs a `ps` on 2223, the other hosts are
  `worker`s on 2222; jobs in the order master, ps, worker. Both add
  `"environment": "cloud"` after `cluster`, then `task` with `index` before
  `type`, through `json.dumps` with its default separators. The TF_CONFIG
  goes only to the training script's process: the ps are plain
  `tf.distribute.Server`s the toolkit starts itself with the raw cluster
  (`_run_ps`), which is why the package refuses that mode
  (`estimator_dist.cluster.platform_env`). Hosts are `algo-1`, `algo-2`, ...
  (`SM_HOSTS`, `SM_CURRENT_HOST`; aws/sagemaker-training-toolkit at 33839372,
  environment.py, which also writes `SM_FRAMEWORK_PARAMS` as compact JSON).
* Vertex AI: cloud.google.com/vertex-ai/docs/training/distributed-training and
  cloud.google.com/ai-platform/training/docs/distributed-training-details. The
  pools `workerpool0..3` become `chief`, `worker`, `ps`, `evaluator`; the
  evaluator is not in `cluster`; `task` carries `trial` (empty outside
  hyperparameter tuning); `job` is the job spec as a JSON string; compact JSON,
  as in CLUSTER_SPEC values logged by public Vertex jobs (which also show
  `open_ports`). AI Platform Training's older runtimes wrote `master`, a
  `cloud` id in `task` and `job` as an object.
* Kubeflow TFJob: kubeflow/training-operator release-1.9 at 078ec30f,
  pkg/controller.v1/tensorflow/tensorflow.go. Go's encoder: compact, keys
  `cluster`, `task`, `environment` in that order, jobs sorted by name, every
  replica type in `cluster` (the evaluator too), addresses
  `<job>-<type>-<i>.<namespace>.svc:<port>`.
* Ray Train 2.60.0 (installed), ray/train/tensorflow/config.py: `worker` only,
  no `environment`, each address the node's IP and a port found by binding
  port 0 and closing it again; an IPv6 node gets `[addr]:port`.

Already covered elsewhere, so not repeated here: the Kubeflow dialect end to
end with a whole script (script_test.py, the test of tasks whose TF_CONFIG a
platform wrote), TF_CONFIG's normalisations and errors one by one
(cluster/tf_config_test.py), CLUSTER_SPEC and SageMaker's parameter-server mode
(cluster/platform_env_test.py), a malformed TF_CONFIG exiting 2 (train_test.py),
a parameter-server job under the launcher (launch_test.py), SIGTERM on tasks
started by hand (faults_test.py, preemption_test.py).
"""

import json
import os

import pytest
import tensorflow as tf
from tensorflow.python.distribute import distribute_coordinator, estimator_training

from estimator_dist.cluster.tf_config import parse_tf_config
from run_config.run_config import RunConfigOptions, make_run_config
from run_config.strategies import StrategyConfig, make_strategies
from tests.procs import checkpoint_step, free_ports, report, tasks, wait_all

VERTEX_JOB = json.dumps(
    {"python_module": "", "package_uris": [], "job_args": []}, separators=(",", ":")
)


def sagemaker_mwms(workers, index):
    """SageMaker's TF_CONFIG for `multi_worker_mirrored_strategy`: all hosts are workers."""
    config = {"cluster": {"worker": workers}, "environment": "cloud"}
    config["task"] = {"index": index, "type": "worker"}
    return json.dumps(config)


def sagemaker_mwms_hosts(workers, hosts):
    """Each SageMaker host's environment for `multi_worker_mirrored_strategy`, by host name."""
    return {
        host: {
            "TF_CONFIG": sagemaker_mwms(workers, index),
            "SM_HOSTS": json.dumps(hosts, separators=(",", ":")),
            "SM_CURRENT_HOST": host,
            "SM_FRAMEWORK_PARAMS": '{"sagemaker_multi_worker_mirrored_strategy_enabled":true}',
        }
        for index, host in enumerate(hosts)
    }


def sagemaker_ps(master, ps, workers, task_type, index):
    """SageMaker's TF_CONFIG for `parameter_server` (a ps task's as its builder makes it)."""
    config = {"cluster": {"master": [master], "ps": ps, "worker": workers}, "environment": "cloud"}
    config["task"] = {"index": index, "type": task_type}
    return json.dumps(config)


def vertex(cluster, task_type, index, trial=""):
    """Vertex AI's TF_CONFIG: compact, `trial` in `task`, `job` a JSON string."""
    config = {
        "cluster": cluster,
        "environment": "cloud",
        "task": {"type": task_type, "index": index, "trial": trial},
        "job": VERTEX_JOB,
    }
    return json.dumps(config, separators=(",", ":"))


def vertex_cluster_spec(pools, pool, index):
    """Vertex AI's CLUSTER_SPEC, the same cluster under worker pool names."""
    config = {
        "cluster": pools,
        "environment": "cloud",
        "task": {"type": pool, "index": index, "trial": ""},
        "job": VERTEX_JOB,
    }
    return json.dumps(config, separators=(",", ":"))


def ai_platform(cluster, task_type, index):
    """AI Platform Training (runtime 1.x): `master`, a `cloud` id and `trial`, `job` an object."""
    task = {"type": task_type, "index": index, "cloud": "t2a3b4c5d6e7f8-ml", "trial": "1"}
    job = {"scale_tier": "CUSTOM", "master_type": "n1-standard-8", "region": "us-central1"}
    return json.dumps({"cluster": cluster, "environment": "cloud", "job": job, "task": task})


def tfjob(cluster, task_type, index):
    """Kubeflow TFJob: Go's compact encoding, jobs sorted, `environment` last."""
    config = {
        "cluster": dict(sorted(cluster.items())),
        "task": {"type": task_type, "index": index},
        "environment": "cloud",
    }
    return json.dumps(config, separators=(",", ":"))


def ray(workers, index):
    """Ray Train's TensorflowConfig: workers only, no `environment`."""
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


# --- every platform, mode and role: the cluster the package reads ---------------

SM = ["algo-1:8890", "algo-2:8890", "algo-3:8890"]
SM_PS = dict(master="algo-1:2222", ps=["algo-1:2223", "algo-2:2223"], workers=["algo-2:2222"])
VX = {
    "chief": ["cmle-training-workerpool0-9b6f87bcee-0:2222"],
    "worker": [
        "cmle-training-workerpool1-9b6f87bcee-0:2222",
        "cmle-training-workerpool1-9b6f87bcee-1:2222",
    ],
}
VX_PS = {**VX, "ps": ["cmle-training-workerpool2-9b6f87bcee-0:2222"]}
AIP = {"master": ["master-0:2222"], "worker": ["worker-0:2222"], "ps": ["ps-0:2222"]}
KF = {
    "chief": ["mnist-chief-0.default.svc:2222"],
    "evaluator": ["mnist-evaluator-0.default.svc:2222"],
    "worker": ["mnist-worker-0.default.svc:2222"],
}
KF_MASTER = {
    "master": ["mnist-master-0.default.svc:2222"],
    "ps": ["mnist-ps-0.default.svc:2222"],
    "worker": ["mnist-worker-0.default.svc:2222"],
}
RAY = ["10.0.0.5:41234", "10.0.0.6:38111"]
RAY6 = ["[fd00::5]:41234", "[fd00::6]:38111"]

SM_JOBS = {"chief": SM[:1], "worker": SM[1:]}
SM_PS_JOBS = {"chief": ["algo-1:2222"], "worker": ["algo-2:2222"], "ps": SM_PS["ps"]}
AIP_JOBS = {"chief": AIP["master"], "worker": AIP["worker"], "ps": AIP["ps"]}
KF_JOBS = {"chief": KF["chief"], "worker": KF["worker"]}
RAY_JOBS = {"chief": RAY[:1], "worker": RAY[1:]}
RAY6_JOBS = {"chief": RAY6[:1], "worker": RAY6[1:]}
KF_MASTER_JOBS = {
    "chief": KF_MASTER["master"],
    "worker": KF_MASTER["worker"],
    "ps": KF_MASTER["ps"],
}

MWMS, PS = "multi_worker_mirrored", "parameter_server"


def sm_ps(task_type, index):
    return sagemaker_ps(**SM_PS, task_type=task_type, index=index)


# (platform-mode-role, TF_CONFIG, role expected, chief?, cluster expected). The mode is the
# strategy the job runs: `ps` parameter servers, anything else MultiWorkerMirroredStrategy.
SHAPES = [
    ("sagemaker-mwms-worker0", sagemaker_mwms(SM, 0), "chief-0", True, SM_JOBS),
    ("sagemaker-mwms-worker1", sagemaker_mwms(SM, 1), "worker-0", False, SM_JOBS),
    ("sagemaker-mwms-worker2", sagemaker_mwms(SM, 2), "worker-1", False, SM_JOBS),
    ("sagemaker-ps-master", sm_ps("master", 0), "chief-0", True, SM_PS_JOBS),
    ("sagemaker-ps-worker", sm_ps("worker", 0), "worker-0", False, SM_PS_JOBS),
    ("sagemaker-ps-ps1", sm_ps("ps", 1), "ps-1", False, SM_PS_JOBS),
    ("vertex-mwms-chief", vertex(VX, "chief", 0), "chief-0", True, VX),
    ("vertex-mwms-worker1", vertex(VX, "worker", 1), "worker-1", False, VX),
    ("vertex-mwms-evaluator", vertex(VX, "evaluator", 0), "evaluator-0", False, VX),
    ("vertex-tuning-worker0", vertex(VX, "worker", 0, trial="3"), "worker-0", False, VX),
    ("vertex-ps-chief", vertex(VX_PS, "chief", 0), "chief-0", True, VX_PS),
    ("vertex-ps-ps0", vertex(VX_PS, "ps", 0), "ps-0", False, VX_PS),
    ("vertex-ps-evaluator", vertex(VX_PS, "evaluator", 0), "evaluator-0", False, VX_PS),
    ("aiplatform-ps-master", ai_platform(AIP, "master", 0), "chief-0", True, AIP_JOBS),
    ("aiplatform-ps-worker", ai_platform(AIP, "worker", 0), "worker-0", False, AIP_JOBS),
    ("aiplatform-ps-ps", ai_platform(AIP, "ps", 0), "ps-0", False, AIP_JOBS),
    ("aiplatform-ps-evaluator", ai_platform(AIP, "evaluator", 0), "evaluator-0", False, AIP_JOBS),
    ("tfjob-mwms-chief", tfjob(KF, "chief", 0), "chief-0", True, KF_JOBS),
    ("tfjob-mwms-worker", tfjob(KF, "worker", 0), "worker-0", False, KF_JOBS),
    ("tfjob-mwms-evaluator", tfjob(KF, "evaluator", 0), "evaluator-0", False, KF_JOBS),
    ("tfjob-ps-master", tfjob(KF_MASTER, "master", 0), "chief-0", True, KF_MASTER_JOBS),
    ("tfjob-ps-ps", tfjob(KF_MASTER, "ps", 0), "ps-0", False, KF_MASTER_JOBS),
    ("ray-mwms-worker0", ray(RAY, 0), "chief-0", True, RAY_JOBS),
    ("ray-mwms-worker1", ray(RAY, 1), "worker-0", False, RAY_JOBS),
    ("ray-ipv6-worker1", ray(RAY6, 1), "worker-0", False, RAY6_JOBS),
]


def shapes():
    """Each shape as (TF_CONFIG, strategy, role, chief?, cluster, environment)."""
    return [
        pytest.param(
            raw,
            PS if name.split("-")[1] == "ps" else MWMS,
            role,
            is_chief,
            jobs,
            None if name.startswith("ray") else "cloud",
            id=name,
        )
        for name, raw, role, is_chief, jobs in SHAPES
    ]


@pytest.mark.parametrize("raw, strategy, role, is_chief, jobs, environment", shapes())
def test_each_platform_shape_gives_the_role_and_cluster_tensorflow_needs(
    raw, strategy, role, is_chief, jobs, environment
):
    config = parse_tf_config(raw)
    assert (config.role, config.is_chief) == (role, is_chief)
    assert {name: list(addresses) for name, addresses in config.jobs.items()} == jobs
    assert config.num_workers == len(jobs["chief"]) + len(jobs.get("worker", []))
    assert config.num_ps == len(jobs.get("ps", []))
    assert config.environment == environment
    # What TensorFlow is given: TensorFlow's own names, no evaluator in `cluster`, nothing else.
    given = json.loads(config.to_json())
    assert set(given["cluster"]) <= {"chief", "worker", "ps"}
    assert given["task"] == {"type": config.task_type, "index": config.task_index}
    assert set(given) <= {"cluster", "task", "environment"}


def test_every_task_of_a_job_gets_the_same_cluster():
    clusters = {}
    for name, raw, *_ in SHAPES:
        job = name.rsplit("-", 1)[0]  # e.g. `sagemaker-ps` for `sagemaker-ps-master`
        clusters.setdefault(job, set()).add(json.dumps(dict(parse_tf_config(raw).jobs)))
    assert {job: len(found) for job, found in clusters.items()} == dict.fromkeys(clusters, 1)
    assert len(clusters) == 10


def run_config_of(monkeypatch, config, strategies):
    """The RunConfig this task's Estimator trains or evaluates with.

    The driver builds it with TF_CONFIG set to the normalised cluster; Estimator
    then runs the distribute coordinator, which gives each task its own copy
    filled from that task's worker context (TensorFlow's `estimator_training`).
    No server starts: only the objects are built.
    """
    monkeypatch.setenv("TF_CONFIG", config.to_json())
    run_config = make_run_config(
        RunConfigOptions(model_dir="/tmp/unused", save_checkpoints_steps=10),
        strategies.train_distribute,
        strategies.eval_distribute,
    )
    assert run_config._distribute_coordinator_mode == "independent_worker"
    evaluating = config.task_type == "evaluator"
    context = distribute_coordinator._WorkerContext(
        strategies.eval_distribute if evaluating else strategies.train_distribute,
        run_config._cluster_spec,
        config.task_type,
        config.task_index,
    )
    # TensorFlow 2.15's own glue, or estimator_dist.tf_runtime.coordinator on 2.16+.
    fill = getattr(estimator_training, "_init_run_config_from_worker_context", None)
    (fill or estimator_training.fill_from_worker_context)(run_config, context)
    return run_config


@pytest.mark.usefixtures("patches_installed")
@pytest.mark.parametrize("raw, strategy, role, is_chief, jobs, environment", shapes())
def test_each_role_gets_its_strategy_and_run_config(
    monkeypatch, raw, strategy, role, is_chief, jobs, environment
):
    config = parse_tf_config(raw)
    strategies = make_strategies(StrategyConfig(strategy, "ring"), "mirrored", config, num_gpus=0)
    if config.task_type == "evaluator":
        # Outside the cluster: a local strategy, never MultiWorkerMirroredStrategy.
        assert type(strategies.train_distribute) is tf.distribute.MirroredStrategy
    elif strategy == MWMS:
        assert isinstance(strategies.train_distribute, tf.distribute.MultiWorkerMirroredStrategy)
        assert strategies.effective_communication == "RING"
    else:
        assert isinstance(
            strategies.train_distribute,
            tf.compat.v1.distribute.experimental.ParameterServerStrategy,
        )
    assert isinstance(strategies.eval_distribute, tf.distribute.MirroredStrategy)
    if config.task_type == "ps":
        return  # The coordinator only runs a server there; no RunConfig trains.
    run_config = run_config_of(monkeypatch, config, strategies)
    assert (run_config.task_type, run_config.task_id) == (config.task_type, config.task_index)
    # TensorFlow's rule: an evaluator is the chief of its own one-task evaluation (it writes
    # the eval summaries); it never trains, so it never writes a training checkpoint.
    assert run_config.is_chief == (is_chief or config.task_type == "evaluator")
    if config.task_type == "evaluator":
        assert (run_config.num_worker_replicas, run_config.cluster_spec.as_dict()) == (0, {})
    else:
        assert run_config.num_worker_replicas == config.num_workers
        assert run_config.num_ps_replicas == config.num_ps
        assert run_config.master == "grpc://" + jobs[config.task_type][config.task_index]


# --- real jobs, tasks started by hand with the platform's TF_CONFIG --------------

TIMEOUT = 240
STEPS = 60


def train_args(model_dir, data_dir, *extra):
    return [
        f"--model_dir={model_dir}",
        f"--data_dir={data_dir}",
        f"--train_steps={STEPS}",
        "--save_checkpoints_steps=30",
        "--log_step_count_steps=10",
        "--eval_throttle_secs=1",
        *extra,
    ]


def all_exit_0(procs, names):
    codes = wait_all(procs, names, TIMEOUT)
    assert codes == {name: 0 for name in names}, report(f"exit codes {codes}, expected 0", procs)


def local(count):
    return [f"localhost:{port}" for port in free_ports(count)]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_sagemaker_multi_worker_mirrored_job_of_two_workers(tmp_path, data_dir):
    workers = local(2)
    hosts = ["algo-1", "algo-2"]
    environments = sagemaker_mwms_hosts(workers, hosts)
    with tasks(environments, train_args(tmp_path, data_dir)) as procs:
        all_exit_0(procs, hosts)
    assert checkpoint_step(tmp_path) == STEPS, report("final checkpoint step", procs)
    record = json.load(open(os.path.join(tmp_path, "run_record.json")))
    assert (record["role"], record["num_workers"], record["num_replicas"]) == ("chief-0", 2, 2)
    assert record["cluster"] == {"chief": workers[:1], "worker": workers[1:]}
    for host in hosts:
        assert "promoted worker 0 to chief" in procs[host].output, report(f"{host}: no note", procs)


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_vertex_chief_worker_and_evaluator_job(tmp_path, data_dir):
    chief, worker, evaluator = local(3)
    cluster = {"chief": [chief], "worker": [worker]}
    pools = {"workerpool0": [chief], "workerpool1": [worker], "workerpool3": [evaluator]}
    roles = {
        "chief": ("workerpool0", 0),
        "worker": ("workerpool1", 0),
        "evaluator": ("workerpool3", 0),
    }
    environments = {
        role: {
            "TF_CONFIG": vertex(cluster, role, 0),
            "CLUSTER_SPEC": vertex_cluster_spec(pools, *roles[role]),
        }
        for role in roles
    }
    with tasks(environments, train_args(tmp_path, data_dir)) as procs:
        all_exit_0(procs, roles)
    assert checkpoint_step(tmp_path) == STEPS, report("final checkpoint step", procs)
    final = json.load(open(os.path.join(tmp_path, "eval_metrics.json")))
    assert final["final"] and final["metrics"]["global_step"] == STEPS, report(f"{final}", procs)
    assert final["metrics"]["accuracy"] > 0.3, report(f"{final}", procs)
    assert f"Final evaluation: global_step={STEPS}, accuracy=" in procs["evaluator"].output


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT + 60)
def test_sagemaker_parameter_server_shape_with_every_task_running_the_package(tmp_path, data_dir):
    # SageMaker itself runs its ps as bare TensorFlow servers, a mode the package refuses
    # (cluster/platform_env_test.py); here every task, the ps included, runs the package with
    # the toolkit's TF_CONFIG: `master` becomes `chief` the same way on all four.
    master, worker, ps0, ps1 = local(4)
    shape = dict(master=master, ps=[ps0, ps1], workers=[worker])
    roles = {"master": ("master", 0), "worker": ("worker", 0), "ps0": ("ps", 0), "ps1": ("ps", 1)}
    environments = {
        name: {"TF_CONFIG": sagemaker_ps(**shape, task_type=t, index=i)}
        for name, (t, i) in roles.items()
    }
    args = train_args(tmp_path, data_dir, "--distribution_strategy=parameter_server")
    with tasks(environments, args) as procs:
        all_exit_0(procs, ["master", "worker"])
        serving = {name: procs[name].process.poll() for name in ("ps0", "ps1")}
        for name in ("ps0", "ps1"):
            procs[name].wait_for_line(r"TF_CONFIG: renamed job 'master' to 'chief'", 10)
    assert serving == {"ps0": None, "ps1": None}, report(f"ps exits {serving}", procs)
    step = checkpoint_step(tmp_path)
    assert STEPS <= step <= STEPS + 2, report(f"final checkpoint step {step}", procs)
    record = json.load(open(os.path.join(tmp_path, "run_record.json")))
    assert (record["role"], record["strategy"], record["num_ps"]) == (
        "chief-0",
        "parameter_server",
        2,
    )
    assert record["cluster"] == {"chief": [master], "worker": [worker], "ps": [ps0, ps1]}
