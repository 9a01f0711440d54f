"""The evaluator supervised for what it is: frozen, or finding its checkpoint rotated away.

One job under the launcher (2 workers and an evaluator, mnist_cnn on the
embedded digits) takes both faults in turn, each asserted on its own:

* the evaluator is frozen (SIGSTOP) after it began an evaluation and before
  it restored its checkpoint, until training rotated that checkpoint away
  (`--keep_checkpoint_max=2`), then continued: it exits 159 CHECKPOINT_GONE
  naming the checkpoint, and is restarted alone;
* the restarted evaluator is frozen at a seeded moment (in its start-up or
  in an evaluation) for good: its heartbeat stops, the launcher kills it after
  `supervise.EVALUATOR_SILENCE_SECS` and restarts it alone.

Training is never restarted, and the job ends at exactly --train_steps with
a final evaluation of the last checkpoint. (It supersedes the launcher test of
an evaluator killed from outside: the same restart, after a SIGKILL.)
"""

import glob
import json
import os
import random
import re
import signal
import time

import pytest
import tensorflow as tf

from estimator_dist.base import exit_codes
from estimator_dist.launcher.supervise import EVALUATOR_SILENCE_SECS
from estimator_dist.report import status
from tests.estimator_dist.launch_test import assert_no_task_left, subreaper  # noqa: F401
from tests.procs import Background, measured, report

pytestmark = [pytest.mark.multiprocess, pytest.mark.fault]

# Training must outlast the evaluator's start-up and its first evaluation, so that the frozen
# evaluator's checkpoint can still be rotated away: 3,000 steps once ended first in CI.
STEPS = 10000
SAVE_STEPS = 100


class LogTail:
    """A task's log file (`model_dir/logs/<task>.log`), read as it grows."""

    def __init__(self, path):
        self.path, self.text = path, ""

    def read(self):
        if os.path.exists(self.path):
            with open(self.path) as stream:
                self.text = stream.read()
        return self.text

    def count(self, pattern):
        return len(re.findall(pattern, self.read()))


def stopped(pid):
    """Whether `pid` is stopped (state T): every thread of it frozen."""
    with open(f"/proc/{pid}/stat") as stream:
        return stream.read().rsplit(")", 1)[1].split()[0] in ("T", "t")


def freeze(pid):
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while not stopped(pid):
        assert time.monotonic() < deadline, f"pid {pid} did not stop"
        time.sleep(0.001)
    return time.monotonic()


def freeze_before_restore(pid, log, timeout):
    """Freezes the evaluator between the start of an evaluation and its checkpoint's restore.

    The window lasts while the session is created (tens of milliseconds): the
    evaluator is frozen as soon as an evaluation starts, and continued if it
    turns out to have restored already; a later evaluation is caught then.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        starts = log.count(r"Starting evaluation at")
        if starts > log.count(r"Restoring parameters from"):
            freeze(pid)
            time.sleep(0.3)  # What it printed before it stopped reaches the log.
            if log.count(r"Restoring parameters from") < starts:
                return
            os.kill(pid, signal.SIGCONT)
        time.sleep(0.002)
    raise AssertionError(f"no evaluation caught before its restore in {timeout} s")


def checkpoint_steps(model_dir):
    return {
        int(re.search(r"model\.ckpt-(\d+)\.index$", path).group(1))
        for path in glob.glob(os.path.join(model_dir, "model.ckpt-*.index"))
    }


def wait_until_gone(model_dir, steps, timeout):
    """Waits until training rotated away every checkpoint of `steps`."""
    deadline = time.monotonic() + timeout
    while checkpoint_steps(model_dir) & steps:
        assert time.monotonic() < deadline, f"checkpoints {steps} still there after {timeout} s"
        time.sleep(0.05)


def line_time(launcher, pattern, timeout):
    """Waits for a launcher line matching `pattern`; returns the match and when it came."""
    match = launcher.wait_for_line(pattern, timeout)
    return match, time.monotonic()


@pytest.mark.timeout(300)
@pytest.mark.usefixtures("subreaper")  # Tasks left behind become this process's children.
def test_a_frozen_evaluator_and_one_whose_checkpoint_was_rotated_away_are_restarted_alone(
    tmp_path, data_dir, fault_seed
):
    rng = random.Random(fault_seed)
    model_dir = str(tmp_path / "model")
    args = [
        "--num_workers=2",
        "--evaluator",
        "--max_restarts=3",
        "--timeout_secs=280",
        "--",
        f"--model_dir={model_dir}",
        f"--data_dir={data_dir}",
        f"--train_steps={STEPS}",
        f"--save_checkpoints_steps={SAVE_STEPS}",
        "--keep_checkpoint_max=2",
        "--eval_throttle_secs=1",
    ]
    log = LogTail(os.path.join(model_dir, "logs", "evaluator-0.log"))
    with Background("estimator_dist.launch", args) as launcher:
        pid = int(launcher.wait_for_line(r"started evaluator \(pid (\d+)\)", 120).group(1))
        # (b) Frozen before its restore until its checkpoint is rotated away, then continued.
        freeze_before_restore(pid, log, 60)
        listed = checkpoint_steps(model_dir)
        wait_until_gone(model_dir, listed, 60)
        os.kill(pid, signal.SIGCONT)
        continued_at = time.monotonic()
        gone, gone_at = line_time(
            launcher,
            r"\[launcher\] evaluator exited with code 159 \(CHECKPOINT_GONE\): the checkpoint "
            r"(\S+) was deleted while this task restored it.*restarting the evaluator alone",
            60,
        )
        # It listed its checkpoint before it began the evaluation, so at the freeze or earlier.
        named = int(gone.group(1).rsplit("-", 1)[1])
        assert named <= max(listed) and named not in checkpoint_steps(model_dir), report(
            f"159 named {gone.group(1)}; at the freeze: {sorted(listed)}", launcher.output
        )
        # (a) The restarted evaluator frozen for good, in its start-up or in an evaluation.
        restarted, started_at = line_time(launcher, r"started evaluator \(pid (\d+)\)", 30)
        pid = int(restarted.group(1))
        phase = rng.choice(["start-up", "evaluation"])
        if phase == "start-up":
            time.sleep(max(0.0, started_at + rng.uniform(0.5, 3.0) - time.monotonic()))
        else:
            evaluations = log.count(r"Starting evaluation at")
            deadline = time.monotonic() + 60
            while log.count(r"Starting evaluation at") == evaluations:
                assert time.monotonic() < deadline, report("no evaluation", launcher.output)
                time.sleep(0.002)
        frozen_at = freeze(pid)
        killed, detected_at = line_time(
            launcher,
            r"\[launcher\] evaluator was killed by SIGKILL: it sent nothing on its status "
            r"channel for (\d+) s .*restarting the evaluator alone from checkpoint step (\d+)",
            EVALUATOR_SILENCE_SECS + 30,
        )
        _, restarted_at = line_time(launcher, r"started evaluator \(pid (\d+)\)", 30)
        code = launcher.wait(timeout=200)
        ended_at = time.monotonic()
        assert_no_task_left(launcher)  # The killed evaluators included.
    output = launcher.output
    assert code == 0, report(f"the launcher exited {code}, expected 0", output)
    # Silence counts from its last heartbeat, up to one interval before the freeze.
    detected = detected_at - frozen_at
    earliest = EVALUATOR_SILENCE_SECS - status.HEARTBEAT_SECS - 0.5
    assert earliest <= detected < EVALUATOR_SILENCE_SECS + 5, report(
        f"the frozen evaluator was killed {detected:.1f} s after SIGSTOP", output
    )
    # Training went on: never restarted, no exit 5 blaming the user's code.
    assert "restarting the whole cluster" not in output, report("training restarted", output)
    assert all(output.count(f"started {role} (pid") == 1 for role in ("chief", "worker-0"))
    assert output.count("started evaluator (pid") == 3, report("not 2 evaluator restarts", output)
    assert f"exit {exit_codes.USER_CODE}" not in output and "Fix the code" not in output
    latest = tf.train.latest_checkpoint(model_dir)
    assert latest.endswith(f"model.ckpt-{STEPS}"), report(f"latest checkpoint {latest}", output)
    final = json.load(open(os.path.join(model_dir, "eval_metrics.json")))
    assert final["final"] and final["metrics"]["global_step"] == STEPS, final
    measured(
        "evaluator_faults",
        seed=fault_seed,
        frozen_in=phase,
        detected_secs=f"{detected:.1f}",
        restart_secs=f"{restarted_at - detected_at:.2f}",
        final_evaluation_after_kill_secs=f"{ended_at - detected_at:.1f}",
        checkpoint_gone=gone.group(1).rsplit("/", 1)[1],
        gone_restart_secs=f"{gone_at - continued_at:.2f}",
        training_restarts=0,
    )
