"""Whole legacy training scripts, unchanged: in one process, on 2 workers and an evaluator.

The two scripts of `tests/legacy/scripts/` build their own Estimator and call
`train_and_evaluate` themselves; `estimator_dist.script` gives them the
strategy, watchdogs and metrics file of a task. Every run is a real process
(or a real launcher and its tasks), bounded, its process group killed at the
end, its task logs printed on failure.
"""

import contextlib
import json
import os
import re
import signal
import textwrap
import time
import types

import portpicker
import pytest
import tensorflow as tf

from estimator_dist.base import exit_codes
from estimator_dist.cluster.tf_config import ClusterConfig, parse_tf_config
from estimator_dist.guards.startup import Startup
from estimator_dist.programs import loop as script_loop
from estimator_dist.programs.config import ScriptConfig
from estimator_dist.programs.task import ScriptTask
from estimator_dist.tf_runtime.estimators import set_run_config, with_distribution
from tests.procs import REPO, Background, run_module

SCRIPTS = os.path.join(REPO, "tests", "legacy", "scripts")
TIMEOUT = 240
#: Each script: its file, its arguments besides --model_dir, the last step, a metric bound.
WHOLE = {
    # Its Dense layer starts from unseeded weights: 0.00014 to 0.0113 seen after 200 steps;
    # predicting 0 scores about 0.11.
    "migration_guide_tf1": ("migration_guide_tf1.py", ["--max_steps=200"], 200, ("loss", 0.03)),
    "canned_wide_and_deep": (
        "canned_wide_and_deep.py",
        ["--train_steps=300"],
        300,
        ("auc", 0.9),
    ),
}
#: Launcher flags for an evaluation of every checkpoint (EvalSpec's 120 s / 600 s would skip them).
QUICK_EVALUATION = ["--eval_start_delay_secs=0", "--eval_throttle_secs=1"]


def assert_trained(run, steps, role, num_workers, bound):
    """The final evaluation, the last checkpoint and the run record of a finished script."""
    final = run.json("eval_metrics.json")
    assert final["final"] is True, final
    assert final["metrics"]["global_step"] == steps, final
    name, limit = bound
    value = final["metrics"][name]
    script = os.path.basename(run.json("run_record.json")["script"])
    print(f"CORPUS {script} {num_workers}-worker(s) {name}={value:.4g} step={steps}")
    assert value < limit if name == "loss" else value > limit, final
    latest = tf.train.latest_checkpoint(run.model_dir)
    assert latest and latest.endswith(f"model.ckpt-{steps}"), latest
    record = run.json("run_record.json")
    assert record["role"] == role
    if role == "local":  # One process trains as plain TensorFlow does: with no strategy.
        assert record["strategy_injected"] is False, record
        assert (record["strategy"], record["strategy_class"]) == ("none", None)
    else:
        assert record["strategy_injected"] is True, record
        assert (record["strategy"], record["strategy_class"]) == (
            "multi_worker_mirrored",
            "CollectiveAllReduceStrategy",
        )
    assert (record["num_workers"], record["num_replicas"]) == (num_workers, num_workers)
    assert record["max_steps"] == steps
    assert record["script_args"][0] == f"--model_dir={run.model_dir}"


# One case: the one-process path does not depend on the script; canned_wide_and_deep trains
# whole (to its bound, in assert_trained) in test_whole_script_on_two_workers_and_an_evaluator.
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["migration_guide_tf1"])
def test_whole_script_in_one_process(tmp_path, name):
    script, args, steps, bound = WHOLE[name]
    model_dir = str(tmp_path / "model")
    run = run_module(
        "estimator_dist.script",
        [os.path.join(SCRIPTS, script), f"--model_dir={model_dir}", *args],
        TIMEOUT,
        model_dir=model_dir,
    )
    assert_trained(run, steps, "local", 1, bound)


@pytest.mark.multiprocess
def test_a_program_that_removes_tf_config_still_trains_synchronised(tmp_path):
    # TensorFlow's multi-worker notebook clears TF_CONFIG in a cell before its estimator code:
    # each task must still train as one of the cluster, not alone into the shared model_dir.
    script = os.path.join(SCRIPTS, "migration_guide_tf1.py")
    program = tmp_path / "notebook.py"
    program.write_text(
        "import os, runpy\n"
        "os.environ.pop('TF_CONFIG', None)\n"
        f"runpy.run_path({script!r}, run_name='__main__')\n"
    )
    _, args, steps, bound = WHOLE["migration_guide_tf1"]
    model_dir = str(tmp_path / "model")
    run = run_module(
        "estimator_dist.launch",
        [
            "--num_workers=2",
            f"--script={program}",
            "--timeout_secs=110",
            "--",
            f"--model_dir={model_dir}",
            *args,
        ],
        TIMEOUT,
        model_dir=model_dir,
    )
    assert_trained(run, steps, "chief-0", 2, bound)  # Two replicas in sync, not one each.
    worker_log = open(os.path.join(model_dir, "logs", "worker-0.log")).read()
    assert "the program removed TF_CONFIG; this process is still task worker-0" in worker_log
    assert "Running training and evaluation locally" not in worker_log


# One case: what the launcher adds (RING, StopStep, the final evaluation line, the logs) does not
# depend on the script. migration_guide_tf1 trains on two workers and an evaluator, to the same
# bounds (assert_trained), in test_script_on_tasks_whose_tf_config_a_platform_wrote, and under
# the launcher in test_sigterm_stops_a_script_job_at_one_checkpointed_step.
@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["canned_wide_and_deep"])
def test_whole_script_on_two_workers_and_an_evaluator(tmp_path, name):
    script, args, steps, bound = WHOLE[name]
    model_dir = str(tmp_path / "model")
    run = run_module(
        "estimator_dist.launch",
        [
            "--num_workers=2",
            "--evaluator",
            f"--script={os.path.join(SCRIPTS, script)}",
            "--communication=RING",
            # No --eval_start_delay_secs/--eval_throttle_secs: the EvalSpec's 120 s / 600 s
            # stand, and the final checkpoint is evaluated at once.
            "--timeout_secs=110",
            "--",
            f"--model_dir={model_dir}",
            *args,
        ],
        TIMEOUT,
        model_dir=model_dir,
    )
    assert_trained(run, steps, "chief-0", 2, bound)
    record = run.json("run_record.json")
    assert (record["communication_requested"], record["communication_used"]) == ("RING", "RING")
    assert f"[launcher] final evaluation: global_step={steps}, " in run.output
    assert "will run with --script: yes (calls tf.estimator.train_and_evaluate" in run.output
    # The script names no --train_steps: the launcher knows the last step only from the tasks'
    # status events (StopStep), and a success needs it.
    assert not os.path.exists(os.path.join(model_dir, "tmp_worker_0"))
    assert sorted(os.listdir(os.path.join(model_dir, "logs"))) == [
        "chief-0.log",
        "evaluator-0.log",
        "launcher.log",
        "worker-0.log",
    ]


@pytest.mark.multiprocess
def test_script_on_tasks_whose_tf_config_a_platform_wrote(tmp_path):
    """No launcher: three tasks started by hand with Kubeflow's TF_CONFIG dialect."""
    script, args, steps, bound = WHOLE["migration_guide_tf1"]
    model_dir = str(tmp_path / "model")
    chief, worker, evaluator = (f"localhost:{portpicker.pick_unused_port()}" for _ in range(3))
    cluster = {"chief": [chief], "worker": [worker], "evaluator": [evaluator]}
    command = [
        *QUICK_EVALUATION,
        os.path.join(SCRIPTS, script),
        f"--model_dir={model_dir}",
        *args,
    ]

    def tf_config(task_type):
        task = {"type": task_type, "index": 0}
        return json.dumps({"cluster": cluster, "task": task, "environment": "cloud"})

    roles = ("chief", "worker", "evaluator")
    with contextlib.ExitStack() as stack:
        tasks = {
            role: stack.enter_context(
                Background("estimator_dist.script", command, env={"TF_CONFIG": tf_config(role)})
            )
            for role in roles
        }
        codes = {role: task.wait(timeout=TIMEOUT) for role, task in tasks.items()}
    output = "\n".join(f"===== {role} =====\n{task.output}" for role, task in tasks.items())
    assert codes == {role: 0 for role in roles}, output
    assert "took 'evaluator' out of the cluster" in tasks["evaluator"].output
    # The whole script on two workers and an evaluator (the launcher's run is canned only).
    finished = types.SimpleNamespace(
        model_dir=model_dir, json=lambda name: json.load(open(os.path.join(model_dir, name)))
    )
    assert_trained(finished, steps, "chief-0", 2, bound)
    record = finished.json("run_record.json")
    assert record["strategy_injected"] and record["cluster"] == {
        "chief": [chief],
        "worker": [worker],
    }


TRAIN_CALL = """
    import argparse

    import tensorflow as tf


    def input_fn():
        dataset = tf.data.Dataset.from_tensor_slices(([[1.0], [2.0]], [[2.0], [4.0]]))
        return dataset.repeat().batch(2)


    def model_fn(features, labels, mode):
        predictions = tf.compat.v1.layers.dense(features, 1)
        loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir")
    args = parser.parse_args()
    estimator = tf.estimator.Estimator(model_fn, model_dir=args.model_dir{config})
    {call}
"""


TRAIN_AND_EVALUATE = (
    "tf.estimator.train_and_evaluate(estimator, tf.estimator.TrainSpec(input_fn, max_steps=50), "
    "tf.estimator.EvalSpec(input_fn))"
)


def write_script(tmp_path, name, model_fn_start="", call=TRAIN_AND_EVALUATE, config=None):
    """A small legacy script ending in `call`, whose model_fn starts with `model_fn_start`.

    Args:
      config: The RunConfig expression the Estimator gets, if any.

    Returns:
      The script's path and the line number of `call`.
    """
    first = "    predictions = tf.compat.v1.layers.dense(features, 1)\n"
    start = textwrap.indent(textwrap.dedent(model_fn_start), "    ")
    source = textwrap.dedent(TRAIN_CALL).replace(first, start + first).replace("{call}", call)
    source = source.replace("{config}", f", config={config}" if config else "")
    path = tmp_path / name
    path.write_text(source)
    return str(path), source.splitlines().index(call) + 1


def launch_script(tmp_path, script, *launcher_args):
    model_dir = str(tmp_path / "model")
    return run_module(
        "estimator_dist.launch",
        [
            "--num_workers=2",
            "--evaluator",
            f"--script={script}",
            "--grace_secs=3",
            "--timeout_secs=200",
            *launcher_args,
            "--",
            f"--model_dir={model_dir}",
        ],
        TIMEOUT,
        model_dir=model_dir,
        check=False,
    )


@pytest.mark.multiprocess
def test_a_strategy_the_script_builds_itself_is_kept(tmp_path):
    # The evaluator builds it too, where TensorFlow alone raises KeyError: 'evaluator'.
    config = (
        "tf.estimator.RunConfig(train_distribute=tf.distribute.MultiWorkerMirroredStrategy("
        "communication_options=tf.distribute.experimental.CommunicationOptions("
        "implementation=tf.distribute.experimental.CommunicationImplementation.RING)))"
    )
    script, _ = write_script(tmp_path, "own_strategy.py", config=config)
    run = launch_script(tmp_path, script, *QUICK_EVALUATION)
    assert run.returncode == 0, run.describe()
    record = run.json("run_record.json")
    assert record["strategy_injected"] is False
    assert (record["strategy"], record["num_replicas"]) == ("CollectiveAllReduceStrategy", 2)
    assert (record["communication_requested"], record["communication_used"]) == ("RING", "RING")
    assert run.json("eval_metrics.json")["metrics"]["global_step"] == 50


@pytest.mark.multiprocess
def test_estimator_train_until_an_endless_input_ends_fails_at_once_on_a_cluster(tmp_path):
    # train() with neither steps nor max_steps trains until the input ends; this one repeats.
    script, line = write_script(tmp_path, "train_call.py", call="estimator.train(input_fn)")
    startup_timeout = 300
    started = time.monotonic()
    run = launch_script(tmp_path, script, f"--startup_timeout={startup_timeout}")
    elapsed = time.monotonic() - started
    assert run.returncode == exit_codes.USAGE, run.describe()
    expected = script_loop.NO_STEPS.format(where=f"{script}:{line}: ", role="chief-0")
    assert f"] estimator_dist.script: error: {expected}" in run.output, run.describe()
    # Chief and worker both fail so; the launcher names whichever it saw exit first.
    assert re.search(
        r"\[launcher\] attempt 0 failed: (chief|worker-0) exited with code 2 \(USAGE\): ",
        run.output,
    )
    assert "job failed (not retryable)" in run.output
    assert "restarting" not in run.output
    # At once: no task waited for the start-up timeout.
    assert elapsed < startup_timeout / 5, f"{elapsed:.1f} s\n{run.describe()}"


@pytest.mark.multiprocess
def test_a_model_fn_that_raises_exits_5_and_is_not_restarted(tmp_path):
    start = """
        if not isinstance(features, dict):
            raise KeyError("the model_fn needs a 'pixels' feature")
    """
    script, _ = write_script(tmp_path, "raises.py", model_fn_start=start)
    run = launch_script(tmp_path, script, "--max_restarts=3")
    assert run.returncode == exit_codes.USER_CODE, run.describe()
    assert "exited with code 5 (USER_CODE): the script" in run.output, run.describe()
    assert "raised KeyError: \"the model_fn needs a 'pixels' feature\" in model_fn() at" in (
        run.output
    )
    assert "job failed (not retryable); 1 failed attempt(s)" in run.output
    assert "restarting" not in run.output
    assert not os.path.exists(os.path.join(run.model_dir, "eval_metrics.json"))


@pytest.mark.multiprocess
def test_the_same_failure_at_the_same_checkpoint_step_is_not_retried(tmp_path):
    # The worker dies the same way in every attempt, before any checkpoint, as an
    # out-of-memory kill while building the graph would.
    start = """
        import json, os, signal
        if json.loads(os.environ["TF_CONFIG"])["task"]["type"] == "worker":
            os.kill(os.getpid(), signal.SIGKILL)
    """
    script, _ = write_script(tmp_path, "killed.py", model_fn_start=start)
    run = launch_script(tmp_path, script, "--max_restarts=3")
    assert run.returncode == 128 + 9, run.describe()
    assert run.output.count("restarting the whole cluster") == 1, run.describe()
    assert (
        "job failed (the same failure (worker-0 was killed by SIGKILL) at checkpoint step 0 "
        "twice: not retrying); 2 failed attempt(s)"
    ) in run.output


@pytest.mark.multiprocess
def test_sigterm_stops_a_script_job_at_one_checkpointed_step(tmp_path):
    script, _, _, _ = WHOLE["migration_guide_tf1"]
    model_dir = str(tmp_path / "model")
    args = [
        "--num_workers=2",
        "--noevaluator",
        f"--script={os.path.join(SCRIPTS, script)}",
        "--max_restarts=0",
        "--grace_secs=30",
        "--",
        f"--model_dir={model_dir}",
        "--max_steps=1000000",
    ]
    with Background("estimator_dist.launch", args) as launcher:
        worker = int(launcher.wait_for_line(r"started worker-0 \(pid (\d+)\)", 60).group(1))
        launcher.wait_for_line(r"^\[chief\] .*loss = .*step = [1-9]", 120)
        os.kill(worker, signal.SIGTERM)
        code = launcher.wait(timeout=120)
    output = launcher.output
    assert code == exit_codes.PREEMPTED, output
    assert re.search(r"attempt 0 failed: \S+ exited with code 155 \(PREEMPTED\)", output), output
    stopped = re.search(r"every task stops at global step (\d+)", output)
    assert stopped, output
    latest = tf.train.latest_checkpoint(model_dir)
    assert latest.endswith(f"model.ckpt-{stopped.group(1)}"), (latest, output)


@pytest.mark.multiprocess
def test_script_model_dir_must_be_the_launchers(tmp_path):
    script, args, _, _ = WHOLE["migration_guide_tf1"]
    run = run_module(
        "estimator_dist.script",
        [
            f"--model_dir={tmp_path / 'expected'}",
            os.path.join(SCRIPTS, script),
            f"--model_dir={tmp_path / 'other'}",
            *args,
        ],
        TIMEOUT,
        check=False,
    )
    assert run.returncode == exit_codes.USAGE, run.describe()
    assert f"the script's estimator writes to {tmp_path / 'other'}, but " in run.output
    assert f"--model_dir={tmp_path / 'expected'} was given" in run.output
    assert not (tmp_path / "other" / "checkpoint").exists()


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "name, script_args, fragment",
    [
        ("missing.py", ["--model_dir=/tmp/m"], "does not exist"),
        ("notes.txt", ["--model_dir=/tmp/m"], "is not a Python script"),
        ("good.py", ["--steps=3"], "needs the directory its estimator writes to"),
    ],
)
def test_bad_script_job_fails_before_any_task_starts(tmp_path, name, script_args, fragment):
    (tmp_path / "notes.txt").write_text("train for 3 epochs, then evaluate\n")
    write_script(tmp_path, "good.py")
    script = str(tmp_path / name)
    run = run_module(
        "estimator_dist.launch", [f"--script={script}", "--", *script_args], TIMEOUT, check=False
    )
    assert run.returncode == exit_codes.USAGE, run.describe()
    assert f"--script={script} {fragment}" in run.output
    assert "Traceback" not in run.output
    assert "started" not in run.output


@pytest.mark.multiprocess
def test_script_flags_are_refused_without_script(tmp_path):
    run = run_module(
        "estimator_dist.launch",
        ["--communication=RING", "--", f"--model_dir={tmp_path}"],
        TIMEOUT,
        check=False,
    )
    assert run.returncode == exit_codes.USAGE, run.describe()
    assert "--communication is a flag of --script jobs" in run.output


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", sorted(WHOLE))
def test_check_says_a_whole_script_will_run(name):
    script = os.path.join(SCRIPTS, WHOLE[name][0])
    run = run_module("estimator_dist.check", [f"--script={script}"], TIMEOUT)
    line = run.output.splitlines()[0]
    assert line.startswith(f"{script}: will run with --script: yes (calls ")
    assert "tf.estimator.train_and_evaluate at line " in line


@pytest.mark.multiprocess
def test_check_says_a_script_calling_train_runs_it_in_segments(tmp_path):
    script, line = write_script(
        tmp_path, "train_call.py", call="estimator.train(input_fn, max_steps=50)"
    )
    run = run_module("estimator_dist.check", [f"--script={script}"], TIMEOUT)
    assert run.output.splitlines()[0] == (
        f"{script}: will run with --script: yes (trains with estimator.train() at line {line}: "
        "each call runs as one synchronised segment on every worker)"
    )
    assert "pre-flight warning [estimator-train]" in run.output


# --- in this process: the wrappers and the RunConfig replacement ------------------


def chief_of_two(monkeypatch):
    raw = json.dumps(
        {"cluster": {"chief": ["h0:2222"], "worker": ["h1:2222"]}, "task": {"type": "chief"}}
    )
    cluster = parse_tf_config(raw)
    monkeypatch.setenv("TF_CONFIG", cluster.to_json())
    return cluster


def test_a_strategy_given_later_configures_as_if_given_to_the_constructor(monkeypatch, tmp_path):
    from tensorflow.python.distribute import distribute_coordinator as dc

    chief_of_two(monkeypatch)
    plain = tf.estimator.RunConfig(model_dir=str(tmp_path), save_checkpoints_steps=7)
    # Without a strategy RunConfig sets up between-graph replication: a session
    # config with device filters, and no distribute coordinator.
    assert plain.session_config.device_filters
    assert getattr(plain, "_distribute_coordinator_mode", None) is None
    strategy = tf.distribute.MirroredStrategy()
    replaced = with_distribution(plain, strategy, None)
    built = tf.estimator.RunConfig(
        model_dir=str(tmp_path), save_checkpoints_steps=7, train_distribute=strategy
    )
    for config in (replaced, built):
        assert config._distribute_coordinator_mode == dc.CoordinatorMode.INDEPENDENT_WORKER
        assert config.session_config is None
        assert config.train_distribute is strategy
        assert config.cluster_spec.as_dict() == {"chief": ["h0:2222"], "worker": ["h1:2222"]}
        assert (config.model_dir, config.save_checkpoints_steps) == (str(tmp_path), 7)
    assert plain.train_distribute is None  # The script's own config is left as it was.

    estimator = tf.estimator.Estimator(lambda features: None, config=plain)
    set_run_config(estimator, replaced)
    assert estimator._train_distribution is strategy
    assert estimator.config.train_distribute is not None
    assert estimator._session_config is None
    assert estimator.model_dir == str(tmp_path)


def test_wrappers_are_installed_only_while_the_script_runs(monkeypatch):
    from tensorflow_estimator.python.estimator import training

    original = training.train_and_evaluate
    cluster = chief_of_two(monkeypatch)
    task = ScriptTask(ScriptConfig(__file__), cluster, Startup("chief-0"))
    methods = ("train", "evaluate", "export_saved_model", "predict", "__init__")
    estimator_methods = {name: getattr(tf.estimator.Estimator, name) for name in methods}
    with task.installed():
        for holder in (tf.estimator, tf.compat.v1.estimator, training):
            assert holder.train_and_evaluate is not original
            assert holder.train_and_evaluate.__wrapped__ is original
        for name, method in estimator_methods.items():
            # On a cluster, each goes to the loop's version (script_loop_test runs them).
            assert getattr(tf.estimator.Estimator, name) is not method
            assert getattr(tf.estimator.Estimator, name).__wrapped__ is method
    for holder in (tf.estimator, tf.compat.v1.estimator, training):
        assert holder.train_and_evaluate is original
    for name, method in estimator_methods.items():
        assert getattr(tf.estimator.Estimator, name) is method
    assert task.failure is None and not task.took_part


def test_estimator_calls_stay_allowed_in_one_process():
    task = ScriptTask(ScriptConfig(__file__), ClusterConfig(), Startup("local"))
    estimator = tf.estimator.Estimator(lambda features: None)
    with task.installed():
        # Estimator's own error, not the wrapper's: one process may train this way.
        with pytest.raises(ValueError, match="model_fn should return an EstimatorSpec"):
            estimator.train(lambda: ({"x": tf.constant([[1.0]])}, None), max_steps=1)
    assert task.failure is None


# --- a package run as a module: `--module=trainer.task` ----------------------------

TRAINER = os.path.join(REPO, "tests", "legacy", "programs", "trainer_pkg")
TRAINER_TASK = os.path.join(TRAINER, "trainer", "task.py")


def assert_ran_as_python_m(model_dir, task, program_args):
    """The module recorded what `python -m trainer.task ARGS` gives it."""
    with open(os.path.join(model_dir, f"program-{task}.json")) as stream:
        seen = json.load(stream)
    assert seen == {
        "name": "__main__",
        "package": "trainer",
        "argv": [TRAINER_TASK, *program_args],
    }, seen


@pytest.mark.multiprocess
def test_a_module_of_a_package_in_one_process(tmp_path):
    model_dir = str(tmp_path / "job")
    program_args = [f"--job-dir={model_dir}", "--train-steps=40"]
    run = run_module(
        "estimator_dist.script",
        ["--module=trainer.task", f"--package_path={TRAINER}", "--", *program_args],
        TIMEOUT,
        model_dir=model_dir,
    )
    assert_ran_as_python_m(model_dir, "local", program_args)
    final = run.json("eval_metrics.json")
    assert final["final"] and final["metrics"]["global_step"] == 40, final
    assert final["metrics"]["average_loss"] < 0.5, final
    assert run.json("run_record.json")["script"] == TRAINER_TASK


@pytest.mark.multiprocess
def test_a_module_of_a_package_on_two_workers_and_an_evaluator(tmp_path):
    model_dir = str(tmp_path / "job")
    program_args = [f"--job-dir={model_dir}", "--train-steps=40"]
    run = run_module(
        "estimator_dist.launch",
        [
            "--num_workers=2",
            "--evaluator",
            "--module=trainer.task",
            f"--package_path={os.path.relpath(TRAINER, REPO)}",  # Made absolute for the tasks.
            "--communication=RING",
            *QUICK_EVALUATION,
            "--timeout_secs=200",
            "--",
            *program_args,
        ],
        TIMEOUT,
        model_dir=model_dir,
    )
    assert "trainer.task (read, not run; every task checks it again when it runs): will run " in (
        run.output
    )
    assert "with --module: yes (calls tf.estimator.train_and_evaluate at trainer/model.py:" in (
        run.output
    )
    final = run.json("eval_metrics.json")
    assert final["final"] and final["metrics"]["global_step"] == 40, final
    assert "[launcher] final evaluation: global_step=40, " in run.output
    for task in ("chief", "worker", "evaluator"):
        assert_ran_as_python_m(model_dir, task, program_args)
    record = run.json("run_record.json")
    assert (record["num_workers"], record["strategy_injected"]) == (2, True)


@pytest.mark.multiprocess
def test_check_reads_every_file_of_a_modules_package():
    run = run_module(
        "estimator_dist.check",
        ["--module=trainer.task", f"--package_path={TRAINER}"],
        TIMEOUT,
    )
    lines = run.output.splitlines()
    assert lines[0].startswith(f"trainer.task (in {TRAINER}): will run with --module: yes (")
    assert "  trainer/model.py: calls tf.estimator.train_and_evaluate at line 39" in lines


@pytest.mark.multiprocess
@pytest.mark.timeout(TIMEOUT)
def test_a_script_task_sends_progress_events_without_a_second_progress_line(tmp_path):
    import subprocess
    import sys

    from estimator_dist.report import status

    script, _ = write_script(
        tmp_path, "progress.py", config="tf.estimator.RunConfig(log_step_count_steps=10)"
    )
    model_dir = str(tmp_path / "model")
    read_fd, write_fd = os.pipe()
    try:
        task = subprocess.Popen(
            [sys.executable, "-m", "estimator_dist.script", script, f"--model_dir={model_dir}"],
            cwd=REPO,
            env={
                **{k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
                "TF_CPP_MIN_LOG_LEVEL": "1",
                status.STATUS_FD_ENV: str(write_fd),
            },
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            pass_fds=(write_fd,),
        )
    finally:
        os.close(write_fd)
    try:
        output, _ = task.communicate(timeout=TIMEOUT)
    finally:
        if task.poll() is None:
            task.kill()
    with open(read_fd) as channel:
        events = list(status.EventReader().read(channel))
    assert task.returncode == 0, output
    progress = [e for e in events if isinstance(e, status.Progress)]
    assert [e.step for e in progress] == [10, 20, 30, 40, 50], events
    assert all(e.last_step == 50 and e.interval_steps == 10 for e in progress), progress
    assert all(e.loss is not None for e in progress), progress
    # Under a launcher the task's whole log is its output: Estimator's own lines are the
    # script's progress, with no line of the package's besides.
    assert "loss = " in output and "%] loss = " not in output, output
