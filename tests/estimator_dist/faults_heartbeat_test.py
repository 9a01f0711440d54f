"""Peers that stop answering, noticed by the heartbeat in seconds: a frozen task, a cut network.

A frozen task (SIGSTOP, as a paused VM) and a network cut reset no
connection: without the heartbeat the others wait in their collectives until
the stall timeout (120 s). With it, the survivors exit 156 after
`--heartbeat_timeout` (15 s by default), and the job restarts from its latest
checkpoint. A short cut (3 s) heals without a failure. Where and when the
fault hits comes from `fault_seed`; each run prints its MEASURED figures.
"""

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import time

import pytest
import tensorflow as tf

from estimator_dist.base import exit_codes
from estimator_dist.cluster.tf_config import CHIEF, WORKER, ClusterConfig
from tests.estimator_dist import faults_test
from tests.procs import (
    CHIEF_STEP_LINE,
    TASK_STEP_LINE,
    Background,
    checkpoint_step,
    free_ports,
    measured,
    report,
    started_pids,
    tasks,
    wait_for_step,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.fault]

#: The default `--heartbeat_timeout`, which these jobs keep; detection must come well within 30 s.
HEARTBEAT_TIMEOUT = 15
DETECTION_LIMIT = 30
#: Checkpoints every this many steps: a failure loses fewer than two intervals.
SAVE_STEPS = 50


def task_args(model_dir, data_dir, *extra):
    """The fault tests' task flags, with a checkpoint every `SAVE_STEPS`."""
    return faults_test.task_args(
        model_dir, data_dir, f"--save_checkpoints_steps={SAVE_STEPS}", *extra
    )


def assert_finished_at(model_dir, steps, output):
    latest = tf.train.latest_checkpoint(str(model_dir))
    assert latest and latest.endswith(f"model.ckpt-{steps}"), report(f"latest {latest}", output)
    assert tf.train.load_checkpoint(latest).get_tensor("global_step") == steps


@pytest.mark.timeout(420)
def test_a_frozen_task_is_noticed_by_the_heartbeat_and_the_job_recovers(
    tmp_path, data_dir, fault_seed
):
    rng = random.Random(fault_seed)
    frozen_name = rng.choice(["chief", "worker-0"])
    survivor, frozen_role = (
        ("worker-0", "chief-0") if frozen_name == "chief" else ("chief", "worker-0")
    )
    at_step = rng.randint(60, 160)
    steps = 300
    args = [
        "--num_workers=2",
        "--evaluator",
        "--max_restarts=2",
        "--grace_secs=3",
        "--timeout_secs=360",
        "--",
        *task_args(tmp_path, data_dir, f"--train_steps={steps}"),  # --stall_timeout stays 120 s
    ]
    with Background("estimator_dist.launch", args) as launcher:
        wait_for_step(launcher, at_step, 180, CHIEF_STEP_LINE)
        frozen = started_pids(launcher.output, frozen_name)[-1]
        os.kill(frozen, signal.SIGSTOP)  # As a paused VM: its connections stay open.
        stopped = time.monotonic()
        line = launcher.wait_for_line(
            rf"^\[{survivor}\] estimator_dist: task \S+ failed \(exit (\d+)\): (.*)", 120
        )
        detected = time.monotonic() - stopped
        launcher.wait_for_line(r"^\[launcher\] attempt 0 failed: ", 60)
        left_behind = os.path.exists(f"/proc/{frozen}")  # The launcher stopped every task.
        code = launcher.wait(timeout=300)
    output = launcher.output
    lost = re.search(
        r"restart after attempt 0: .* resumed from checkpoint step (\d+), (\d+) step", output
    )
    resumed = re.search(r"training resumed ([\d.]+) s after", output)
    print("\n".join(line for line in output.splitlines() if line.startswith("[launcher]")))
    measured(
        "frozen_task",
        seed=fault_seed,
        frozen=frozen_role,
        at_step=at_step,
        detection_secs=f"{detected:.1f}",
        resume_secs=resumed.group(1) if resumed else "none",
        steps_lost=lost.group(2) if lost else "none",
    )
    assert int(line.group(1)) == exit_codes.PEER_UNRESPONSIVE, report(
        f"{survivor} exited {line.group(1)}, expected 156", output
    )
    assert line.group(2).startswith(f"peer {frozen_role} ("), report(
        f"{survivor}'s cause names no {frozen_role}: {line.group(2)}", output
    )
    assert detected <= DETECTION_LIMIT, report(
        f"noticed {detected:.1f} s after SIGSTOP, expected <= {DETECTION_LIMIT}", output
    )
    assert not left_behind, report(f"the frozen task (pid {frozen}) outlived the attempt", output)
    assert code == 0, report(f"the launcher exited {code}, expected 0", output)
    assert re.search(
        r"restart after attempt 0: \S+ exited with code 156 \(PEER_UNRESPONSIVE\)", output
    ), report("the launcher reported no restart after the exit 156", output)
    assert "attempt 1 failed" not in output, report("attempt 1 failed too", output)
    assert lost and int(lost.group(2)) < 2 * SAVE_STEPS, report("steps lost", output)
    assert resumed, report("the launcher said nothing of the resumed training", output)
    assert_finished_at(tmp_path, steps, output)
    final = json.load(open(tmp_path / "eval_metrics.json"))
    assert final["final"] and final["metrics"]["global_step"] == steps


@contextlib.contextmanager
def two_hosts():
    """Two network namespaces joined by a veth pair: 10.213.7.1 and 10.213.7.2.

    Yields (namespace names, veth device of the first); removes both after.
    Skips, saying why, where namespaces cannot be created.
    """
    suffix = os.getpid()
    names = (f"edist-a-{suffix}", f"edist-b-{suffix}")
    devices = (f"eda{suffix}"[:15], f"edb{suffix}"[:15])
    setup = [
        ["ip", "netns", "add", names[0]],
        ["ip", "netns", "add", names[1]],
        ["ip", "link", "add", devices[0], "type", "veth", "peer", "name", devices[1]],
        ["ip", "link", "set", devices[0], "netns", names[0]],
        ["ip", "link", "set", devices[1], "netns", names[1]],
    ]
    for index in range(2):
        address = f"10.213.7.{index + 1}/24"
        setup += [
            ["ip", "-n", names[index], "addr", "add", address, "dev", devices[index]],
            ["ip", "-n", names[index], "link", "set", devices[index], "up"],
            ["ip", "-n", names[index], "link", "set", "lo", "up"],
        ]
    try:
        for command in setup:
            result = subprocess.run(command, capture_output=True, text=True)
            if result.returncode:
                pytest.skip(
                    f"cannot create network namespaces here: {' '.join(command)}: "
                    f"{result.stderr.strip()}"
                )
        yield names, devices[0]
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


@contextlib.contextmanager
def two_host_job(model_dir, data_dir, steps):
    """A chief and a worker, each in its namespace; yields (start, set_link)."""
    with two_hosts() as (namespaces, link):
        (port,) = free_ports(1)
        jobs = {CHIEF: [f"10.213.7.1:{port}"], WORKER: [f"10.213.7.2:{port}"]}
        configs = {
            c.role: c.to_json() for c in (ClusterConfig(jobs, CHIEF), ClusterConfig(jobs, WORKER))
        }
        prefixes = {
            "chief-0": ("ip", "netns", "exec", namespaces[0]),
            "worker-0": ("ip", "netns", "exec", namespaces[1]),
        }
        args = task_args(model_dir, data_dir, f"--train_steps={steps}")

        def start():
            return tasks(configs, args, prefixes)

        def set_link(state):
            subprocess.run(["ip", "-n", namespaces[0], "link", "set", link, state], check=True)

        yield start, set_link


@pytest.mark.timeout(420)
def test_a_kept_partition_is_noticed_by_the_heartbeat_and_a_restart_finishes(
    tmp_path, data_dir, fault_seed
):
    rng = random.Random(fault_seed)
    at_step, steps = rng.randint(60, 160), 300
    with two_host_job(tmp_path, data_dir, steps) as (start, set_link):
        with start() as procs:
            wait_for_step(procs["chief-0"], at_step, 180)
            set_link("down")
            cut = time.monotonic()
            codes = {role: p.wait(timeout=120) for role, p in procs.items()}
            detected = time.monotonic() - cut
        seen = max(int(s) for s in re.findall(TASK_STEP_LINE[1:], procs["chief-0"].output, re.M))
        checkpointed = checkpoint_step(str(tmp_path))
        set_link("up")  # The network heals; the same command restarts the job, as a launcher would.
        restarted = time.monotonic()
        with start() as again:
            again["chief-0"].wait_for_line("ran its first step", 180)
            resumed = time.monotonic() - restarted
            final = {role: p.wait(timeout=240) for role, p in again.items()}
    measured(
        "kept_partition",
        seed=fault_seed,
        at_step=at_step,
        detection_secs=f"{detected:.1f}",
        resume_secs=f"{resumed:.1f}",
        steps_lost=seen - checkpointed,
    )
    assert codes == {"chief-0": 156, "worker-0": 156}, report(
        f"exit codes {codes}, expected 156 (PEER_UNRESPONSIVE) on both", procs
    )
    assert detected <= DETECTION_LIMIT, report(
        f"both exited {detected:.1f} s after the link went down, expected <= {DETECTION_LIMIT}",
        procs,
    )
    for role, other in (("chief-0", "worker-0"), ("worker-0", "chief-0")):
        assert re.search(
            rf"task {role} failed \(exit 156\): peer {other} \(10\.213\.7\.\d:\d+\) has not "
            r"answered the heartbeat for \d+ s",
            procs[role].output,
        ), report(f"{role} printed no exit-156 line naming {other}", procs)
    assert 0 <= seen - checkpointed < 2 * SAVE_STEPS, report(
        f"{seen - checkpointed} steps lost", procs
    )
    assert final == {"chief-0": 0, "worker-0": 0}, report(f"the restart exited {final}", again)
    assert_finished_at(tmp_path, steps, again["chief-0"].output)


@pytest.mark.timeout(300)
def test_a_short_partition_heals_without_a_failure(tmp_path, data_dir):
    outage, steps = 3, 300
    with two_host_job(tmp_path, data_dir, steps) as (start, set_link):
        with start() as procs:
            wait_for_step(procs["chief-0"], 50, 180)
            set_link("down")
            # The outage lasts `outage` seconds unless the chief dies first.
            with contextlib.suppress(subprocess.TimeoutExpired):
                procs["chief-0"].process.wait(timeout=outage)
            set_link("up")
            codes = {role: p.wait(timeout=240) for role, p in procs.items()}
    assert codes == {"chief-0": 0, "worker-0": 0}, report(f"exit codes {codes}, expected 0", procs)
    assert_finished_at(tmp_path, steps, procs["chief-0"].output)
