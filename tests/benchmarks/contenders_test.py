"""What keeps the Estimator contenders comparable: the same checkpoint and summary intervals.

Estimator's CheckpointSaverHook assumes 1,000,000 steps per session call: with
a checkpoint interval of at most that, it reads the global step again, in a
session call of its own, after every step. Two contenders with intervals on
either side of 1,000,000 would run different numbers of session calls per
step (the package paid one more per step at 2 workers x 64 until both used
`NEVER_STEPS`).
"""

import os

import pytest
import tensorflow as tf
from tensorflow.python.client import session as session_lib

from benchmarks import NEVER_STEPS, contenders
from benchmarks.contenders import STEPS, Config
from tests.task_models import linear_model_fn, ones_input_fn

pytestmark = pytest.mark.timeout(120)


def test_every_contender_uses_the_same_intervals_beyond_any_run():
    args = contenders.package_args(Config(workers=2), "/tmp/model", 1000, 200)
    assert f"--save_checkpoints_steps={NEVER_STEPS}" in args
    assert f"--save_summary_steps={NEVER_STEPS}" in args
    for module in ("handwritten", "horovod_estimator", "input_pipeline"):
        with open(os.path.join(os.path.dirname(contenders.__file__), f"{module}.py")) as f:
            source = f.read()
        assert "save_checkpoints_steps=NEVER_STEPS" in source, module
        assert "save_summary_steps=NEVER_STEPS" in source, module
    assert NEVER_STEPS > 1_000_000 + max(total for total, _ in STEPS.values())


@pytest.mark.slow
@pytest.mark.parametrize("interval, calls_per_step", [(1_000_000, 2), (NEVER_STEPS, 1)])
def test_a_checkpoint_interval_up_to_a_million_costs_a_session_call_per_step(
    tmp_path, monkeypatch, interval, calls_per_step
):
    calls = []
    run = session_lib.BaseSession.run
    monkeypatch.setattr(
        session_lib.BaseSession, "run", lambda self, *a, **k: calls.append(1) or run(self, *a, **k)
    )
    config = tf.estimator.RunConfig(
        model_dir=str(tmp_path),
        save_checkpoints_steps=interval,
        save_summary_steps=NEVER_STEPS,
        # No step counter: it reads the global step when a stale read, which may land
        # before or after the increment, crosses its interval (one call more or less).
        log_step_count_steps=None,
    )
    estimator = tf.estimator.Estimator(linear_model_fn, config=config)

    def calls_to_train(steps):
        before = len(calls)
        estimator.train(ones_input_fn, steps=steps)
        return len(calls) - before

    # Start-up and end calls are the same in both runs: the difference is 50 steps' calls,
    # give or take one: StopAtStepHook reads the global step once more when a stale read
    # (racing the increment in the same session call) already shows the last step.
    estimator.train(ones_input_fn, steps=1)
    difference = calls_to_train(100) - calls_to_train(50)
    assert abs(difference - 50 * calls_per_step) <= 1, difference
