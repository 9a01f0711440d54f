"""train()/evaluate() loops and early stopping of whole legacy programs, on a cluster too.

The programs are `tests/legacy/scripts/train_evaluate_loop.py` (train/evaluate
cycles, an export, predictions) and `early_stopping.py` (an early-stopping
hook in the TrainSpec), each run in one process and on 2 workers and an
evaluator through the launcher: real processes, bounded, logs printed on
failure.
"""

import glob
import json
import os
import re

import numpy as np
import pytest
import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.cluster.tf_config import ClusterConfig, parse_tf_config
from estimator_dist.config.guards import GuardConfig
from estimator_dist.guards.preemption import EARLY_STOP, Preemption
from estimator_dist.programs import loop as script_loop
from estimator_dist.programs import results as script_results
from estimator_dist.task import early_stopping
from tests.procs import REPO, run_module

SCRIPTS = os.path.join(REPO, "tests", "legacy", "scripts")
TIMEOUT = 240


def test_metrics_cross_tasks_with_their_values_and_types():
    metrics = {
        "accuracy": np.float32(0.8125),
        "global_step": np.int64(80),
        "auc": np.float64(1 / 3),
        "confusion": np.array([[1, 2], [3, 4]], np.int32),
    }
    decoded = script_results.decode_metrics(
        json.loads(json.dumps(script_results.encode_metrics(metrics), sort_keys=True))
    )
    # In the chief's order, as the program prints it, though the file sorts the keys.
    assert list(decoded) == list(metrics)
    for name, value in metrics.items():
        assert decoded[name].dtype == value.dtype, name
        np.testing.assert_array_equal(decoded[name], value)
    assert type(decoded["accuracy"]) is np.float32


def _estimator(tmp_path, tf_config, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
    config = tf.estimator.RunConfig(model_dir=str(tmp_path))
    return tf.estimator.Estimator(lambda features, labels, mode: None, config=config)


@pytest.mark.parametrize("task_type", ["chief", "worker"])
def test_early_stopping_hooks_are_decided_by_the_chief_alone(tmp_path, monkeypatch, task_type):
    tf_config = {
        "cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"]},
        "task": {"type": task_type, "index": 0},
    }
    estimator = _estimator(tmp_path, tf_config, monkeypatch)
    cluster = parse_tf_config(json.dumps(tf_config))
    hook = tf.estimator.experimental.stop_if_higher_hook(estimator, "accuracy", 0.9)
    other = tf.compat.v1.train.StepCounterHook()
    preemption = Preemption(f"{task_type}-0", str(tmp_path), task_type)
    hooks = early_stopping.agreed([hook, other], preemption, cluster, channel=True)
    if task_type == "chief":
        assert [type(h) for h in hooks] == [early_stopping.AgreedStopHook, type(other)]
    else:
        assert hooks == [other]  # TensorFlow's _CheckForStoppingHook would wait forever.
    # Without the channel the chief alone would stop: refused, with the fix.
    with pytest.raises(UsageError, match="Drop --nopreemption_checkpoint"):
        early_stopping.agreed([hook, other], preemption, cluster, channel=False)


def test_one_process_stops_where_estimators_own_hook_would(tmp_path, monkeypatch):
    estimator = _estimator(tmp_path, {}, monkeypatch)
    hook = tf.estimator.experimental.stop_if_higher_hook(estimator, "accuracy", 0.9)
    preemption = Preemption("local", str(tmp_path), "chief")
    (agreed,) = early_stopping.agreed([hook], preemption, ClusterConfig(), channel=False)
    requests = []

    class Context:
        def request_stop(self):
            requests.append(True)

    agreed._should_stop = lambda: True
    agreed.after_run(Context(), tf.compat.v1.train.SessionRunValues(7, None, None))
    assert requests == [True]  # After this step, no step ahead to agree on.
    assert preemption.reason.startswith(EARLY_STOP) and preemption.stop_at is None
    assert early_stopping.stopped_early(preemption)


def test_a_stop_asked_by_early_stopping_is_decided_and_ends_with_no_preemption_exit(tmp_path):
    exits = []
    chief = Preemption("chief-0", str(tmp_path), "chief", exit_fn=lambda *a: exits.append(a))
    tf.io.gfile.makedirs(os.path.join(str(tmp_path), "preemption"))
    chief.session_started(40)
    chief.request_stop(40, "stop_if_higher")
    chief.poll_once()
    assert chief.stop_at is not None and chief.stop_at > 40
    assert chief.reason == f"{EARLY_STOP}: stop_if_higher" and not chief.requested
    while not chief.step_done():
        pass
    chief.finished()
    assert exits == []
    decision = json.load(open(os.path.join(str(tmp_path), "preemption", "decision.json")))
    assert decision["done"] and decision["saved_step"] == chief.stop_at


def launch(script, model_dir, *program_args, model_dir_flag=True, evaluator=True):
    """The launcher on 2 workers (and an evaluator) running `script` (checked: exit 0).

    A train()/evaluate() program's evaluator only says it has no part and ends
    (`script_loop.EVALUATOR_LEAVES`, checked by the train/evaluate loop's test): the
    other programs of that kind run without one, one TensorFlow start-up fewer.
    """
    return run_module(
        "estimator_dist.launch",
        [
            "--num_workers=2",
            "--evaluator" if evaluator else "--noevaluator",
            f"--script={os.path.join(SCRIPTS, script)}",
            "--communication=RING",
            "--timeout_secs=200",
            *([f"--model_dir={model_dir}"] if model_dir_flag else []),
            "--",
            *program_args,
        ],
        TIMEOUT,
        model_dir=model_dir,
    )


def _kernel(model_dir):
    return tf.train.load_variable(model_dir, "dense/kernel")


def _loop_args(model_dir, results):
    # Two cycles: the second trains on from the first's evaluation, as any later one would.
    return [f"--model_dir={model_dir}", f"--results_dir={results}", "--cycles=2"]


@pytest.mark.multiprocess
def test_a_train_evaluate_loop_on_two_workers_equals_one_process(tmp_path):
    script = os.path.join(SCRIPTS, "train_evaluate_loop.py")
    alone, cluster = str(tmp_path / "alone"), str(tmp_path / "cluster")
    run_module(
        "estimator_dist.script",
        [script, *_loop_args(alone, tmp_path / "alone_results")],
        TIMEOUT,
        model_dir=alone,
    )
    run = launch(
        "train_evaluate_loop.py",
        cluster,
        *_loop_args(cluster, tmp_path / "cluster_results"),
        model_dir_flag=False,
    )
    results = {
        os.path.basename(path): json.load(open(path))
        for path in glob.glob(str(tmp_path / "cluster_results" / "*.json"))
    }
    # Every task took the same branches with the same values and types.
    assert sorted(results) == ["chief-0.json", "worker-0.json"], run.describe()
    assert results["chief-0.json"] == results["worker-0.json"]
    history = results["chief-0.json"]["history"]
    assert [cycle["global_step"] for cycle in history] == [[20, "<i8"], [40, "<i8"]]
    assert history[-1]["accuracy"][1] == "<f4"
    reference = json.load(open(tmp_path / "alone_results" / "local.json"))["history"]
    assert len(reference) == len(history) == 2
    for one, two in zip(reference, history):
        assert abs(one["loss"][0] - two["loss"][0]) <= 1e-5, (reference, history)
    np.testing.assert_allclose(_kernel(cluster), _kernel(alone), atol=1e-5)
    # One export, written by the chief, whose path every task returned.
    assert glob.glob(os.path.join(cluster, "export", "*")) == [results["chief-0.json"]["export"]]
    assert results["worker-0.json"]["predictions"] == 200
    final = run.json("eval_metrics.json")
    assert final["final"] and final["metrics"]["global_step"] == 40, final
    assert "[evaluator] estimator_dist: the program calls estimator.train() outside" in run.output
    assert "[launcher] final evaluation: global_step=40" in run.output


@pytest.mark.multiprocess
def test_early_stopping_stops_every_task_at_one_checkpointed_step(tmp_path):
    model_dir = str(tmp_path / "model")
    # The script's Estimator gets no model_dir: it gets the launcher's.
    run = launch("early_stopping.py", model_dir, "--max_steps=100000")
    record = run.json("run_record.json")
    stopped = record["stopped_early"]
    assert stopped["reason"].startswith(EARLY_STOP), record
    step = stopped["step"]
    assert 0 < step < 100000
    assert tf.train.latest_checkpoint(model_dir).endswith(f"model.ckpt-{step}")
    final = run.json("eval_metrics.json")
    assert final["final"] and final["metrics"]["global_step"] == step, final
    assert final["metrics"]["accuracy"] >= 0.9
    assert run.json("last_step.json")["last_step"] == step
    assert "exited with code 0" not in run.output


@pytest.mark.multiprocess
def test_two_estimators_without_a_model_dir_each_get_their_own_on_two_workers(tmp_path):
    """As plain TensorFlow gives each a temporary directory: the second never restores the first.

    On one shared directory the second classifier (a crossed column more) restored the
    first's checkpoint and failed (NotFoundError, exit 1).
    """
    model_dir = str(tmp_path / "model")
    run = launch("two_without_model_dir.py", model_dir, "--steps=20", evaluator=False)
    first = tf.train.latest_checkpoint(model_dir)
    second = tf.train.latest_checkpoint(os.path.join(model_dir, "estimator-2"))
    # The launcher follows each estimator's own directory: the second's last step, 40, is in
    # estimator-2 (read from the job's directory, 20, it failed the job with exit 6).
    assert first.endswith("model.ckpt-20") and second.endswith("model.ckpt-40"), run.describe()
    variables = {name for name, _ in tf.train.list_variables(second)}
    assert any("age_X_sex" in name for name in variables), sorted(variables)
    assert run.output.count("accuracy ") >= 2, run.describe()


@pytest.mark.multiprocess
def test_an_estimator_settling_its_model_dir_before_its_constructor_shares_it(tmp_path):
    """TensorFlow Lattice's shape: files written to the model_dir before `Estimator.__init__`.

    With a temporary directory per task there, the worker waited for the chief's
    keypoints in its own directory until the program's bound (TensorFlow Lattice
    waits 2,400 s), and the job failed.
    """
    model_dir = str(tmp_path / "model")
    run = launch("keypoints_before_init.py", model_dir, "--steps=10", evaluator=False)
    # The second gets a directory of its own, made before its constructor as TensorFlow makes
    # a temporary one (the chief's keypoints had nowhere to go: NotFoundError).
    for directory in (model_dir, os.path.join(model_dir, "estimator-2")):
        assert os.path.exists(os.path.join(directory, "keypoints.json")), run.describe()
        assert tf.train.latest_checkpoint(directory).endswith("model.ckpt-10"), run.describe()
    assert run.output.count("accuracy ") >= 4, run.describe()


@pytest.mark.multiprocess
def test_each_model_cleared_between_calls_is_evaluated_before_the_next_one(tmp_path):
    """rmtree(model_dir), then train_and_evaluate, twice with two models: the evaluator's turn.

    The evaluator starts after the chief's first step, when short trainings have ended: without
    the chief waiting for it before clearing, it evaluated the next model's checkpoints in the
    first call (a DNN checkpoint restored into the linear model: NotFoundError, exit 1).
    """
    model_dir = str(tmp_path / "model")
    run = launch("retrain_in_one_dir.py", model_dir, f"--outdir={model_dir}")
    evaluator_log = open(os.path.join(model_dir, "logs", "evaluator-0.log")).read()
    evaluated = re.findall(r"Saving dict for global step (\d+):", evaluator_log)
    # Each call's final evaluation, of its own model, in the order the program made them.
    assert [int(step) for step in evaluated][-1] == 20, run.describe()
    assert 10 in [int(step) for step in evaluated], evaluated
    assert evaluated.index("10") < evaluated.index("20"), evaluated
    assert (
        "waiting for the evaluator to finish evaluating"
        in open(os.path.join(model_dir, "logs", "chief-0.log")).read()
    )
    assert tf.train.latest_checkpoint(model_dir).endswith("model.ckpt-20"), run.describe()


@pytest.mark.multiprocess
def test_the_chief_does_not_wait_for_an_evaluator_that_left_the_program(tmp_path):
    """A train() call first: the evaluator has no part in the program and ends at once.

    Then the chief's wait before the second model's clearing found no evaluation to wait for
    and would have lasted --startup_timeout + --stall_timeout (the launcher's timeout first).
    """
    model_dir = str(tmp_path / "model")
    run = launch("retrain_in_one_dir.py", model_dir, f"--outdir={model_dir}", "--train_first")
    assert "evaluator has no part" in run.output or "[launcher] evaluator finished" in run.output
    assert tf.train.latest_checkpoint(model_dir).endswith("model.ckpt-20"), run.describe()
    chief = open(os.path.join(model_dir, "logs", "chief-0.log")).read()
    assert "did not finish evaluating" not in chief


@pytest.mark.multiprocess
def test_a_train_op_that_never_steps_the_global_step_ends_with_its_input_as_alone(tmp_path):
    """TensorFlow Lattice's custom estimator: train() until the input ends, global step at 0.

    The tasks agreed on the input's end as a global step the train_op never reaches: the
    job failed with exit 6 ("training ended at global step 0, before ... its input ran out").
    """
    script = os.path.join(SCRIPTS, "global_step_stays.py")
    alone, cluster = str(tmp_path / "alone"), str(tmp_path / "cluster")
    run_module(
        "estimator_dist.script",
        [script, f"--model_dir={alone}", f"--results_dir={tmp_path / 'alone_results'}"],
        TIMEOUT,
        model_dir=alone,
    )
    results = f"--results_dir={tmp_path / 'cluster_results'}"
    run = launch("global_step_stays.py", cluster, f"--model_dir={cluster}", results)
    local = json.load(open(tmp_path / "alone_results" / "local.json"))
    chief = json.load(open(tmp_path / "cluster_results" / "chief-0.json"))
    worker = json.load(open(tmp_path / "cluster_results" / "worker-0.json"))
    assert chief == worker, run.describe()
    # As one process: the checkpoint of step 0 (saved when the session began) is evaluated.
    assert local["global_step"] == chief["global_step"] == 0, (local, chief)
    assert tf.train.latest_checkpoint(cluster).endswith("model.ckpt-0"), run.describe()
    for name in ("auc", "loss"):
        assert abs(local[name] - chief[name]) <= 1e-5, (local, chief)
    chief_log = open(os.path.join(cluster, "logs", "chief-0.log")).read()
    # 3 epochs of 200 rows in batches of 20 on each worker (no input_context: the whole frame).
    assert "ran the 30 batches of the shortest training input" in chief_log, run.describe()
    assert run.json("last_step.json")["last_step"] == 0


@pytest.mark.multiprocess
def test_a_helper_trained_in_a_constructor_on_the_chief_alone_trains_there_as_alone(tmp_path):
    """TensorFlow Lattice's crystals: the constructor prefits an Estimator when `is_chief`.

    Every train() was a segment all training tasks join: the chief waited for the worker's
    input count, the worker for the chief's structure file, until the launcher's timeout.
    """
    script = os.path.join(SCRIPTS, "prefit_in_constructor.py")
    alone = str(tmp_path / "alone")
    run_module(
        "estimator_dist.script",
        [script, f"--results_dir={tmp_path / 'alone_results'}"],
        TIMEOUT,
        model_dir=alone,
    )
    model_dir = str(tmp_path / "model")
    run = launch("prefit_in_constructor.py", model_dir, f"--results_dir={tmp_path / 'results'}")
    local = json.load(open(tmp_path / "alone_results" / "local.json"))
    chief = json.load(open(tmp_path / "results" / "chief-0.json"))
    worker = json.load(open(tmp_path / "results" / "worker-0.json"))
    assert chief == worker, run.describe()
    # The helper found the same features on the chief as in one process; the classifier then
    # trained 2 epochs of 200 rows in batches of 20 on every task, in the job's directory.
    assert chief["mask"] == local["mask"], (chief, local)
    assert chief["global_step"] == local["global_step"] == 20, (chief, local)
    assert chief["model_dir"] == model_dir
    assert chief["export"].startswith(model_dir), chief
    # The helper kept TensorFlow's temporary directory: no directory of the job's was its.
    assert sorted(os.listdir(model_dir)).count("estimator-2") == 0, os.listdir(model_dir)
    chief_log = open(os.path.join(model_dir, "logs", "chief-0.log")).read()
    assert "train() inside the constructor of PrefitClassifier runs on this task alone" in (
        chief_log
    ), run.describe()


@pytest.mark.multiprocess
def test_two_models_cleared_between_trained_for_epochs_on_two_workers(tmp_path):
    """rmtree(model_dir) before each model, train() with no steps over epochs of a frame."""
    script = os.path.join(SCRIPTS, "two_models.py")
    alone, cluster = str(tmp_path / "alone"), str(tmp_path / "cluster")
    run_module(
        "estimator_dist.script",
        [script, f"--outdir={alone}", f"--results_dir={tmp_path / 'alone_results'}"],
        TIMEOUT,
        model_dir=alone,
    )
    results = f"--results_dir={tmp_path / 'cluster_results'}"
    run = launch("two_models.py", cluster, f"--outdir={cluster}", results, evaluator=False)
    chief = json.load(open(tmp_path / "cluster_results" / "chief-0.json"))
    worker = json.load(open(tmp_path / "cluster_results" / "worker-0.json"))
    assert chief == worker, run.describe()
    # 3 epochs of 640 rows in batches of 64, for each model, from step 0 after each clearing.
    assert [r["global_step"] for r in chief["results"]] == [30.0, 30.0]
    # Every worker reads the whole frame (no input_context): the linear model's step is one
    # process's, duplicated.
    alone_results = json.load(open(tmp_path / "alone_results" / "local.json"))["results"]
    assert (
        abs(chief["results"][0]["loss"] - alone_results[0]["loss"])
        <= 1e-5 * alone_results[0]["loss"]
    )
    # The chief alone cleared model_dir the second time, once the worker had arrived, keeping
    # the launcher's task logs.
    assert sorted(os.listdir(os.path.join(cluster, "logs"))) == [
        "chief-0.log",
        "launcher.log",
        "worker-0.log",
    ]
    (attempt,) = glob.glob(os.path.join(cluster, "loop", "*"))
    assert {"rmtree-1.json", "rmtree-1-worker-0.json"} <= set(os.listdir(attempt))
    assert run.json("eval_metrics.json")["final"]


@pytest.mark.multiprocess
def test_early_stopping_in_one_process_ends_with_its_final_evaluation(tmp_path):
    model_dir = str(tmp_path / "model")
    run = run_module(
        "estimator_dist.script",
        [
            f"--model_dir={model_dir}",
            os.path.join(SCRIPTS, "early_stopping.py"),
            "--max_steps=100000",
        ],
        TIMEOUT,
        model_dir=model_dir,
    )
    stopped = run.json("run_record.json")["stopped_early"]
    assert stopped["reason"].startswith(EARLY_STOP) and 0 < stopped["step"] < 100000
    recorded = run.json("last_step.json")
    assert (recorded["last_step"], recorded["how"]) == (stopped["step"], stopped["reason"])
    final = run.json("eval_metrics.json")
    assert final["final"] and final["metrics"]["global_step"] == stopped["step"], final
    assert tf.train.latest_checkpoint(model_dir).endswith(f"model.ckpt-{stopped['step']}")


@pytest.mark.multiprocess
def test_a_keras_model_to_estimator_tutorial_trains_on_two_workers(tmp_path):
    """Its temporary model_dir per task becomes the launcher's; every task warm-starts alike."""
    model_dir = str(tmp_path / "model")
    run = launch("keras_tutorial.py", model_dir, "--steps=20", evaluator=False)
    assert tf.train.latest_checkpoint(model_dir).endswith("model.ckpt-20"), run.describe()
    assert os.path.exists(os.path.join(model_dir, "keras", "keras_model.ckpt.index"))
    final = run.json("eval_metrics.json")
    assert final["final"] and final["metrics"]["global_step"] == 20, final


class _Program:
    """What LoopTask asks of its program's task, for calls that end before any training."""

    attempt = "attempt-1"

    def __init__(self, model_dir):
        self._model_dir = model_dir

    def model_dir_of(self, estimator):
        return self._model_dir

    def join(self, model_dir):
        pass

    def where_in_program(self):
        return "train.py:7: "


def _worker_loop(tmp_path, cluster):
    tf_config = {"cluster": cluster, "task": {"type": "worker", "index": 0}}
    cluster = parse_tf_config(json.dumps(tf_config))
    return script_loop.LoopTask(_Program(str(tmp_path)), cluster, GuardConfig(stall_timeout=60))


def test_train_refuses_what_estimator_refuses_and_an_unbounded_segment_with_ps(tmp_path):
    cluster = {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]}
    loop = _worker_loop(tmp_path, cluster)
    with pytest.raises(ValueError, match="Can not provide both steps and max_steps"):
        loop.train(None, None, None, steps=5, max_steps=10)
    with pytest.raises(ValueError, match="Must specify steps > 0, given: 0"):
        loop.train(None, None, None, steps=0)
    with pytest.raises(UsageError) as raised:
        loop.train(None, None, None)
    assert str(raised.value) == script_loop.NO_STEPS_PS.format(where="train.py:7: ")
