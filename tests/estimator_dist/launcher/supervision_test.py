"""End to end: the launcher supervises by its tasks' status events, and shows progress once.

One job, 2 workers and an evaluator under `estimator_dist.launch`, with a
user model_fn that prints, at graph building and after each of its first
training steps, every line the launcher once read as a fact: a first step,
steps far ahead, failures, the last step of a script, the console protocol.
The job must go as if they were not there: it succeeds, the launcher's first
step and final lines are the real ones, and the console shows each progress
step once, the chief's.
"""

import os
import re
import sys

import pytest

from tests.procs import REPO, run_module

TIMEOUT = 300
STEPS = 200
EVERY = 50

USER_MODEL = '''
import tensorflow as tf

from estimator_dist.report.console import PROTOCOL_LINE
from model_fns import mnist_cnn

MIMICS = [
    "global step 999",
    "INFO:tensorflow:loss = 0.41, step = 999 (0.512 sec)",
    "estimator_dist: task chief-0 ran its first step (global step 999).",
    "ran its first step",
    "estimator_dist: task chief failed (exit 150): fake",
    "estimator_dist.train: error: fake",
    "estimator_dist.script: training to max_steps=999 in model_dir /tmp (task chief-0)",
    PROTOCOL_LINE,
]


def say_everything():
    for line in MIMICS:
        print(line, flush=True)


class Mimic(tf.compat.v1.train.SessionRunHook):
    """Prints the mimics after each of the first steps, while the launcher is watching."""

    def __init__(self):
        self._runs = 0

    def after_run(self, run_context, run_values):
        self._runs += 1
        if self._runs <= 3:
            say_everything()


def model_fn(features, labels, mode, params):
    say_everything()
    spec = mnist_cnn.model_fn(features, labels, mode, params)
    if mode == tf.estimator.ModeKeys.TRAIN:
        spec = spec._replace(training_hooks=(*spec.training_hooks, Mimic()))
    return spec
'''


@pytest.fixture
def job(tmp_path, data_dir, shared_run):
    """The job's finished run, once for the tests of this module."""

    def run():
        (tmp_path / "mimicking_model.py").write_text(USER_MODEL)
        model_dir = str(tmp_path / "model")
        return run_module(
            "estimator_dist.launch",
            [
                "--num_workers=2",
                "--evaluator",
                "--timeout_secs=250",
                "--",
                f"--model_dir={model_dir}",
                f"--data_dir={data_dir}",
                "--model_fn=mimicking_model:model_fn",
                f"--train_steps={STEPS}",
                f"--log_step_count_steps={EVERY}",
                "--save_checkpoints_steps=100",
                "--batch_size=64",
                "--communication=RING",
                "--eval_throttle_secs=1",
            ],
            TIMEOUT,
            env={"PYTHONPATH": os.pathsep.join([str(tmp_path), REPO, *sys.path])},
            model_dir=model_dir,
        )

    return shared_run("supervision: a model_fn printing the old markers", run)


@pytest.mark.multiprocess
@pytest.mark.timeout(TIMEOUT + 60)
def test_lines_a_model_fn_prints_do_not_steer_the_launcher(job):
    output = job.output
    # The mimics reached the console: the launcher saw them, and decided nothing from them.
    assert "[chief] global step 999" in output, job.describe()
    assert "[worker-0] estimator_dist: task chief failed (exit 150): fake" in output
    said = [line for line in output.splitlines() if line.startswith("[launcher] ")]
    firsts = [line for line in said if "first training step" in line]
    assert len(firsts) == 1, job.describe()
    # The chief printed its mimics before its first step, the launcher's line comes after them.
    assert output.index("[chief] ran its first step") < output.index(firsts[0])
    assert not [line for line in said if "999" in line or "fake" in line], said
    assert not [line for line in said if "restart" in line or "failed" in line], said
    assert f"[launcher] final evaluation: global_step={STEPS}, accuracy=" in output
    assert job.json("eval_metrics.json")["metrics"]["global_step"] == STEPS


@pytest.mark.multiprocess
@pytest.mark.timeout(TIMEOUT + 60)
def test_the_console_shows_each_progress_step_once_the_chiefs(job):
    progress = re.findall(r"^\[(\S+)\] \[ *\d+%\] .*step = (\d+)/(\d+)", job.output, re.M)
    assert progress == [("chief", str(step), str(STEPS)) for step in range(EVERY, STEPS + 1, EVERY)]
    assert "lags the chief" not in job.output
    # The workers' own progress lines stay in their logs.
    with open(os.path.join(job.model_dir, "logs", "worker-0.log")) as log:
        assert re.search(rf"\] \[100%\] .*step = {STEPS}/{STEPS}", log.read())
