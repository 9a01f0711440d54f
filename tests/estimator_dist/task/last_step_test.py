"""The last step a script's input decides, and the evaluator that waits for it.

Unit tests: the decision from the tasks' counts, counting an input in a
throwaway graph, the evaluator's wait for the decision and its stall
judgement (fake clocks), its sleeps cut short at the last step. Then whole
scripts (`tests/legacy/scripts/epochs.py`, EvalSpec at its 120 s / 600 s
defaults) in one process and on 2 workers + an evaluator, and 2 workers over
their shards equal to 1 worker with twice the batch for the decided steps.
"""

import json
import os
import time

import numpy as np
import pytest
import tensorflow as tf

from estimator_dist.base import exit_codes
from estimator_dist.base.errors import ClusterTimeoutError, UsageError
from estimator_dist.cluster.tf_config import parse_tf_config
from estimator_dist.guards.evaluator_watchdog import EvaluatorWatchdog, judge
from estimator_dist.task import last_step
from estimator_dist.task.user_code import present_input_fn
from estimator_dist.tf_runtime import patches
from tests.equivalence import TOLERANCE, checkpoint_variables, max_difference
from tests.procs import REPO, measured, run_module, run_modules

SCRIPT = os.path.join(REPO, "tests", "legacy", "scripts", "epochs.py")
TIMEOUT = 200
#: TensorFlow's EvalSpec default, which the scripts keep.
START_DELAY_SECS = 120


def cardinality(batches):
    return {"batches": batches, "how": last_step.CARDINALITY, "seconds": 0.01}


# --- the decision ------------------------------------------------------------------


def test_the_fewest_batches_decide_and_the_surplus_is_named():
    decision = last_step.decide({"chief-0": cardinality(19), "worker-0": cardinality(18)}, 0, None)
    assert (decision["last_step"], decision["how"]) == (18, last_step.CARDINALITY)
    assert decision["untrained_batches"] == {"chief-0": 1}
    assert "chief-0 leaves its last 1 batch(es) untrained" in last_step.describe(decision)


def test_training_resumes_from_the_start_step_and_max_steps_caps():
    counts = {"chief-0": cardinality(10), "worker-0": cardinality(12)}
    assert last_step.decide(counts, 30, None)["last_step"] == 40
    capped = last_step.decide(counts, 30, 35)
    assert (capped["last_step"], capped["how"]) == (35, last_step.MAX_STEPS)
    beyond = last_step.decide(counts, 0, 1000)
    assert (beyond["last_step"], beyond["how"]) == (10, last_step.CARDINALITY)


def test_a_counted_input_and_an_unending_one():
    counted = {"batches": 7, "how": last_step.COUNTED, "seconds": 0.2}
    unending = {"batches": None, "how": last_step.REPEATS, "seconds": 0.0}
    decision = last_step.decide({"chief-0": counted, "worker-0": cardinality(9)}, 0, None)
    assert (decision["last_step"], decision["how"]) == (7, last_step.COUNTED)
    assert last_step.decide({"chief-0": unending}, 0, 50)["last_step"] == 50
    with pytest.raises(UsageError, match="repeats forever .*Give TrainSpec"):
        last_step.decide({"chief-0": unending, "worker-0": unending}, 0, None)


def test_tasks_whose_max_steps_differ_train_to_the_chiefs(tmp_path, caplog):
    # A program that computes max_steps from an unseeded split gets a number per task.
    cluster = parse_tf_config(
        json.dumps({"cluster": {"chief": ["h0:1"], "worker": ["h1:1"]}, "task": {"type": "worker"}})
    )
    counts = {
        "chief-0": {**cardinality(5000), "start": 0, "max_steps": 2415},
        "worker-0": {**cardinality(5000), "start": 0, "max_steps": 2404},
    }
    last, decision = last_step.decide_for_task(cluster, str(tmp_path), counts, 2404, 10)
    assert last == 2415 and decision["how"] == last_step.MAX_STEPS
    assert "computed different max_steps (chief-0 2415, worker-0 2404)" in caplog.text


def test_a_count_past_its_time_bound_fails_only_without_max_steps():
    late = {"batches": None, "how": last_step.COUNTED, "timed_out": True, "seconds": 300.0}
    last_step.check_count(late, "worker-0", 1000)
    with pytest.raises(UsageError, match="did not end within 300 s .*give|Give TrainSpec"):
        last_step.check_count(late, "worker-0", None)


# --- counting ----------------------------------------------------------------------


def count(input_fn, limit=None, timeout=30.0, context=None):
    return last_step.count_input(
        present_input_fn(input_fn), {}, tf.estimator.RunConfig(), context, limit, timeout
    )


def test_counts_a_sharded_dataset_by_its_cardinality():
    def input_fn(input_context):
        dataset = tf.data.Dataset.range(91)
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        return dataset.repeat(2).batch(5)

    counts = [
        count(input_fn, context=tf.distribute.InputContext(2, index, 2))["batches"]
        for index in (0, 1)
    ]
    assert counts == [19, 18]


def test_counts_an_input_of_unknown_size_by_reading_it_up_to_the_limit():
    def input_fn():
        return tf.data.Dataset.range(60).filter(lambda x: x >= 0).batch(4)

    assert count(input_fn) == {
        "batches": 15,
        "how": last_step.COUNTED,
        "seconds": pytest.approx(0, abs=30),
    }
    assert count(input_fn, limit=5)["batches"] == 5


def test_counts_numpy_input_fn_batches_through_its_queue_runners():
    features = {"x": np.arange(100, dtype=np.float32)}
    input_fn = tf.compat.v1.estimator.inputs.numpy_input_fn(
        features, np.zeros(100, np.float32), batch_size=16, num_epochs=2, shuffle=False
    )
    assert count(input_fn)["batches"] == 13
    forever = tf.compat.v1.estimator.inputs.numpy_input_fn(
        features, batch_size=16, num_epochs=None, shuffle=False
    )
    assert count(forever)["batches"] is None


def test_an_input_that_repeats_forever_is_not_read():
    result = count(lambda: tf.data.Dataset.range(3).repeat().batch(2))
    assert (result["batches"], result["how"]) == (None, last_step.REPEATS)


def test_a_count_stops_at_its_time_bound():
    slow = count(lambda: tf.data.Dataset.range(10**9).repeat().filter(lambda x: True), timeout=0.5)
    assert slow["batches"] is None and slow["timed_out"] and slow["seconds"] < 10


# --- the evaluator -----------------------------------------------------------------


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_the_evaluator_waits_for_the_decision_bounded_by_the_startup_timeout(tmp_path):
    clock = FakeClock()
    with pytest.raises(ClusterTimeoutError, match="no last_step.json"):
        last_step.wait_for_decision(str(tmp_path), lambda: False, 60, None, clock, clock.sleep)
    assert clock.now >= 60
    assert last_step.wait_for_decision(str(tmp_path), lambda: True, 5, 40, clock, clock.sleep) == 40
    last_step.write_decision(str(tmp_path), {"last_step": 13, "how": last_step.COUNTED})
    assert (
        last_step.wait_for_decision(str(tmp_path), lambda: False, 5, None, clock, clock.sleep) == 13
    )


def test_the_evaluator_is_stalled_only_when_it_waits_and_training_stopped_early():
    def verdict(**changes):
        state = dict(
            sleeping=False,
            evaluating=False,
            latest_step=50,
            evaluated_step=50,
            last_step=100,
            since_checkpoint=200.0,
            stall_timeout=120.0,
            chief_gone=lambda: True,
        )
        state.update(changes)
        return judge(**state)

    assert verdict() == exit_codes.STALLED
    assert verdict(sleeping=True) is None  # Sleeping as TensorFlow told it to.
    assert verdict(latest_step=100) is None  # Training reached its last step.
    assert verdict(evaluated_step=40) is None  # A newer checkpoint: evaluated next.
    assert verdict(since_checkpoint=100.0) is None
    assert verdict(chief_gone=lambda: False) is None
    assert verdict(evaluating=True) == exit_codes.EVAL_UNENDING
    assert verdict(latest_step=None, evaluated_step=None) == exit_codes.STALLED


def test_the_evaluators_sleep_ends_once_the_last_step_is_checkpointed(tmp_path, refusing):
    dog = EvaluatorWatchdog("evaluator-0", str(tmp_path), {"chief-0": refusing}, 60, 10)
    dog.start()
    try:
        started = time.monotonic()
        dog.sleep(0.6)  # No final checkpoint: the whole sleep.
        assert time.monotonic() - started >= 0.6
        (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-10"\n')
        (tmp_path / "model.ckpt-10.index").write_bytes(b"")
        started = time.monotonic()
        dog.sleep(600)
        assert time.monotonic() - started < 5
    finally:
        dog.stop()


def test_training_py_sleeps_through_the_function_set(patches_installed):
    from tensorflow_estimator.python.estimator import training

    slept = []
    patches.set_training_sleep(slept.append)
    try:
        training.time.sleep(120)
    finally:
        patches.set_training_sleep(None)
    assert slept == [120]
    assert training.time.time() == pytest.approx(time.time(), abs=5)


@pytest.fixture
def refusing():
    import portpicker

    return f"localhost:{portpicker.pick_unused_port()}"


# --- whole scripts -----------------------------------------------------------------

#: Each shape: the script's arguments, then the last step on 2 workers and how it was found,
#: the batches a longer shard leaves untrained, and the last step in one process.
SHAPES = {
    # Every worker reads all 100 examples: 200 / 16 = 12.5 -> 13 batches.
    "numpy_epochs": (["--input=numpy", "--examples=100", "--batch=16"], 13, "input counted", {}),
    # 91 examples sharded 46 / 45, twice, in 5s: 19 and 18 batches.
    "repeat_uneven_shards": (
        ["--input=shards", "--examples=91", "--batch=5"],
        18,
        "input cardinality",
        {"chief-0": 1},
    ),
    # 60 examples sharded 30 / 30, once, through a filter, in 4s: 8 batches each, < 1000.
    "max_steps_beyond_the_data": (
        ["--input=finite", "--examples=60", "--batch=4", "--max_steps=1000"],
        8,
        "input counted",
        {},
    ),
}
#: The same scripts in one process: (arguments, last step). 96 x 2 / 16 = 12 steps.
ALONE = {
    "numpy_epochs": (SHAPES["numpy_epochs"][0], 13),
    "max_steps_beyond_the_data": (SHAPES["max_steps_beyond_the_data"][0], 15),
    "repeat_even_shards": (["--input=shards", "--examples=96", "--batch=16"], 12),
}


def read_json(model_dir, name):
    with open(os.path.join(model_dir, name)) as stream:
        return json.load(stream)


def assert_final_evaluation(model_dir, last):
    final = read_json(model_dir, "eval_metrics.json")
    assert final["final"] is True, final
    assert final["metrics"]["global_step"] == last, final
    assert final["checkpoint"].endswith(f"model.ckpt-{last}"), final


@pytest.mark.multiprocess
def test_scripts_trained_by_their_input_in_one_process(tmp_path):
    commands = [
        ("estimator_dist.script", [SCRIPT, f"--model_dir={tmp_path / name}", *args], None)
        for name, (args, _) in sorted(ALONE.items())
    ]
    runs = run_modules(commands, TIMEOUT)
    for (name, (_, last)), run in zip(sorted(ALONE.items()), runs):
        model_dir = str(tmp_path / name)
        assert_final_evaluation(model_dir, last)
        assert f"Final evaluation: global_step={last}, loss=" in run.output, run.output
        decision = read_json(model_dir, last_step.DECISION_FILE)
        assert (decision["last_step"], decision["how"]) == (last, "input ended"), decision


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_scripts_trained_by_their_input_on_two_workers_and_an_evaluator(tmp_path, name):
    args, last, how, untrained = SHAPES[name]
    model_dir = str(tmp_path / "model")
    started = time.time()
    run = run_module(
        "estimator_dist.launch",
        [
            "--num_workers=2",
            "--evaluator",
            f"--script={SCRIPT}",
            f"--model_dir={model_dir}",
            "--communication=RING",
            "--timeout_secs=150",
            "--",
            f"--model_dir={model_dir}",
            *args,
        ],
        TIMEOUT,
        model_dir=model_dir,
    )
    assert_final_evaluation(model_dir, last)
    decision = read_json(model_dir, last_step.DECISION_FILE)
    assert (decision["last_step"], decision["how"]) == (last, how), decision
    assert decision["untrained_batches"] == untrained, decision
    assert sorted(decision["counts"]) == ["chief-0", "worker-0"], decision
    assert read_json(model_dir, "run_record.json")["last_step"] == decision
    assert f"[launcher] final evaluation: global_step={last}, " in run.output
    assert "ended or failed before the last step" not in run.output
    assert "restarting" not in run.output, run.describe()
    # EvalSpec keeps its 120 s start delay and 600 s throttle; the final checkpoint is
    # evaluated at once: long before the start delay would have passed.
    evaluated = os.path.getmtime(os.path.join(model_dir, "eval_metrics.json"))
    checkpointed = os.path.getmtime(os.path.join(model_dir, f"model.ckpt-{last}.index"))
    assert evaluated - started < START_DELAY_SECS, run.describe()
    measured(
        "final_evaluation",
        shape=name,
        last_step_to_final_eval_secs=f"{evaluated - checkpointed:.1f}",
        job_secs=f"{time.time() - started:.1f}",
        count_secs=",".join(f"{c['seconds']:.2f}" for c in decision["counts"].values()),
    )


@pytest.mark.multiprocess
def test_two_workers_over_their_shards_equal_one_worker_with_twice_the_batch(tmp_path):
    """Epoch-bounded: each decides 12 steps (96 examples, twice, 8 per worker or 16)."""
    alone, pair = str(tmp_path / "alone"), str(tmp_path / "pair")
    data = ["--input=shards", "--examples=96"]
    run_modules(
        [
            ("estimator_dist.script", [SCRIPT, f"--model_dir={alone}", *data, "--batch=16"], alone),
            (
                "estimator_dist.launch",
                [
                    "--num_workers=2",
                    "--noevaluator",
                    f"--script={SCRIPT}",
                    f"--model_dir={pair}",
                    "--communication=RING",
                    "--timeout_secs=150",
                    "--",
                    f"--model_dir={pair}",
                    *data,
                    "--batch=8",
                ],
                pair,
            ),
        ],
        TIMEOUT,
    )
    decision = read_json(pair, last_step.DECISION_FILE)
    assert (decision["last_step"], decision["how"]) == (12, "input cardinality"), decision
    assert read_json(alone, last_step.DECISION_FILE)["last_step"] == 12
    one, two = checkpoint_variables(alone, 12), checkpoint_variables(pair, 12)
    difference = max_difference(one, two)
    moved = max(float(np.max(np.abs(value))) for value in one.values())
    measured("epochs_equivalence", max_difference=f"{difference:.2e}", moved=f"{moved:.3f}")
    assert moved > 1000 * TOLERANCE, one  # Training moved the weights far past the tolerance.
    assert difference < TOLERANCE, (difference, one, two)
