"""Early stopping that stops every task: the predicate in words, and --stop_threshold end to end."""

import json
import os

import pytest
import tensorflow as tf

from estimator_dist.base import exit_codes
from estimator_dist.base.errors import UsageError
from estimator_dist.config.train_args import job_from_args
from estimator_dist.guards.preemption import EARLY_STOP
from estimator_dist.task import early_stopping
from tests.procs import run_module

TIMEOUT = 240


def test_tensorflows_predicates_are_described_by_what_they_wait_for(tmp_path):
    estimator = tf.estimator.Estimator(lambda features, labels, mode: None, str(tmp_path))
    higher = tf.estimator.experimental.stop_if_higher_hook(estimator, "accuracy", 0.9)
    lower = tf.estimator.experimental.stop_if_no_decrease_hook(estimator, "loss", 300)

    def patience():
        return False

    assert early_stopping.describe(higher._should_stop_fn) == "accuracy greater than 0.9"
    assert early_stopping.describe(lower._should_stop_fn) == "no decrease of loss in 300 steps"
    assert early_stopping.describe(patience).endswith("patience")


def test_fail_with_a_stop_threshold_that_is_not_a_number(tmp_path):
    with pytest.raises(UsageError) as raised:
        job_from_args([f"--model_dir={tmp_path}", "--stop_threshold=nan"])
    assert str(raised.value) == (
        "--stop_threshold must be a number (an accuracy such as 0.9), received nan."
    )
    assert raised.value.exit_code == exit_codes.USAGE


@pytest.mark.multiprocess
def test_stop_threshold_stops_two_workers_and_the_evaluator_at_one_step(tmp_path, data_dir):
    model_dir = str(tmp_path / "model")
    run = run_module(
        "estimator_dist.launch",
        [
            "--num_workers=2",
            "--evaluator",
            "--timeout_secs=200",
            "--",
            f"--model_dir={model_dir}",
            f"--data_dir={data_dir}",
            "--train_steps=100000",
            "--communication=RING",
            "--eval_throttle_secs=1",
            "--save_checkpoints_steps=50",
            "--stop_threshold=0.9",
        ],
        TIMEOUT,
        model_dir=model_dir,
    )
    record = run.json("run_record.json")
    stopped = record["stopped_early"]
    assert stopped["reason"] == f"{EARLY_STOP}: accuracy greater than 0.9", record
    assert 0 < stopped["step"] < 100000
    assert tf.train.latest_checkpoint(model_dir).endswith(f"model.ckpt-{stopped['step']}")
    final = run.json("eval_metrics.json")
    assert final["final"] and final["metrics"]["global_step"] == stopped["step"], final
    assert final["metrics"]["accuracy"] >= 0.9
    with open(os.path.join(model_dir, "last_step.json")) as stream:
        assert json.load(stream)["last_step"] == stopped["step"]
