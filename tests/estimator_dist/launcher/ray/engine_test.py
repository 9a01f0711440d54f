"""The launcher's Ray engine: its settings as units, then real jobs on a real Ray cluster.

The end-to-end tests share one Ray cluster of `NODES` nodes of one CPU each,
made in this process with `ray.cluster_utils.Cluster` (every node on this
machine, each with its own raylet); the launcher runs as a subprocess, a Ray
driver with `--ray_address`, and its tasks are real TensorFlow processes.
A test that removes a node adds nodes back first thing in the next test
(`nodes`).
"""

import doctest
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from estimator_dist.base import exit_codes
from estimator_dist.base.errors import ClusterTimeoutError, UsageError
from estimator_dist.cluster.tf_config import make_local_cluster
from estimator_dist.config.shape import JobShape
from estimator_dist.launcher import launch_flags, restarts, task_start
from estimator_dist.launcher.exits import Failure
from estimator_dist.launcher.ray import actor as ray_actor
from estimator_dist.launcher.ray import engine as ray_engine
from estimator_dist.launcher.ray import settings as ray_settings
from estimator_dist.launcher.ray.actor import hold_port
from estimator_dist.launcher.ray.settings import INSTALL_HINT, RaySettings
from estimator_dist.launcher.restarts import RestartSettings, run_with_restarts
from tests.procs import REPO, Background, alive, measured_exits, report, run_module, started_pids

#: Nodes of the shared cluster: the head and two more.
NODES = 3
#: TensorFlow's line for a started gRPC server, in each task's log.
SERVER_LINE = "Started server with target: grpc://{address}"
#: The engine's line for each task's actor.
PLACED = re.compile(
    r"\[launcher\] Ray: (\S+) on Ray node (\S+) \(node ([0-9a-f]{8})\)"
    r"(?:, holding port (\d+)|, no port)"
)


# --- settings, no process started ------------------------------------------------


def test_docstring_examples_hold():
    for module in (ray_settings, ray_engine, ray_actor, task_start, launch_flags):
        assert doctest.testmod(module).failed == 0, module.__name__


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        ({"address": " "}, "--engine=ray needs --ray_address"),
        ({"address": "ray://head:10001"}, "is a Ray Client address"),
        (
            {"placement": "STRICT_PACK"},
            "--ray_placement must be one of STRICT_SPREAD, SPREAD, PACK",
        ),
        ({"cpus_per_task": 0}, "--ray_cpus_per_task must be more than 0, received 0"),
        ({"gpus_per_task": -1}, "--ray_gpus_per_task must be 0 or more, received -1"),
        ({"placement_timeout_secs": 0}, "--ray_placement_timeout_secs must be more than 0"),
    ],
)
def test_bad_settings_are_usage_errors_that_name_the_flag(kwargs, fragment):
    with pytest.raises(UsageError, match=re.escape(fragment)):
        RaySettings(**{"address": "10.0.0.1:6379", **kwargs})


def test_settings_are_normalised_and_make_the_bundle():
    settings = RaySettings(" 10.0.0.1:6379 ", placement="pack", cpus_per_task=2, gpus_per_task=1)
    assert (settings.address, settings.placement) == ("10.0.0.1:6379", "PACK")
    assert settings.bundle == {"CPU": 2, "GPU": 1}
    assert RaySettings("auto").bundle == {"CPU": 1.0}


def test_job_shape_lists_tasks_in_the_order_of_the_cluster():
    assert JobShape(3, 2, False).tasks() == [
        ("chief", 0),
        ("worker", 0),
        ("worker", 1),
        ("ps", 0),
        ("ps", 1),
    ]


def test_cluster_names_each_node_and_the_port_its_actor_holds():
    tasks = JobShape(2, 1, True).tasks()
    locations = [
        {"ip": "10.0.0.1", "port": 41001},
        {"ip": "10.0.0.2", "port": 41002},
        {"ip": "10.0.0.3", "port": 41003},
        {"ip": "10.0.0.4", "port": None},
    ]
    cluster = ray_engine.cluster_of(tasks, locations)
    assert [task.role for task in cluster.tasks] == ["chief-0", "worker-0", "ps-0", "evaluator-0"]
    assert json.loads(cluster.tasks[1].to_json())["cluster"] == {
        "chief": ["10.0.0.1:41001"],
        "worker": ["10.0.0.2:41002"],
        "ps": ["10.0.0.3:41003"],
    }


def test_a_held_port_refuses_plain_binds_and_ephemeral_picks():
    held = hold_port("127.0.0.1")
    port = held.getsockname()[1]
    try:
        with socket.socket() as other, pytest.raises(OSError, match="Address already in use"):
            other.bind(("127.0.0.1", port))
        picked = []
        for _ in range(50):
            with socket.socket() as other:
                other.bind(("127.0.0.1", 0))
                picked.append(other.getsockname()[1])
        assert port not in picked
    finally:
        held.close()


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(120)
def test_tensorflow_binds_the_port_an_actor_holds():
    held = hold_port("127.0.0.1")
    port = held.getsockname()[1]
    code = (
        "import tensorflow as tf\n"
        f"spec = tf.train.ClusterSpec({{'worker': ['localhost:{port}']}})\n"
        "tf.distribute.Server(spec, job_name='worker', task_index=0, start=True)\n"
        "print('server started')\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=100
        )
    finally:
        held.close()
    assert done.returncode == 0 and "server started" in done.stdout, done.stderr[-3000:]
    assert f"Started server with target: grpc://localhost:{port}" in done.stderr


class StubLauncher:
    """Stands in for `supervise.Launcher` in the restart loop: attempt N ends with `results[N]`."""

    def __init__(self, results, on_start=None):
        self.results, self.on_start = list(results), on_start
        self.lines, self.attempts = [], []
        self.failed_at, self.last_step_seen, self.evaluator_restarts = None, 0, []
        self.resumed_steps = {}
        self.nothing_evaluated = False
        self.checkpoint_step = lambda: 0

    def say(self, line):
        self.lines.append(line)

    def start(self, tasks, attempt):
        self.attempts.append(attempt)
        if self.on_start:
            self.on_start(attempt)

    def supervise(self, *args, **kwargs):
        return self.results.pop(0)

    def stop(self, grace_secs):
        pass


def restart_settings():
    return RestartSettings(max_restarts=2, finish_timeout=1, grace_secs=1, evaluator=False)


def test_a_cluster_that_cannot_be_placed_ends_the_job_with_its_code(tmp_path, monkeypatch):
    monkeypatch.setattr(restarts.time, "sleep", lambda secs: None)
    launcher = StubLauncher([Failure("worker-0 was killed by SIGKILL", 137)])

    def new_cluster(attempt):
        if attempt:
            raise ClusterTimeoutError("2 alive Ray node(s) have the resources of one task")
        return make_local_cluster(2, [20001, 20002])

    code = run_with_restarts(launcher, new_cluster, str(tmp_path), 10, None, restart_settings())
    assert code == exit_codes.CLUSTER_TIMEOUT
    assert launcher.attempts == [0]
    assert launcher.lines[-1] == (
        "job failed: 2 alive Ray node(s) have the resources of one task; 1 failed attempt(s)"
    )


def test_a_restart_clears_the_stopped_attempts_preemption_decision(tmp_path, monkeypatch):
    # A chief stopped while its peer was gone decided to stop at step 125, past the
    # checkpoint; a restarted worker reading it before the new chief clears it would obey.
    monkeypatch.setattr(restarts.time, "sleep", lambda secs: None)
    decisions = tmp_path / "preemption"
    decisions.mkdir()
    (decisions / "decision.json").write_text('{"stop_at": 125, "requested_by": "chief-0"}')
    seen = []
    launcher = StubLauncher(
        [Failure("worker-0 was killed by SIGKILL", 137), None],
        on_start=lambda attempt: seen.append(decisions.exists()),
    )

    def new_cluster(attempt):
        return make_local_cluster(2, [20001, 20002])

    code = run_with_restarts(launcher, new_cluster, str(tmp_path), 0, None, restart_settings())
    assert code == exit_codes.OK
    assert seen == [True, False]


def launcher_fails(args, timeout=60, env=None):
    """Runs the launcher expecting a failure before any task; returns its output."""
    run = run_module("estimator_dist.launch", args, timeout, env=env, check=False)
    assert "Traceback" not in run.output, run.describe()
    assert "started" not in run.output, run.describe()
    return run


@pytest.mark.multiprocess
@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--engine=ray", "--", "--model_dir=/tmp/x"], "--engine=ray needs --ray_address"),
        (["--engine=ray", "--ray_address=h:1", "--"], "--engine=ray needs --model_dir after '--'"),
        (["--ray_placement=PACK", "--"], "--ray_placement is a flag of --engine=ray"),
        (["--engine=ray", "--ray_address=h:1", "--nopin_cores", "--"], "--pin_cores is a flag"),
        (["--engine=ray", "--ray_address=h:1", "--ray_placement=ANY", "--"], "ray_placement"),
    ],
)
def test_usage_errors_exit_2_before_anything_starts(tmp_path, args, fragment):
    run = launcher_fails(args)
    assert run.returncode == exit_codes.USAGE, run.describe()
    assert fragment in run.output, run.describe()


@pytest.mark.multiprocess
@pytest.mark.timeout(100)
def test_without_ray_installed_the_error_says_how_to_install_it(tmp_path):
    fake = tmp_path / "fake" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named ray (test)')\n")
    env = {"PYTHONPATH": f"{fake.parent}{os.pathsep}{REPO}"}
    run = launcher_fails(["--engine=ray", "--ray_address=h:1", "--", "--model_dir=/x"], env=env)
    assert run.returncode == exit_codes.USAGE, run.describe()
    assert INSTALL_HINT in run.output
    # The local engine never imports Ray.
    code = "import sys, estimator_dist.launch; print(sorted(m for m in sys.modules if m == 'ray'))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=90
    )
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stderr[-2000:]


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(150)
def test_no_cluster_at_the_address_fails_at_once_with_151(tmp_path, data_dir):
    with socket.socket() as closed:  # A port nobody listens on.
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
    args = ["--engine=ray", f"--ray_address={address}", "--"]
    run = launcher_fails([*args, f"--model_dir={tmp_path}/m", f"--data_dir={data_dir}"], 120)
    assert run.returncode == exit_codes.CLUSTER_TIMEOUT, run.describe()
    assert f"no Ray cluster answers at --ray_address={address}" in run.output


# --- real jobs on a Ray cluster ---------------------------------------------------


@pytest.fixture(scope="module")
def ray_cluster(request):
    """A Ray cluster of `NODES` one-CPU nodes on this machine, shared by the module's tests."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    request.addfinalizer(cluster.shutdown)
    return cluster


@pytest.fixture
def nodes(ray_cluster):
    """The shared cluster with `NODES` alive nodes, adding back those a test removed."""
    while len(ray_cluster.worker_nodes) + 1 < NODES:
        ray_cluster.add_node(num_cpus=1)
    ray_cluster.wait_for_nodes()
    return ray_cluster


def ray_job(cluster, tmp_path, data_dir, launcher_args, train_args):
    """The launcher's arguments for a job on `cluster`, and its model_dir."""
    model_dir = str(tmp_path / "model")
    args = [
        "--engine=ray",
        f"--ray_address={cluster.address}",
        "--timeout_secs=280",
        *launcher_args,
        "--",
        f"--model_dir={model_dir}",
        f"--data_dir={data_dir}",
        "--eval_throttle_secs=1",
        *train_args,
    ]
    return args, model_dir


def placed(output):
    """Each task's placement in one attempt: role -> (ip, node id prefix, held port or None)."""
    return {
        role: (ip, node, int(port) if port else None)
        for role, ip, node, port in PLACED.findall(output)
    }


def checkpoint_step(model_dir):
    with open(os.path.join(model_dir, "checkpoint")) as stream:
        return int(re.search(r'model_checkpoint_path: "model\.ckpt-(\d+)"', stream.read())[1])


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_two_workers_and_an_evaluator_train_on_three_nodes(nodes, tmp_path, data_dir):
    steps = 300
    args, model_dir = ray_job(
        nodes,
        tmp_path,
        data_dir,
        ["--num_workers=2", "--evaluator"],
        [f"--train_steps={steps}", "--save_checkpoints_steps=100", "--communication=ring"],
    )
    started = time.monotonic()
    run = run_module("estimator_dist.launch", args, 330, model_dir=model_dir)
    print(f"Ray job of {steps} steps: {time.monotonic() - started:.1f} s")
    print("\n".join(line for line in run.output.splitlines() if "[launcher]" in line))
    assert checkpoint_step(model_dir) == steps
    final = run.json("eval_metrics.json")
    assert final["final"] is True and final["metrics"]["global_step"] == steps
    assert f"[launcher] final evaluation: global_step={steps}, accuracy=" in run.output

    tasks = placed(run.output)
    assert sorted(tasks) == ["chief-0", "evaluator-0", "worker-0"]
    assert len({node for _, node, _ in tasks.values()}) == 3, tasks  # STRICT_SPREAD
    node_ids = [nodes.head_node.node_id] + [node.node_id for node in nodes.worker_nodes]
    assert all(any(n.startswith(node) for n in node_ids) for _, node, _ in tasks.values())
    assert {ip for ip, _, _ in tasks.values()} == {nodes.head_node.node_ip_address}
    assert tasks["evaluator-0"][2] is None
    addresses = {role: f"{ip}:{port}" for role, (ip, _, port) in tasks.items() if port}
    configs = {
        name: json.loads(config)
        for name, config in re.findall(
            r"started (\S+) \(pid \d+\) on Ray .* TF_CONFIG=(.*)", run.output
        )
    }
    assert sorted(configs) == ["chief", "evaluator", "worker-0"]
    for config in configs.values():
        assert config["cluster"] == {
            "chief": [addresses["chief-0"]],
            "worker": [addresses["worker-0"]],
        }
    for role, address in addresses.items():  # TensorFlow served on the port the actor held.
        with open(os.path.join(model_dir, "logs", f"{role}.log")) as stream:
            assert SERVER_LINE.format(address=address) in stream.read(), role
    for name in ("chief", "worker-0", "evaluator"):
        assert f"\n[{name}] " in run.output, f"no output prefixed [{name}]"
    with open(os.path.join(model_dir, "logs", "evaluator-0.log")) as stream:
        assert f"Saving dict for global step {steps}" in stream.read()
    # The nodes share this machine: each training task ran on its own share of its cores.
    shares = dict(
        re.findall(r"\[launcher\] Ray: (\S+) on Ray node .*, on cores ([\d,]+)", run.output)
    )
    assert sorted(shares) == ["chief-0", "worker-0"], shares
    chief, worker = ({int(c) for c in shares[r].split(",")} for r in ("chief-0", "worker-0"))
    assert not chief & worker
    assert set(run.json("run_record.json")["cores"]) == chief


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_a_killed_worker_restarts_the_job_which_ends_at_the_last_step(nodes, tmp_path, data_dir):
    # The kill comes as soon as step 100 is logged, so 400 steps leave 300 to resume.
    steps = 400
    args, model_dir = ray_job(
        nodes,
        tmp_path,
        data_dir,
        ["--num_workers=2", "--noevaluator"],
        [f"--train_steps={steps}", "--save_checkpoints_steps=50", "--log_step_count_steps=50"],
    )
    with Background("estimator_dist.launch", args) as launcher:
        pid = int(launcher.wait_for_line(r"started worker-0 \(pid (\d+)\)", 180)[1])
        launcher.wait_for_line(r"^\[chief\] .*step = [1-9]\d{2,}/", 240)  # Past step 50's save.
        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        launcher.wait_for_line(r"training resumed", 240)
        resumed = time.monotonic() - killed
        code = launcher.wait(timeout=300)
    output = launcher.output
    print(f"killed worker-0 -> 'training resumed' seen {resumed:.1f} s later")
    print("\n".join(line for line in output.splitlines() if "[launcher]" in line))
    assert code == 0, report(f"the launcher exited {code}, expected 0", output)
    assert re.search(
        r"restart after attempt 0: worker-0 was killed by SIGKILL[^\n]*; resumed from checkpoint "
        r"step [1-9]\d*",
        output,
    ), output
    assert "attempt 1 failed" not in output
    assert checkpoint_step(model_dir) == steps
    assert not alive(pid)


def remove_a_training_node(cluster, output):
    """Removes a node that runs a training task, not the head nor the driver's; returns it."""
    driver = re.search(r"as a driver on node ([0-9a-f]{8})", output)[1]
    for role, (_, node, _) in placed(output).items():
        if role.startswith(("chief", "worker")) and node != driver:
            for candidate in cluster.worker_nodes:
                if candidate.node_id.startswith(node):
                    cluster.remove_node(candidate)
                    return role, node
    raise AssertionError(f"no training task on a node that may be removed:\n{output}")


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(480)
def test_a_lost_node_restarts_the_job_on_the_nodes_that_remain(nodes, tmp_path, data_dir):
    steps = 1000
    args, model_dir = ray_job(
        nodes,
        tmp_path,
        data_dir,
        ["--num_workers=2", "--noevaluator"],
        [f"--train_steps={steps}", "--save_checkpoints_steps=50", "--log_step_count_steps=50"],
    )
    with Background("estimator_dist.launch", args) as launcher:
        launcher.wait_for_line(r"^\[chief\] .*step = [1-9]\d{2,}/", 240)
        role, node = remove_a_training_node(nodes, launcher.output)
        code = launcher.wait(timeout=300)
    output = launcher.output
    print("\n".join(line for line in output.splitlines() if "[launcher]" in line))
    assert code == 0, report(f"the launcher exited {code}, expected 0", output)
    assert re.search(rf"Ray node \S+ \(node {node}\), where {role} ran, is gone", output), output
    assert "restart after attempt 0: " in output
    assert "attempt 1 failed" not in output  # No stale preemption decision stopped attempt 1.
    second = placed(output[output.index("placing attempt 1") :])
    assert sorted(second) == ["chief-0", "worker-0"] and node not in {
        n for _, n, _ in second.values()
    }
    assert checkpoint_step(model_dir) == steps


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_too_few_nodes_left_fail_with_a_clear_error(nodes, tmp_path, data_dir):
    args, model_dir = ray_job(
        nodes,
        tmp_path,
        data_dir,
        ["--num_workers=2", "--evaluator", "--ray_placement_timeout_secs=10", "--grace_secs=5"],
        ["--train_steps=100000", "--save_checkpoints_steps=50", "--log_step_count_steps=50"],
    )
    with Background("estimator_dist.launch", args) as launcher:
        launcher.wait_for_line(r"^\[chief\] .*step = [1-9]\d{2,}/", 240)
        pids = started_pids(launcher.output)
        removed = time.monotonic()
        remove_a_training_node(nodes, launcher.output)
        code = launcher.wait(timeout=120)
        took = time.monotonic() - removed
    output = launcher.output
    print(f"node removed -> launcher exited {code} after {took:.1f} s")
    assert code == exit_codes.CLUSTER_TIMEOUT, report(
        f"the launcher exited {code}, expected 151", output
    )
    assert (
        "job failed: the Ray placement group of the job's 3 tasks ({'CPU': 1.0} each, "
        "--ray_placement=STRICT_SPREAD) was not placed within --ray_placement_timeout_secs=10: "
        "2 alive Ray node(s) (of 2) have the resources of one task, and the job needs 3 "
        "distinct nodes. Add nodes to the Ray cluster, or pass --ray_placement=SPREAD"
    ) in output, output
    assert took < 90
    assert [pid for pid in pids if alive(pid)] == []


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_sigterm_to_the_launcher_stops_every_task_at_a_checkpointed_step(nodes, tmp_path, data_dir):
    args, model_dir = ray_job(
        nodes,
        tmp_path,
        data_dir,
        ["--num_workers=2", "--noevaluator", "--grace_secs=20"],
        ["--train_steps=100000", "--save_checkpoints_steps=1000000", "--log_step_count_steps=50"],
    )
    with Background("estimator_dist.launch", args) as launcher:
        launcher.wait_for_line(r"^\[chief\] .*step = [1-9]\d{2,}/", 240)
        pids = started_pids(launcher.output)
        launcher.process.terminate()
        code = launcher.wait(timeout=120)
    output = launcher.output
    assert code == 128 + signal.SIGTERM, report(f"the launcher exited {code}, expected 143", output)
    stop = int(re.search(r"every task stops at global step (\d+)", output)[1])
    assert output.count(f"failed (exit 155): stopped for a preemption at global step {stop}") == 2
    assert checkpoint_step(model_dir) == stop
    assert f"the latest checkpoint is at step {stop}" in output
    assert [pid for pid in pids if alive(pid)] == []


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_tasks_never_outlive_a_killed_launcher(nodes, tmp_path, data_dir):
    args, _ = ray_job(
        nodes, tmp_path, data_dir, ["--num_workers=2", "--noevaluator"], ["--train_steps=100000"]
    )
    with Background("estimator_dist.launch", args) as launcher:
        launcher.wait_for_line(r"^\[chief\] .*loss = ", 240)
        pids = started_pids(launcher.output)
        launcher.process.kill()
        killed = time.monotonic()
        # Timed for up to 30 s, so that a slow end shows its figure; the bound is 5 s.
        ended = {}
        while len(ended) < len(pids) and time.monotonic() - killed < 30:
            for pid in set(pids) - set(ended):
                if not alive(pid):
                    ended[pid] = time.monotonic() - killed
            time.sleep(0.05)
        launcher.wait(timeout=30)
    measured_exits("launcher_sigkill", "ray", pids, ended)
    assert len(pids) == 2, launcher.output
    assert sorted(ended) == sorted(pids), f"tasks {sorted(set(pids) - set(ended))} still run"
    assert max(ended.values()) < 5, f"seconds from the launcher's SIGKILL to each end: {ended}"
