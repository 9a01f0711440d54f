"""Fault injection with real processes: every job finishes, or fails fast naming the cause.

Tasks started by hand (each with its own TF_CONFIG) show what one task does
on its own; jobs under the launcher show the whole-cluster restart. Every
process runs in its own process group, bounded by a timeout, and is killed
when the test ends whatever happens. Where tests check different things about
one scenario, one run serves them (`shared_run` in tests/conftest.py): the
duplicated-then-killed job, and each preemption (the resume test continues one).
"""

import glob
import json
import os
import random
import re
import signal
import socket
import subprocess
import time

import pytest
import tensorflow as tf

from estimator_dist.base import exit_codes
from estimator_dist.cluster.tf_config import CHIEF, make_local_cluster
from tests.procs import (
    CHIEF_STEP_LINE,
    Background,
    all_output,
    by_task,
    free_ports,
    local_tf_configs,
    measured,
    read_every_checkpoint,
    report,
    run_module,
    started_pids,
    tasks,
    wait_for_checkpoint,
    wait_for_step,
)
from tests.tfjob_operator import go_json

pytestmark = pytest.mark.multiprocess

STEP_LINE = CHIEF_STEP_LINE


def task_args(model_dir, data_dir, *extra):
    return [
        f"--model_dir={model_dir}",
        f"--data_dir={data_dir}",
        "--input_fn=tests.task_inputs:example_sharded",
        "--log_step_count_steps=10",
        "--eval_throttle_secs=1",
        *extra,
    ]


#: The collective timeout of the job whose worker is duplicated, then killed.
PEER_TIMEOUT = 10


def duplicated_then_killed(model_dir, data_dir):
    """One 2-task job serving two tests: a duplicate of worker-0 is started once worker-0 ran
    its first step (it must fail on its port, leaving the job alone), then the job trains on
    to step 50 and worker-0 is SIGKILLed (the chief must exit 150 soon after)."""
    configs = local_tf_configs(2)
    args = task_args(
        model_dir, data_dir, "--train_steps=100000", f"--collective_timeout={PEER_TIMEOUT}"
    )
    with tasks(configs, args) as procs:
        procs["worker-0"].wait_for_line("ran its first step", 120)
        with tasks({"worker-0": configs["worker-0"]}, args) as duplicate:
            try:
                duplicate_code = duplicate["worker-0"].wait(timeout=60)
            except AssertionError:  # still running: killed here, failed by its own test
                duplicate_code = None
        wait_for_step(procs["chief-0"], 50, 120)
        procs["worker-0"].process.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        code = procs["chief-0"].wait(timeout=PEER_TIMEOUT + 60)
        elapsed = time.monotonic() - killed
    return dict(
        procs=procs, code=code, elapsed=elapsed, duplicate=duplicate, duplicate_code=duplicate_code
    )


@pytest.fixture(scope="module")
def duplicated_job(shared_run, tmp_path_factory, data_dir):
    return shared_run(
        "faults: duplicated, then killed",
        lambda: duplicated_then_killed(tmp_path_factory.mktemp("duplicated"), data_dir),
    )


@pytest.mark.timeout(300)
def test_survivor_exits_soon_after_a_peer_is_killed(duplicated_job):
    procs, code, elapsed = (duplicated_job[key] for key in ("procs", "code", "elapsed"))
    output = all_output(procs)
    print(f"survivor exited {elapsed:.1f} s after its peer was killed")
    assert code == exit_codes.PEER_FAILURE, report(f"chief-0 exited {code}, expected 150", procs)
    assert elapsed <= PEER_TIMEOUT + 15, report(
        f"chief-0 exited {elapsed:.1f} s after its peer was killed, "
        f"expected <= {PEER_TIMEOUT + 15}",
        procs,
    )
    assert "estimator_dist: task chief-0 failed (exit 150)" in output, report(
        "chief-0 printed no exit-150 failure line", procs
    )
    assert "peer worker-0" in output, report("chief-0's failure names no peer worker-0", procs)


@pytest.mark.timeout(300)
def test_duplicate_task_index_fails_fast(duplicated_job):
    duplicate, code = duplicated_job["duplicate"], duplicated_job["duplicate_code"]
    output = duplicate["worker-0"].output
    assert code == exit_codes.PORT_IN_USE, report(
        f"the duplicate exited {code} (None: still running after 60 s), expected 154", duplicate
    )
    assert "a second task started with the same task index" in output, report(
        "the duplicate did not say a second task has its index", duplicate
    )


# One seeded job with two kills: a restart after a restart is what the second proves; a
# third would prove nothing more, and restarts are what costs time, not seeds.
KILLS = 2


@pytest.mark.fault
@pytest.mark.timeout(600)
def test_seeded_kills_under_the_launcher_end_at_exactly_max_steps(tmp_path, data_dir, fault_seed):
    rng = random.Random(fault_seed)
    steps = 300
    args = [
        "--num_workers=2",
        "--max_restarts=3",
        "--grace_secs=3",
        "--timeout_secs=400",
        "--",
        *task_args(tmp_path, data_dir, f"--train_steps={steps}", "--save_checkpoints_steps=50"),
    ]
    with Background("estimator_dist.launch", args) as launcher:
        target = rng.randint(40, 140)
        for _ in range(KILLS):
            wait_for_step(launcher, target, 180, STEP_LINE)
            victim = rng.choice(["chief", "worker-0"])
            pid = started_pids(launcher.output, victim)[-1]
            os.kill(pid, signal.SIGKILL)
            target = min(steps - 20, target + rng.randint(60, 120))
        code = launcher.wait(timeout=300)
    output = launcher.output
    assert code == 0, report(f"the launcher exited {code}, expected 0", output)
    restarts = re.findall(
        r"\[launcher\] restart after attempt \d: \S+ was killed by SIGKILL", output
    )
    assert len(restarts) == KILLS, report(f"{len(restarts)} restarts, expected {KILLS}", output)
    resumed = [float(s) for s in re.findall(r"training resumed ([\d.]+) s after", output)]
    print(f"seed {fault_seed}: training resumed {resumed} s after each failure")
    assert len(resumed) == KILLS, report(f"resumed {len(resumed)} times, expected {KILLS}", output)
    latest = tf.train.latest_checkpoint(str(tmp_path))
    assert latest.endswith(f"model.ckpt-{steps}"), report(f"latest checkpoint {latest}", output)
    assert tf.train.load_checkpoint(latest).get_tensor("global_step") == steps
    final = json.load(open(tmp_path / "eval_metrics.json"))
    assert final["final"] and final["metrics"]["global_step"] == steps
    assert not glob.glob(str(tmp_path / "tmp_worker_*"))


def kill_during_save(task, model_dir, timeout):
    """SIGKILLs `task` in the middle of a checkpoint save, while `model_dir/*_temp*` exists.

    A save's `_temp` directory lives for a few milliseconds (0.2 to 30 ms measured), so a
    SIGKILL sent as soon as it shows up can land after the save ended: with two loaded cores it
    did in 1 run of 10. So the task is stopped first (SIGSTOP; waitpid returns once every
    thread stopped), the directory looked for again, and the task killed only while its save
    is frozen half done; otherwise it is continued, and a later save is caught.
    """
    pid = task.process.pid
    pattern = os.path.join(model_dir, "*_temp*")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if glob.glob(pattern):
            os.kill(pid, signal.SIGSTOP)
            _, status = os.waitpid(pid, os.WUNTRACED)
            assert os.WIFSTOPPED(status), report(
                f"the task ended (wait status {status}) before a save was caught", {"task": task}
            )
            if glob.glob(pattern):
                os.kill(pid, signal.SIGKILL)
                return
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.001)
    raise AssertionError(report(f"no checkpoint save caught in {timeout} s", {"task": task}))


@pytest.mark.timeout(600)
def test_kill_during_checkpoint_save_leaves_a_loadable_checkpoint(tmp_path, data_dir):
    configs = local_tf_configs(2)
    args = task_args(
        tmp_path,
        data_dir,
        "--train_steps=100000",
        "--save_checkpoints_steps=1",
        "--keep_checkpoint_max=3",
    )
    with tasks(configs, args) as procs:
        wait_for_step(procs["chief-0"], 20, 120)
        kill_during_save(procs["chief-0"], tmp_path, 60)
        procs["chief-0"].wait(timeout=30)
    assert glob.glob(str(tmp_path / "*_temp*")), "the kill did not land during a save"
    latest = tf.train.latest_checkpoint(str(tmp_path))
    reader = tf.train.load_checkpoint(latest)
    for name in reader.get_variable_to_shape_map():
        reader.get_tensor(name)
    step = int(reader.get_tensor("global_step"))

    # Resumed as the killed job ran, tasks started by hand (a launcher would add nothing here).
    resumed = task_args(tmp_path, data_dir, f"--train_steps={step + 30}")
    with tasks(local_tf_configs(2), resumed) as procs:
        codes = {role: p.wait(timeout=240) for role, p in procs.items()}
    assert codes == {"chief-0": 0, "worker-0": 0}, report(
        f"the job resumed from step {step} exited {codes}, expected 0", procs
    )
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith(f"model.ckpt-{step + 30}")
    # The restarted chief removed the killed save's `_temp` before any task could write.
    assert not glob.glob(str(tmp_path / "*_temp*")), os.listdir(tmp_path)


#: The chief's one line when it skips checkpoints, moves them aside and cleans a `_temp`.
SKIPPED_LINE = (
    r"\[chief\] estimator_dist: skipped checkpoints model\.ckpt-300 \(its \.data is cut short: "
    r"model\.ckpt-300\.data-00000-of-00001 has [\d,]+ bytes, too few for '[^']+'\); "
    r"model\.ckpt-200 \(its \.index file is missing\); moved to {corrupt}; resuming from "
    r"model\.ckpt-100; removed model\.ckpt-400_temp \(left by a save that never finished\)\."
)


@pytest.mark.fault
@pytest.mark.timeout(360)
def test_a_corrupt_and_a_partial_checkpoint_are_skipped_and_the_job_ends_at_its_steps(
    tmp_path, data_dir, fault_seed
):
    # A job's checkpoints 0, 100, 200, 300, damaged as a filled disk (the latest cut short at
    # a seeded length), a lost file and a chief killed mid-save leave them; then the job goes
    # on to 400 under the launcher.
    model_dir = str(tmp_path)
    args = task_args(model_dir, data_dir, "--save_checkpoints_steps=100")
    run_module("estimator_dist.train", [*args, "--train_steps=300"], 180, model_dir=model_dir)
    data = tmp_path / "model.ckpt-300.data-00000-of-00001"
    cut = random.Random(fault_seed).randint(1, data.stat().st_size - 1)
    os.truncate(data, cut)
    os.remove(tmp_path / "model.ckpt-200.index")
    os.makedirs(tmp_path / "model.ckpt-400_temp")
    restored = (tmp_path / "model.ckpt-100.index").stat()
    launch = ["--num_workers=2", "--evaluator", "--max_restarts=0", "--timeout_secs=240", "--"]
    run = run_module(
        "estimator_dist.launch", [*launch, *args, "--train_steps=400"], 300, model_dir=model_dir
    )

    corrupt = re.escape(os.path.join(model_dir, "corrupt", ""))
    lines = re.findall(SKIPPED_LINE.format(corrupt=corrupt), run.output, re.M)
    assert len(lines) == 1, report(f"{len(lines)} lines naming the skipped checkpoints", run.output)
    assert sorted(os.listdir(tmp_path / "corrupt")) == [
        "model.ckpt-200.no-index",
        "model.ckpt-300.cut-short",
    ]
    assert sorted(os.listdir(tmp_path / "corrupt" / "model.ckpt-300.cut-short")) == [
        "model.ckpt-300.data-00000-of-00001",
        "model.ckpt-300.index",
        "model.ckpt-300.meta",
    ]
    assert not os.path.exists(tmp_path / "model.ckpt-400_temp")
    logs = {
        name: (tmp_path / "logs" / f"{name}.log").read_text() for name in ("chief-0", "worker-0")
    }
    for name, log in logs.items():
        assert f"Restoring parameters from {model_dir}/model.ckpt-100" in log, report(
            f"{name} did not restore model.ckpt-100", logs
        )
    # Not saved again on session creation while the worker restored it (patches, patch 10).
    again = (tmp_path / "model.ckpt-100.index").stat()
    assert (again.st_ino, again.st_mtime_ns) == (restored.st_ino, restored.st_mtime_ns)
    assert "holds global step 100 already; not saved again" in logs["chief-0"]
    latest = tf.train.latest_checkpoint(model_dir)
    assert latest.endswith("model.ckpt-400"), report(f"latest checkpoint {latest}", run.output)
    assert tf.train.load_checkpoint(latest).get_tensor("global_step") == 400
    final = json.load(open(tmp_path / "eval_metrics.json"))
    assert final["final"] and final["metrics"]["global_step"] == 400
    measured("corrupt_checkpoint", seed=fault_seed, cut_at=cut, resumed_from=100, steps_lost=200)


@pytest.mark.timeout(240)
def test_worker_that_never_starts_is_named(tmp_path, data_dir):
    cluster = make_local_cluster(3, free_ports(3))
    configs = cluster.tf_configs()
    del configs["worker-1"]
    missing = cluster.tasks[0].jobs["worker"][1]
    args = task_args(
        tmp_path, data_dir, "--train_steps=100", "--startup_timeout=8", "--batch_size=48"
    )
    with tasks(configs, args) as procs:
        codes = {role: p.wait(timeout=90) for role, p in procs.items()}
    output = all_output(procs)
    assert codes == {"chief-0": 151, "worker-0": 151}, report(
        f"exit codes {codes}, expected 151", procs
    )
    assert f"task(s) worker-1 ({missing}) never reached the chief" in output, report(
        "no task named worker-1 as never started", procs
    )
    assert not glob.glob(str(tmp_path / "model.ckpt-*"))


@pytest.mark.timeout(420)
def test_worker_whose_input_runs_out_fails_the_job(tmp_path, data_dir):
    args = [
        "--num_workers=2",
        "--noevaluator",  # no part in it: the training tasks fail
        "--max_restarts=1",
        "--grace_secs=3",
        "--timeout_secs=300",
        "--",
        *task_args(tmp_path, data_dir, "--train_steps=300"),
        "--input_fn=tests.task_inputs:finite_on_worker",
    ]
    with Background("estimator_dist.launch", args) as launcher:
        code = launcher.wait(timeout=300)
    output = launcher.output
    assert code == exit_codes.INPUT_EXHAUSTED, report(
        f"the launcher exited {code}, expected 6", output
    )
    # The worker fails itself, before its session closes, naming the cause...
    assert re.search(
        r"task worker-0 failed \(exit 6\): training on this task ended at global step "
        r"\d+, before --train_steps=300: its input ran out",
        output,
    ), report("worker-0 printed no exit-6 line naming its input", output)
    # ...the launcher blames it, even when the chief's lost-peer exit came first, and does not
    # restart: the same input would run out at the same place.
    failures = re.findall(r"\[launcher\] attempt \d failed: (.*); stopped every task", output)
    assert len(failures) == 1, report(f"{len(failures)} failed attempts, expected 1", output)
    assert failures[0].startswith("worker-0 exited with code 6 (INPUT_EXHAUSTED)"), report(
        f"the launcher blamed {failures[0][:80]!r}, expected worker-0's exit 6", output
    )
    assert "restarting the whole cluster" not in output, report("the job was restarted", output)
    assert "job failed (not retryable)" in output, report("no 'job failed (not retryable)'", output)


# --- preemption: SIGTERM stops every task at one step, checkpointed ----------------


def tfjob_tf_configs(num_workers):
    """TF_CONFIG of each task as the Kubeflow TFJob operator writes it, by role.

    Byte for byte its encoding (`tests/tfjob_operator.py`): every replica type in
    `cluster`, the evaluator included (here on a port nobody listens on: its process is
    not needed), keys sorted, and `"environment": "cloud"`; on free loopback ports.
    """
    ports = free_ports(num_workers + 1)
    cluster = {
        "chief": [f"localhost:{ports[0]}"],
        "evaluator": [f"localhost:{ports[-1]}"],
        "worker": [f"localhost:{port}" for port in ports[1:-1]],
    }
    roles = [("chief", 0), *(("worker", index) for index in range(num_workers - 1))]
    return {
        f"{kind}-{index}": go_json(
            {"cluster": cluster, "task": {"type": kind, "index": index}, "environment": "cloud"}
        )
        for kind, index in roles
    }


#: Who is signalled, with what, and the TF_CONFIG shape the tasks are started with.
PREEMPTIONS = {
    "sigterm-worker-tfjob": (("worker-0",), signal.SIGTERM, tfjob_tf_configs),
    "sigterm-chief-tfjob": (("chief-0",), signal.SIGTERM, tfjob_tf_configs),
    "sigterm-both": (("chief-0", "worker-0"), signal.SIGTERM, local_tf_configs),
    "sigint-worker": (("worker-0",), signal.SIGINT, local_tf_configs),
}


def preemption_args(model_dir, data_dir):
    # As a platform runs it: tasks started with TF_CONFIG, no launcher, checkpoints far apart.
    return task_args(
        model_dir,
        data_dir,
        "--save_checkpoints_steps=1000000",
        "--eval_distribution_strategy=off",
    )


def preempt(case, model_dir, data_dir):
    """Starts a 2-task job, signals it as `PREEMPTIONS[case]` says once the chief logged step
    100, waits for every task to exit; returns what the tests check."""
    signalled, signum, make_configs = PREEMPTIONS[case]
    configs = make_configs(2)
    args = [*preemption_args(model_dir, data_dir), "--train_steps=100000"]
    with tasks(configs, args) as procs:
        logged = wait_for_step(procs["chief-0"], 100, 120)
        for role in signalled:
            procs[role].process.send_signal(signum)
        sent = time.monotonic()
        codes = {role: p.wait(timeout=60) for role, p in procs.items()}
        elapsed = time.monotonic() - sent
    return dict(procs=procs, configs=configs, logged=logged, codes=codes, elapsed=elapsed)


@pytest.fixture(scope="module")
def preempted(shared_run, tmp_path_factory, data_dir):
    """`preempted(case)`: the outcome of `preempt(case)`, run once for the module, and the
    model_dir it trained in."""

    def get(case):
        def run():
            model_dir = tmp_path_factory.mktemp(case)
            return dict(preempt(case, model_dir, data_dir), model_dir=model_dir)

        return shared_run(("faults: preempted", case), run)

    return get


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", sorted(PREEMPTIONS))
def test_a_signal_stops_every_task_at_one_checkpointed_step(preempted, case):
    signalled, signum, make_configs = PREEMPTIONS[case]
    job = preempted(case)
    procs, configs, logged, codes, elapsed, tmp_path = (
        job[key] for key in ("procs", "configs", "logged", "codes", "elapsed", "model_dir")
    )
    output = all_output(procs)
    stopped = re.search(r"every task stops at global step (\d+)", output)
    assert stopped, report(f"exit codes {codes}; no task named the step every task stops at", procs)
    stop = int(stopped.group(1))
    # Each signalled task names the step it was at when the signal came.
    received = {
        role: re.search(rf"task {role} received {signum.name} at global step (\d+)", p.output)
        for role, p in procs.items()
        if role in signalled
    }
    missing = sorted(role for role, found in received.items() if not found)
    assert not missing, report(f"{missing} did not say at which step {signum.name} came", procs)
    at_signal = min(int(found.group(1)) for found in received.values())
    latest = tf.train.latest_checkpoint(str(tmp_path))
    measured(
        signum.name.lower(),
        target="+".join(signalled),
        tf_config="tfjob" if make_configs is tfjob_tf_configs else "local",
        signal_step=at_signal,
        stop_step=stop,
        checkpoint_step=latest.rsplit("-", 1)[1] if latest else None,
        exit_secs=f"{elapsed:.2f}",
    )
    assert codes == {"chief-0": exit_codes.PREEMPTED, "worker-0": exit_codes.PREEMPTED}, report(
        f"exit codes {codes}, expected 155", procs
    )
    assert exit_codes.is_retryable(exit_codes.PREEMPTED)
    assert elapsed < 10, report(
        f"the tasks exited {elapsed:.1f} s after {signum.name}, expected < 10", procs
    )
    assert max(logged, at_signal) <= stop, report(
        f"every task stopped at step {stop}, before step {logged} the chief logged before the "
        f"signal or step {at_signal} the signal came at",
        procs,
    )
    assert latest.endswith(f"model.ckpt-{stop}"), report(f"latest checkpoint {latest}", procs)
    for role in configs:
        line = f"task {role} failed (exit 155): stopped for a preemption at global step {stop}"
        assert line in output, report(f"{role} did not print {line!r}", procs)
    if make_configs is tfjob_tf_configs:
        for role, p in procs.items():
            assert "took 'evaluator' out of the cluster" in p.output, report(
                f"{role} did not say it took the TFJob's evaluator out of the cluster", procs
            )


#: The preemption the resume test continues from: SIGTERM to worker-0, which a scheduler
#: evicting one pod sends.
RESUMED = "sigterm-worker-tfjob"


@pytest.mark.timeout(480)
def test_a_preempted_job_resumes_from_its_stop_step_and_loses_none(preempted, data_dir):
    # Continues the job that test_a_signal_stops_every_task_at_one_checkpointed_step[RESUMED]
    # stopped (run once for both; that test checks how it stopped).
    job = preempted(RESUMED)
    procs, tmp_path = job["procs"], job["model_dir"]
    code = job["codes"]["chief-0"]
    assert code == exit_codes.PREEMPTED, report(f"chief-0 exited {code}, expected 155", procs)
    args = preemption_args(tmp_path, data_dir)
    stop = int(re.search(r"every task stops at global step (\d+)", procs["chief-0"].output)[1])
    saved = int(tf.train.load_checkpoint(str(tmp_path)).get_tensor("global_step"))
    # Restarted with the same ports taken anew, as a scheduler would: the first step it runs is
    # the one after the preemption's, and it ends at exactly --train_steps.
    last = saved + 40
    with tasks(local_tf_configs(2), [*args, f"--train_steps={last}"]) as procs:
        first = wait_for_step(procs["chief-0"], 0, 120, r"^I.*\] loss = .*step = (\d+)")
        codes = {role: p.wait(timeout=120) for role, p in procs.items()}
    final = tf.train.latest_checkpoint(str(tmp_path))
    measured(
        "resume",
        stop_step=stop,
        checkpoint_step=saved,
        first_step=first,
        final_step=final.rsplit("-", 1)[1] if final else None,
        steps_lost=stop - saved,
    )
    assert stop - saved == 0, f"the tasks stopped at step {stop}; the checkpoint is of step {saved}"
    assert codes == {"chief-0": 0, "worker-0": 0}, report(f"exit codes {codes}, expected 0", procs)
    # The logged step is the global step fetched in the same session call as its increment,
    # racing it: the first step after the restart shows as `stop` or `stop + 1`.
    assert first in (stop, stop + 1), f"resumed at step {first}, the preemption saved step {stop}"
    assert final.endswith(f"model.ckpt-{last}"), final


@pytest.mark.timeout(300)
def test_a_task_that_cannot_stop_exits_155_after_the_grace_keeping_its_checkpoints(
    tmp_path, data_dir
):
    # The worker is frozen (SIGSTOP, a paused VM) rather than killed: its connections stay
    # open, so the chief sees no error that would end it some other way, and cannot reach
    # the step it decides to stop at. Only the grace can end it.
    grace = 3
    configs = local_tf_configs(2)
    args = task_args(
        tmp_path,
        data_dir,
        "--train_steps=100000",
        "--save_checkpoints_steps=50",
        f"--preemption_grace_secs={grace}",
    )
    with tasks(configs, args) as procs:
        wait_for_checkpoint(str(tmp_path), 50, 120)
        procs["worker-0"].process.send_signal(signal.SIGSTOP)
        procs["chief-0"].process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = procs["chief-0"].wait(timeout=60)
        elapsed = time.monotonic() - sent
    output = procs["chief-0"].output
    steps = read_every_checkpoint(str(tmp_path))
    measured(
        "forced_exit",
        grace_secs=grace,
        exit_code=code,
        exit_secs=f"{elapsed:.2f}",
        checkpoint_step=max(steps),
    )
    assert code == exit_codes.PREEMPTED, report(f"chief-0 exited {code}, expected 155", procs)
    assert f"did not stop within the preemption grace of {grace} s" in output, report(
        "chief-0 did not say the grace ran out", procs
    )
    assert grace <= elapsed < 10, report(
        f"chief-0 exited {elapsed:.1f} s after SIGTERM, expected after the {grace} s grace "
        "and within 10 s",
        procs,
    )
    assert max(steps) >= 50, report(f"checkpoints of steps {steps}, expected one >= 50", procs)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", ["extra worker", "reordered"])
def test_tasks_with_different_cluster_lists_fail_with_a_diff(tmp_path, data_dir, case):
    ports = free_ports(3)
    configs = make_local_cluster(3, ports).tf_configs()
    if case == "extra worker":
        del configs["worker-1"]
        configs["chief-0"] = make_local_cluster(2, ports[:2]).tf_configs()["chief-0"]
        odd = "worker-0"
    else:
        # worker-1 sees the workers in the other order: it is worker 0 of that list.
        reordered = make_local_cluster(3, [ports[0], ports[2], ports[1]])
        configs["worker-1"] = reordered.tf_configs()["worker-0"]
        odd = "worker-1"
    # 48 divides over the 2 or 3 workers that each task's cluster list holds.
    args = task_args(
        tmp_path, data_dir, "--train_steps=100", "--startup_timeout=15", "--batch_size=48"
    )
    with tasks(configs, args) as procs:
        codes = {role: p.wait(timeout=90) for role, p in procs.items()}
    output = all_output(procs)
    expected = f"exit codes {codes}, expected 4 on chief-0 and {odd}"
    assert codes["chief-0"] == exit_codes.CLUSTER_MISMATCH, report(expected, procs)
    assert codes[odd] == exit_codes.CLUSTER_MISMATCH, report(expected, procs)
    assert "the tasks of the cluster disagree" in output, report(
        "no task said they disagree", procs
    )
    assert "cluster: chief has" in output, report("no task showed how the clusters differ", procs)


@pytest.mark.timeout(180)
def test_port_already_taken(tmp_path, data_dir):
    with socket.create_server(("", 0)) as taken:
        port = taken.getsockname()[1]
        configs = make_local_cluster(1, [port]).tf_configs()
        with tasks(configs, task_args(tmp_path, data_dir, "--train_steps=10")) as procs:
            code = procs["chief-0"].wait(timeout=60)
    output = procs["chief-0"].output
    assert code == exit_codes.PORT_IN_USE, report(f"chief-0 exited {code}, expected 154", procs)
    assert f"cannot listen on port {port}" in output, report(f"no word of port {port}", procs)


def listening_ports():
    output = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout
    return {int(line.split()[3].rsplit(":", 1)[1]) for line in output.splitlines() if line.strip()}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("isolated", [True, False])
def test_launcher_ports_are_hidden_from_the_host(tmp_path, data_dir, isolated):
    args = [
        "--num_workers=2",
        "--noevaluator",  # it listens on no port
        "--network_isolation" if isolated else "--nonetwork_isolation",
        "--",
        *task_args(tmp_path, data_dir, "--train_steps=100000"),
    ]
    with Background("estimator_dist.launch", args) as launcher:
        first = launcher.wait_for_line(r"^\[launcher\] ", 60).string
        launcher.wait_for_line(r"^\[chief\] .*ran its first step", 120)
        job_ports = {int(p) for p in re.findall(r"localhost:(\d+)", launcher.output)}
        open_ports = listening_ports()
    assert len(job_ports) == 2, report(
        f"job ports {sorted(job_ports)}, expected 2", launcher.output
    )
    if isolated:
        assert "private network namespace" in first, first
        assert not job_ports & open_ports, f"ports {sorted(job_ports & open_ports)} on the host"
    else:
        assert "WARNING: network: the host's network" in first, first
        assert job_ports <= open_ports, f"ports {sorted(job_ports - open_ports)} not on the host"


@pytest.mark.timeout(300)
def test_transient_error_on_one_worker_fails_the_job_instead_of_diverging(tmp_path, data_dir):
    configs = local_tf_configs(2)
    args = task_args(
        tmp_path,
        data_dir,
        "--train_steps=100000",
        "--collective_timeout=10",
        "--model_fn=tests.task_models:transient_error_on_worker",
    )
    with tasks(configs, args) as procs:
        codes = {role: p.wait(timeout=120) for role, p in procs.items()}
    output = all_output(procs)
    assert codes["worker-0"] in (exit_codes.PEER_FAILURE, exit_codes.SESSION_RECOVERY), report(
        f"exit codes {codes}, expected 150 or 153 on worker-0", procs
    )
    assert "injected transient error on the worker" in output, report("no injected error", procs)
    # TensorFlow's own log line when it silently re-creates a session and restores.
    assert "a new session will be created" not in output, report("a session was re-created", procs)
    assert codes["chief-0"] in (exit_codes.PEER_FAILURE, exit_codes.STALLED), report(
        f"exit codes {codes}, expected 150 or 152 on chief-0", procs
    )


# --- a model_dir that refuses writes (a frozen task: faults_heartbeat_test.py) ----------


def mount_namespace_prefix(directory, size_mib):
    """Runs a command with a `size_mib` tmpfs on `directory`, in a private mount namespace.

    Nothing is mounted on the host. The command's exit code is printed as `exited with N`,
    then the namespace is held open (the test kills the group) so that the files can be
    read through /proc/<pid>/root. Skips, saying why, where mounting is not allowed.
    """
    probe = subprocess.run(
        ["unshare", "--mount", "mount", "-t", "tmpfs", "tmpfs", str(directory)],
        capture_output=True,
        text=True,
    )
    if probe.returncode:
        pytest.skip(f"cannot mount a tmpfs in a private mount namespace: {probe.stderr.strip()}")
    script = (
        f'mount -t tmpfs -o size={size_mib}m tmpfs "$0" && "$@"; echo "exited with $?"; '
        "exec sleep 600"
    )
    # unshare makes the new namespace's mounts private: none propagates to the host.
    return ("unshare", "--mount", "sh", "-c", script, str(directory))


def read_logs(directory):
    """The task logs in `directory`, by file name."""
    logs = {}
    for path in glob.glob(os.path.join(directory, "*.log")):
        with open(path, errors="replace") as stream:
            logs[os.path.basename(path)] = stream.read()
    return logs


def unannounced_log_losses(output, logs):
    """Says which task's shown lines are missing from its log with no word from the launcher.

    The launcher shows a task's line as it is, or only its message (after `WARNING: ` or
    `FATAL: `), so each shown line, without those, must be somewhere in the task's log.

    Args:
      output: A launcher's output; `[chief] ` lines come from `logs/chief-0.log`, and so on.
      logs: The log files' contents, by file name.
    """
    lost = []
    for name, text in by_task(output).items():
        if name in ("launcher", "output"):
            continue
        log = f"{name}-0.log" if name in (CHIEF, "evaluator") else f"{name}.log"
        said = rf"^\[launcher\] cannot write \S+/logs/{re.escape(log)} "
        if re.search(said, output, re.MULTILINE):
            continue
        written = logs.get(log, "")
        shown = [re.sub(r"^(?:WARNING|FATAL): ", "", line) for line in text.splitlines()]
        missing = [line for line in shown if line not in written]
        if missing:
            lost.append(
                f"{len(missing)} line(s) of {name} are not in logs/{log}, and the launcher did not "
                f"say it could not write them; the last: {missing[-1][:160]!r}"
            )
    return lost


#: What every refused write says, with the path and the free space.
UNWRITABLE = (
    r"task (?:local|chief-0|worker-0) failed \(exit 9\): cannot write the (?P<what>.+?) to "
    r"{model_dir} at global step \d+: {reason} \((?P<path>{model_dir}/\S+); "
    r"\d+(?:\.\d)? [KMG]iB free of [\d.]+ [KMG]iB on its filesystem[;)].*?training resumes "
    r"from {model_dir}/model\.ckpt-(?P<step>\d+)\. A restart would fail the same way, so the "
    r"job is not retried: {fix}"
)


@pytest.mark.timeout(360)
def test_full_model_dir_exits_9_naming_the_path_and_keeps_its_checkpoints(tmp_path, data_dir):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    args = task_args(model_dir, data_dir, "--train_steps=100000", "--save_checkpoints_steps=50")
    with Background(
        "estimator_dist.train", args, prefix=mount_namespace_prefix(model_dir, 20)
    ) as run:
        inside = f"/proc/{run.process.pid}/root{model_dir}"
        wait_for_checkpoint(inside, 50, 120)
        with open(os.path.join(inside, "filler"), "wb", buffering=0) as filler:
            with pytest.raises(OSError, match="No space left on device"):
                while True:
                    filler.write(bytes(1 << 20))
        code = int(run.wait_for_line(r"^exited with (\d+)", 120).group(1))
        steps = read_every_checkpoint(inside)
    output = run.output
    found = re.search(
        UNWRITABLE.format(
            model_dir=re.escape(str(model_dir)),
            reason="No space left on device",
            fix=r"free space on that filesystem \(delete old runs, or keep fewer checkpoints",
        ),
        output,
    )
    assert code == exit_codes.MODEL_DIR_UNWRITABLE, report(
        f"exited {code}, expected 9", {"train": run}
    )
    assert found, report(
        "no exit-9 line naming the path, the free space and the fix", {"train": run}
    )
    print(f"the disk filled up; the first refused write: the {found['what']}, {found['path']}")
    assert max(steps) == int(found["step"]) >= 50, report(
        f"checkpoints of steps {steps}; the failure named step {found['step']}", {"train": run}
    )


@pytest.mark.timeout(420)
def test_read_only_model_dir_fails_the_job_at_once_with_exit_9(tmp_path, data_dir):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    args = [
        "--num_workers=2",
        "--noevaluator",
        "--max_restarts=3",
        "--grace_secs=3",
        "--timeout_secs=300",
        "--",
        *task_args(model_dir, data_dir, "--train_steps=100000", "--save_checkpoints_steps=50"),
    ]
    with Background(
        "estimator_dist.launch", args, prefix=mount_namespace_prefix(model_dir, 50)
    ) as launcher:
        inside = f"/proc/{launcher.process.pid}/root{model_dir}"
        wait_for_checkpoint(inside, 50, 180)
        # A read-only bind mount over it: files already open (the logs) stay writable.
        remount = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0"'
        namespace = ("nsenter", f"--target={launcher.process.pid}", "--mount")
        # The remount is refused while a write is under way ("mount point is busy", once in
        # CI): tried again until it takes, within 30 s.
        deadline = time.monotonic() + 30
        while True:
            done = subprocess.run(
                [*namespace, "sh", "-c", remount, str(model_dir)], capture_output=True, text=True
            )
            if done.returncode == 0:
                break
            assert time.monotonic() < deadline and "busy" in done.stderr, done.stderr
            time.sleep(0.2)
        code = int(launcher.wait_for_line(r"^exited with (\d+)", 120).group(1))
        steps = read_every_checkpoint(inside)
    output = launcher.output
    assert code == exit_codes.MODEL_DIR_UNWRITABLE, report(f"the launcher exited {code}", output)
    found = re.search(
        UNWRITABLE.format(
            model_dir=re.escape(str(model_dir)),
            reason="Read-only file system",
            fix="remount that filesystem read-write",
        ),
        output,
    )
    assert found, report("no exit-9 line naming the path, the free space and the fix", output)
    print(f"read-only; the first refused write: the {found['what']}, {found['path']}")
    assert max(steps) == int(found["step"]) >= 50, report(
        f"checkpoints of steps {steps}; the failure named step {found['step']}", output
    )
    assert re.search(
        r"\[launcher\] attempt 0 failed: (chief|worker-0) exited with code 9 "
        r"\(MODEL_DIR_UNWRITABLE\): cannot write the",
        output,
    ), report("the launcher did not blame attempt 0 on the refused write", output)
    assert "job failed (not retryable)" in output, report("no 'job failed (not retryable)'", output)
    assert "restarting the whole cluster" not in output, report("the job was restarted", output)
    starts = len(re.findall(r"\[launcher\] started chief ", output))
    assert starts == 1, report(f"the chief started {starts} times, expected once", output)


@pytest.mark.timeout(360)
def test_model_dir_without_write_permission_exits_9(tmp_path, data_dir):
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    args = task_args(model_dir, data_dir, "--train_steps=100000", "--save_checkpoints_steps=50")
    # Without CAP_DAC_OVERRIDE, root obeys permission bits as any user does.
    unprivileged = ("setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner")
    with Background("estimator_dist.train", args, prefix=unprivileged) as run:
        wait_for_checkpoint(str(model_dir), 50, 120)
        model_dir.chmod(0o555)
        code = run.wait(timeout=120)
    output = run.output
    found = re.search(
        UNWRITABLE.format(
            model_dir=re.escape(str(model_dir)),
            reason="Permission denied",
            fix=r"give this user \(uid 0\) write permission on that directory",
        ),
        output,
    )
    assert code == exit_codes.MODEL_DIR_UNWRITABLE, report(
        f"exited {code}, expected 9", {"train": run}
    )
    assert found, report("no exit-9 line naming the path and the fix", {"train": run})
    print(f"no permission; the first refused write: the {found['what']}, {found['path']}")
    steps = read_every_checkpoint(str(model_dir))
    assert max(steps) == int(found["step"]) >= 50, report(
        f"checkpoints of steps {steps}; the failure named step {found['step']}", {"train": run}
    )


@pytest.mark.timeout(240)
def test_model_dir_without_write_permission_from_the_start_exits_9_before_training(
    tmp_path, data_dir
):
    model_dir = tmp_path / "model"
    model_dir.mkdir(mode=0o555)
    args = task_args(model_dir, data_dir, "--train_steps=100")
    unprivileged = ("setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner")
    with Background("estimator_dist.train", args, prefix=unprivileged) as run:
        code = run.wait(timeout=120)
    output = run.output
    assert code == exit_codes.MODEL_DIR_UNWRITABLE, report(
        f"exited {code}, expected 9", {"train": run}
    )
    assert re.search(
        rf"task local failed \(exit 9\): cannot write the .+? to {re.escape(str(model_dir))}: "
        r"Permission denied \(.+\)\. No checkpoint had been written yet\.",
        output,
    ), report("no exit-9 line saying no checkpoint had been written", {"train": run})
    assert not os.listdir(model_dir)


@pytest.mark.fault
@pytest.mark.timeout(420)
def test_full_model_dir_under_the_launcher_fails_at_once_with_exit_9(
    tmp_path, data_dir, fault_seed
):
    # The launcher's task logs live in model_dir/logs, on the same full filesystem.
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    args = [
        "--num_workers=2",
        "--max_restarts=3",
        "--grace_secs=3",
        "--timeout_secs=300",
        "--",
        *task_args(model_dir, data_dir, "--train_steps=100000", "--save_checkpoints_steps=50"),
    ]
    with Background(
        "estimator_dist.launch", args, prefix=mount_namespace_prefix(model_dir, 50)
    ) as launcher:
        inside = f"/proc/{launcher.process.pid}/root{model_dir}"
        # The disk fills after a seeded checkpoint.
        filled_after = 50 * random.Random(fault_seed).randint(1, 3)
        wait_for_checkpoint(inside, filled_after, 180)
        with open(os.path.join(inside, "filler"), "wb", buffering=0) as filler:
            with pytest.raises(OSError, match="No space left on device"):
                while True:
                    filler.write(bytes(1 << 20))
        filled = time.monotonic()
        code = int(launcher.wait_for_line(r"^exited with (\d+)", 120).group(1))
        measured("full_disk", seed=fault_seed, exit_secs=f"{time.monotonic() - filled:.1f}")
        steps = read_every_checkpoint(inside)
        logs = read_logs(os.path.join(inside, "logs"))
    output = launcher.output
    assert code == exit_codes.MODEL_DIR_UNWRITABLE, report(f"the launcher exited {code}", output)
    assert re.search(
        r"\[launcher\] attempt 0 failed: \S+ exited with code 9 \(MODEL_DIR_UNWRITABLE\): "
        r"cannot write the .+No space left on device",
        output,
    ), report("the launcher did not blame attempt 0 on the full filesystem", output)
    assert "job failed (not retryable)" in output, report("no 'job failed (not retryable)'", output)
    assert "restarting the whole cluster" not in output, report("the job was restarted", output)
    # Whether a log line finds no room depends on timing (the room left in the log's last
    # page, the old checkpoints the chief deletes), but no line may go missing unannounced.
    lost = unannounced_log_losses(output, logs)
    assert not lost, report("; ".join(lost), output)
    refused = re.findall(r"\[launcher\] cannot write \S+/logs/(\S+\.log) \(No space left", output)
    print(f"the disk filled up; task logs the launcher could not write: {refused or 'none'}")
    assert max(steps) >= filled_after, report(
        f"checkpoints of steps {steps}, expected one >= {filled_after}", output
    )
