"""Jobs whose model_dir is on object storage: real tasks, a real S3-protocol server, faults.

The server (moto's, `tests/s3_server.py`) runs in a network namespace the
test creates, reached over a veth pair: for the launcher's private
namespace it is remote, reached through the launcher's relay
(`estimator_dist.launcher.way_out`). Every task works in a directory of
its own (`ESTIMATOR_DIST_WORK_DIR/s3/bucket/<run>/<task>`): no two tasks
share a file, as on machines with no shared file system. Each fault test
prints what the fault cost (`MEASURED` lines) for docs/running.md.
"""

import json
import os
import re
import signal
import time

import pytest

from estimator_dist.base import exit_codes
from estimator_dist.storage.remote import Remote
from estimator_dist.storage.sync import STATE_FILE, parse_state
from tests.procs import Background, measured, report, run_module, started_pids, tasks, wait_all
from tests.s3_server import S3Server, remote_network

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

TIMEOUT = 420
STEPS = 300


@pytest.fixture(scope="module")
def server():
    if os.geteuid() != 0:
        pytest.fail("these tests create a network namespace for the S3 server: run them as root")
    with remote_network() as (address, prefix):
        with S3Server(address, prefix) as running:
            yield running


def launch_args(run, data_dir, *extra, steps=STEPS):
    return [
        "--num_workers=2",
        "--evaluator",
        f"--timeout_secs={TIMEOUT - 60}",
        "--",
        f"--model_dir=s3://bucket/{run}",
        f"--data_dir={data_dir}",
        f"--train_steps={steps}",
        "--save_checkpoints_steps=50",
        "--log_step_count_steps=10",
        "--eval_throttle_secs=1",
        *extra,
    ]


def environment(server, tmp_path):
    return {**server.env, "ESTIMATOR_DIST_WORK_DIR": str(tmp_path / "work")}


def bucket(run):
    """The run's directory at the server, as the test reads it (`aws` sets its variables)."""
    return Remote(f"s3://bucket/{run}")


@pytest.fixture
def aws(server, monkeypatch):
    """This process reaches the server too: AWS's variables for the test's own reads."""
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    return server


def stored_step(remote):
    text = remote.read(STATE_FILE)
    latest = parse_state(text)[0] if text else None
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def test_two_workers_and_an_evaluator_train_to_the_end_with_model_dir_on_s3(
    server, aws, tmp_path, data_dir, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    run = run_module(
        "estimator_dist.launch",
        launch_args("whole", data_dir),
        TIMEOUT,
        env=environment(server, tmp_path),
    )
    assert "remote storage and data reached through a relay" in run.output, report(
        "relay", run.output
    )
    assert not os.path.exists(tmp_path / "s3:"), "the URL was taken for a local path"
    remote = bucket("whole")
    names = set(remote.listing())
    assert stored_step(remote) == STEPS, report("final checkpoint at the URL", run.output)
    metrics = json.loads(remote.read("eval_metrics.json"))
    assert metrics["final"] and metrics["metrics"]["global_step"] == STEPS
    assert json.loads(remote.read("run_record.json"))["num_workers"] == 2
    for expected in ("logs/launcher.log", "logs/chief-0.log", "logs/worker-0.log", "graph.pbtxt"):
        assert expected in names, report(f"{expected} not at the URL: {sorted(names)}", run.output)
    assert any(n.startswith("eval/events.out.tfevents") for n in names)
    assert any(n.startswith("events.out.tfevents") for n in names)
    assert any(n.startswith("export/latest/") and n.endswith("saved_model.pb") for n in names)
    assert f"final evaluation: global_step={STEPS}" in run.output
    work = tmp_path / "work" / "s3" / "bucket" / "whole"
    assert sorted(os.listdir(work)) == ["chief-0", "evaluator-0", "launcher", "worker-0"]


def test_a_job_resumes_from_the_bucket_on_machines_that_never_saw_it(
    server, aws, tmp_path, data_dir
):
    first = run_module(
        "estimator_dist.train",
        [
            "--model_dir=s3://bucket/resume",
            f"--data_dir={data_dir}",
            "--train_steps=100",
            "--save_checkpoints_steps=50",
            "--nopreemption_checkpoint",
        ],
        TIMEOUT,
        env=environment(server, tmp_path / "first"),
    )
    assert stored_step(bucket("resume")) == 100, report("first run", first.output)
    started = time.monotonic()
    with Background(
        "estimator_dist.launch",
        launch_args("resume", data_dir, steps=200),
        env=environment(server, tmp_path / "second"),  # Fresh local directories everywhere.
    ) as launcher:
        launcher.wait_for_line(
            r"\[chief\] .*restored model\.ckpt-100 from s3://bucket/resume", TIMEOUT
        )
        first_step = launcher.wait_for_line(
            r"\[chief\] .*ran its first step \(global step (\d+)\)", TIMEOUT
        )
        resumed = time.monotonic() - started
        assert int(first_step.group(1)) == 100, report("resumed step", launcher.output)
        assert launcher.wait(TIMEOUT) == 0, report("second run", launcher.output)
    assert stored_step(bucket("resume")) == 200
    measured("s3_resume", from_step=100, first_step_secs=f"{resumed:.1f}")


@pytest.mark.parametrize("fault", ["wrong_credentials", "missing_bucket"])
def test_fail_before_any_task_trains(server, tmp_path, data_dir, fault):
    env = environment(server, tmp_path)
    run_name = "refused"
    if fault == "wrong_credentials":
        env["AWS_SECRET_ACCESS_KEY"] = "not-the-key"
    args = launch_args(run_name, data_dir)
    if fault == "missing_bucket":
        args = [a.replace("s3://bucket/", "s3://no-such-bucket/") for a in args]
    run = run_module("estimator_dist.launch", args, TIMEOUT, env=env, check=False)
    assert run.returncode == exit_codes.USAGE, run.describe()
    errors = [line for line in run.output.splitlines() if line.startswith("estimator_dist.launch")]
    assert len(errors) == 1, run.describe()
    expected = "refused access" if fault == "wrong_credentials" else "does not exist"
    assert expected in errors[0], run.describe()
    assert "started chief" not in run.output and "Traceback" not in run.output


def test_a_worker_killed_mid_job_is_restarted_from_the_bucket(server, aws, tmp_path, data_dir):
    with Background(
        "estimator_dist.launch",
        launch_args("worker_killed", data_dir, steps=2000),
        env=environment(server, tmp_path),
    ) as launcher:
        # Past the checkpoints of steps 0, 50...200, and 1,750 steps before the end.
        while int(launcher.wait_for_line(r"\[chief\] .*step = (\d+)/2000", TIMEOUT)[1]) < 250:
            pass
        os.kill(started_pids(launcher.output, "worker-0")[-1], signal.SIGKILL)
        killed = time.monotonic()
        restart = launcher.wait_for_line(
            r"restarting the whole cluster from checkpoint step (\d+)", TIMEOUT
        )
        detected = time.monotonic() - killed
        assert launcher.wait(TIMEOUT) == 0, report("job after the kill", launcher.output)
    lost = re.search(r"(\d+) step\(s\) lost", launcher.output)
    assert stored_step(bucket("worker_killed")) == 2000
    measured(
        "s3_worker_killed",
        restart_from=restart.group(1),
        restart_secs=f"{detected:.1f}",
        steps_lost=lost.group(1) if lost else "?",
    )


def test_the_chief_killed_during_an_upload_leaves_the_previous_checkpoint_usable(
    server, aws, tmp_path, data_dir
):
    remote = bucket("chief_killed")
    chief_dir = tmp_path / "work" / "s3" / "bucket" / "chief_killed" / "chief-0"
    with Background(
        "estimator_dist.launch",
        launch_args("chief_killed", data_dir, steps=600),
        env=environment(server, tmp_path),
    ) as launcher:
        launcher.wait_for_line(r"\[chief\] .*uploaded model\.ckpt-\d+ to", TIMEOUT)
        with server.paused():
            # Training goes on; the uploads wait, and the chief cannot end before they are done.
            # Until the chief holds a checkpoint the bucket does not (an upload answered just
            # before the pause may still be reported): the one its kill must not lose.
            deadline = time.monotonic() + TIMEOUT
            while _local_step(chief_dir) <= max(100, _uploaded(launcher.output)):
                assert time.monotonic() < deadline, report("no local checkpoint", launcher.output)
                time.sleep(0.1)
            time.sleep(1.0)  # The upload thread polls every 0.5 s: it is now sending one.
            os.kill(started_pids(launcher.output, "chief")[-1], signal.SIGKILL)
            at_kill = _local_step(chief_dir)
        restart = launcher.wait_for_line(
            r"restarting the whole cluster from checkpoint step (\d+)", TIMEOUT
        )
        before = int(restart.group(1))
        # The upload under way when the chief died may still complete: the launcher's relay
        # holds what the chief sent and delivers it once the server runs again. Either way the
        # job resumes from a whole checkpoint the bucket holds (every task restores it, below).
        assert before <= at_kill, report(
            f"restart at {before}, local at {at_kill}", launcher.output
        )
        assert launcher.wait(TIMEOUT) == 0, report("job after the kill", launcher.output)
    after = launcher.output.split(restart.group(0), 1)[1]
    for task in ("chief", "worker-0"):  # Every task of the new attempt restores the bucket's.
        assert re.search(rf"\[{task}\] .*restored model\.ckpt-{before} from", after), report(
            f"{task} did not restore model.ckpt-{before}", launcher.output
        )
    assert stored_step(remote) == 600
    lost = re.search(r"(\d+) step\(s\) lost", launcher.output)
    measured(
        "s3_chief_killed_in_upload",
        stored_before=before,
        local_at_kill=at_kill,
        steps_lost=lost.group(1) if lost else "?",
    )


def _uploaded(output):
    """The highest step of a checkpoint the chief reported uploaded."""
    return max(map(int, re.findall(r"\[chief\] .*uploaded model\.ckpt-(\d+) to", output)))


def _local_step(directory):
    path = os.path.join(directory, STATE_FILE)
    if not os.path.exists(path):
        return 0
    with open(path, "rb") as stream:
        latest = parse_state(stream.read())[0]
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def test_the_storage_stopped_for_20_s_mid_job_loses_nothing(server, aws, tmp_path, data_dir):
    started = time.monotonic()
    with Background(
        "estimator_dist.launch",
        launch_args("paused", data_dir, steps=600),
        env=environment(server, tmp_path),
    ) as launcher:
        launcher.wait_for_line(r"\[chief\] .*uploaded model\.ckpt-0 to", TIMEOUT)
        with server.paused():
            time.sleep(20)  # The fault itself: the storage answers nothing for 20 s.
        assert launcher.wait(TIMEOUT) == 0, report("job after the pause", launcher.output)
    restarts = len(re.findall(r"restarting the whole cluster", launcher.output))
    assert stored_step(bucket("paused")) == 600
    assert "final evaluation: global_step=600" in launcher.output
    measured("s3_paused_20s", restarts=restarts, job_secs=f"{time.monotonic() - started:.1f}")


def test_a_sagemaker_job_with_model_dir_on_s3_from_its_hyperparameters(
    server, aws, tmp_path, data_dir
):
    from tests.estimator_dist.platforms_test import local, sagemaker_mwms_hosts

    workers = local(2)
    hosts = ["algo-1", "algo-2"]
    environments = {  # Each host its own disk.
        host: {**environment(server, tmp_path / host), **sagemaker}
        for host, sagemaker in sagemaker_mwms_hosts(workers, hosts).items()
    }
    # SageMaker passes hyperparameters as `--name value`.
    args = [
        "--model_dir",
        "s3://bucket/sagemaker",
        f"--data_dir={data_dir}",
        "--train_steps=100",
        "--save_checkpoints_steps=50",
    ]
    with tasks(environments, args) as procs:
        codes = wait_all(procs, hosts, TIMEOUT)
        assert codes == {host: 0 for host in hosts}, report(f"exit codes {codes}", procs)
    remote = bucket("sagemaker")
    assert stored_step(remote) == 100
    record = json.loads(remote.read("run_record.json"))
    assert (record["role"], record["num_workers"]) == ("chief-0", 2)


def test_a_ray_cluster_of_three_nodes_with_no_shared_directory(server, aws, tmp_path, data_dir):
    """Each task on its own Ray node, working in its own directory; results only at the URL."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    work = tmp_path / "ray-work"
    saved = dict(os.environ)
    os.environ.update(environment(server, tmp_path), ESTIMATOR_DIST_WORK_DIR=str(work))
    try:  # The nodes' processes inherit this environment, as a cloud machine has its own.
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        for _ in range(2):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        run = run_module(
            "estimator_dist.launch",
            [
                "--engine=ray",
                f"--ray_address={cluster.address}",
                "--num_workers=2",
                "--evaluator",
                f"--timeout_secs={TIMEOUT - 60}",
                "--",
                "--model_dir=s3://bucket/ray",
                f"--data_dir={data_dir}",
                "--train_steps=200",
                "--save_checkpoints_steps=50",
                "--eval_throttle_secs=1",
            ],
            TIMEOUT,
            env=environment(server, tmp_path / "driver"),
        )
    finally:
        cluster.shutdown()
    nodes = set(
        re.findall(r"\[launcher\] Ray: \S+ on Ray node \S+ \(node ([0-9a-f]{8})\)", run.output)
    )
    assert len(nodes) == 3, report(f"tasks on nodes {nodes}", run.output)
    remote = bucket("ray")
    assert stored_step(remote) == 200, report("final checkpoint at the URL", run.output)
    assert json.loads(remote.read("eval_metrics.json"))["metrics"]["global_step"] == 200
    assert "final evaluation: global_step=200" in run.output
    tasks_dirs = sorted(os.listdir(work / "s3" / "bucket" / "ray"))
    assert tasks_dirs == ["chief-0", "evaluator-0", "worker-0"], tasks_dirs


def test_a_whole_program_given_an_s3_model_dir(server, aws, tmp_path):
    """A legacy script's Estimator(model_dir=args.model_dir) trains with an s3:// URL."""
    script = os.path.join(
        os.path.dirname(__file__), "..", "legacy", "scripts", "migration_guide_tf1.py"
    )
    run = run_module(
        "estimator_dist.launch",
        [
            "--num_workers=2",
            "--evaluator",
            f"--script={os.path.abspath(script)}",
            "--communication=RING",
            f"--timeout_secs={TIMEOUT - 60}",
            "--",
            "--model_dir=s3://bucket/script",
            "--max_steps=200",
        ],
        TIMEOUT,
        env=environment(server, tmp_path),
    )
    remote = bucket("script")
    assert stored_step(remote) == 200, report("final checkpoint at the URL", run.output)
    assert json.loads(remote.read("eval_metrics.json"))["final"]
    assert "[launcher] final evaluation: global_step=200" in run.output
    assert not os.path.exists(os.path.join(os.getcwd(), "s3:"))


def test_sigterm_stops_every_task_at_one_step_whose_checkpoint_reaches_the_bucket(
    server, aws, tmp_path, data_dir
):
    """The preemption requests and decision travel through the bucket: no step is lost."""
    args = launch_args("sigterm", data_dir, steps=100000)
    args[args.index("--save_checkpoints_steps=50")] = "--save_checkpoints_steps=1000000"
    with Background("estimator_dist.launch", args, env=environment(server, tmp_path)) as launcher:
        launcher.wait_for_line(r"\[chief\] .*uploaded model\.ckpt-0 to", TIMEOUT)
        launcher.wait_for_line(r"^\[chief\] .*loss = ", TIMEOUT)
        launcher.process.terminate()
        sent = time.monotonic()
        code = launcher.wait(TIMEOUT)
        elapsed = time.monotonic() - sent
    output = launcher.output
    assert code == 143, report(f"exit {code}", output)
    stop = int(re.search(r"every task stops at global step (\d+)", output).group(1))
    # Both training tasks stopped at the chief's step (none ran past it into a lone collective).
    stopped = f"failed (exit 155): stopped for a preemption at global step {stop}"
    assert output.count(stopped) >= 2, report("tasks that stopped at the step", output)
    assert stored_step(bucket("sigterm")) == stop, report("the bucket's checkpoint", output)
    assert f"the latest checkpoint is at step {stop}" in output
    measured("s3_sigterm", stop_step=stop, exit_secs=f"{elapsed:.2f}")
