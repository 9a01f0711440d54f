"""Each multi-worker pitfall is found before training and explained with its fix."""

import textwrap

import pytest
import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.config.job import JobConfig
from estimator_dist.programs import scan as program_scan
from estimator_dist.task import pitfalls, preflight
from run_config.run_config import RunConfigOptions
from tests.procs import REPO, run_module

LEGACY = f"{REPO}/examples/legacy_estimator"

SCRIPT = textwrap.dedent(
    """
    import tensorflow as tf

    def train_input_fn():
        return dataset

    def eval_input_fn():
        return dataset

    def sharded_input_fn(mode, input_context=None):
        return dataset

    config = tf.estimator.RunConfig(model_dir="/tmp/m", save_checkpoints_secs=600)
    estimator = tf.estimator.Estimator(model_fn, config=config)
    estimator.train(input_fn=train_input_fn, max_steps=1000)
    model.train()
    """
)


def test_scan_finds_each_pitfall_of_a_legacy_script_with_its_line():
    found = program_scan.scan_source(SCRIPT, "train.py")
    assert [(p.code, p.fatal) for p in found] == [
        ("no-input-context", False),
        ("checkpoint-secs", False),
        ("estimator-train", False),
    ]
    assert found[0].message.startswith("input_fn train.py:4: train_input_fn takes no")
    assert found[1].message == program_scan.CHECKPOINT_SECS_PROGRAM.format(where="train.py:13: ")
    assert "checkpoints every 1000 steps instead" in found[1].message
    assert found[2].message.startswith("train.py:15: calls estimator.train(...): on a cluster")
    assert "each call runs as one synchronised segment on every worker" in found[2].message


LEGACY_CALLS = textwrap.dedent(
    """
    import tensorflow as tf

    estimator = tf.estimator.Estimator(model_fn, model_dir="/tmp/m")
    train_spec = tf.estimator.TrainSpec(input_fn=train_fn)
    eval_spec = tf.estimator.EvalSpec(eval_fn, steps=10)
    metrics = estimator.evaluate(input_fn=eval_fn)
    also = estimator.evaluate(eval_input_fn)
    keras_model.evaluate(images, labels)
    tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    """
)


def test_scan_finds_evaluate_calls_and_a_train_spec_without_max_steps():
    found = program_scan.scan_source(LEGACY_CALLS, "run.py")
    assert [(p.code, p.fatal) for p in found] == [
        ("no-max-steps", False),
        ("estimator-evaluate", False),
        ("estimator-evaluate", False),
    ]
    assert found[0].message.startswith("run.py:5: TrainSpec(...) sets no max_steps")
    assert found[1].message.startswith("run.py:7: calls estimator.evaluate(...): on a cluster")
    assert found[2].message.startswith("run.py:8: calls estimator.evaluate(...)")


@pytest.mark.parametrize(
    "source, verdict",
    [
        (
            "import tensorflow as tf\ntf.estimator.train_and_evaluate(est, train_spec, eval_spec)",
            "will run with --script: yes (calls tf.estimator.train_and_evaluate at line 2)",
        ),
        (
            "from tensorflow.compat.v1.estimator import train_and_evaluate\n"
            "spec = TrainSpec(input_fn, max_steps=10)\n"
            "train_and_evaluate(est, spec, eval_spec)",
            "will run with --script: yes (calls tf.estimator.train_and_evaluate at line 3)",
        ),
        (
            SCRIPT,
            "will run with --script: yes (trains with estimator.train() at line 15: each call "
            "runs as one synchronised segment on every worker)",
        ),
        (
            LEGACY_CALLS,
            "will run with --script: yes (calls tf.estimator.train_and_evaluate at line 10)",
        ),
        (
            "estimator = make_estimator()\nrun(estimator)",
            "will run with --script: no: it never calls tf.estimator.train_and_evaluate("
            "estimator, train_spec, eval_spec) nor an Estimator's train(), the calls --script "
            "distributes; train and evaluate through them",
        ),
    ],
)
def test_script_verdict(source, verdict):
    assert str(program_scan.script_verdict(source, "train.py")) == verdict


def test_only_the_functions_handed_to_training_are_training_inputs():
    source = textwrap.dedent(
        """
        def make_input(path, mode):
            return dataset

        def serving_input_fn():
            return receiver

        def my_input_fn():
            return dataset

        spec = tf.estimator.TrainSpec(lambda: make_input("a.csv", "train"), max_steps=10)
        exporter = tf.estimator.LatestExporter("m", serving_input_fn)
        """
    )
    found = [p for p in program_scan.scan_source(source, "t.py") if p.code == "no-input-context"]
    assert [p.message.split(" takes")[0] for p in found] == ["input_fn t.py:2: make_input"]


def test_without_a_training_call_the_names_decide_and_serving_is_no_input():
    source = "def serving_input_fn():\n    pass\n\ndef train_input_fn():\n    pass\n"
    found = [p for p in program_scan.scan_source(source, "t.py") if p.code == "no-input-context"]
    assert [p.message.split(" takes")[0] for p in found] == ["input_fn t.py:4: train_input_fn"]


def test_report_lists_fatal_pitfalls_first_and_says_when_there_are_none():
    report = pitfalls.format_report(program_scan.scan_source(SCRIPT, "train.py")).splitlines()
    assert [line.split("]")[0] for line in report] == [
        "pre-flight warning [no-input-context",
        "pre-flight warning [checkpoint-secs",
        "pre-flight warning [estimator-train",
    ]
    assert pitfalls.format_report([]) == "pre-flight: no multi-worker pitfalls found."


def _functional(optimizer=None):
    inputs = tf.keras.Input((8, 8, 1), name="image")
    model = tf.keras.Model(inputs, tf.keras.layers.Dense(10)(tf.keras.layers.Flatten()(inputs)))
    if optimizer is not None:
        model.compile(optimizer=optimizer, loss="sparse_categorical_crossentropy")
    return model


class _Subclassed(tf.keras.Model):
    def __init__(self):
        super().__init__()
        self.dense = tf.keras.layers.Dense(10)

    def call(self, inputs):
        return self.dense(inputs)


def test_a_compiled_functional_model_with_a_legacy_optimizer_passes():
    assert pitfalls.check_keras_model(_functional(tf.keras.optimizers.legacy.SGD(0.1)), "m") == []


def test_fail_with_a_keras_model_that_is_not_compiled():
    (found,) = pitfalls.check_keras_model(_functional(), "my.models:build")
    assert found.code == "keras-not-compiled" and found.fatal
    assert "--keras_model=my.models:build returned a model that is not compiled" in found.message


def test_fail_with_a_subclassed_keras_model():
    model = _Subclassed()
    model.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.1), loss="mse")
    (found,) = pitfalls.check_keras_model(model, "m")
    assert found.code == "keras-subclassed"
    assert "subclassed model (_Subclassed)" in found.message
    assert "tf.keras.Input(...)" in found.message


def test_fail_with_a_non_legacy_optimizer_in_the_bridge():
    (found,) = pitfalls.check_keras_model(_functional(tf.keras.optimizers.Adam()), "m")
    assert found.code == "keras-optimizer"
    assert "compile with tf.keras.optimizers.legacy.Adam(...)" in found.message


def test_preflight_refuses_a_fatal_pitfall_before_anything_is_written(tmp_path, data_dir):
    job = JobConfig(
        run=RunConfigOptions(model_dir=str(tmp_path / "model")),
        keras_model="tests.task_models:keras_new_optimizer",
        data_dir=data_dir,
    )
    with pytest.raises(UsageError, match=r"pre-flight error \[keras-optimizer\]"):
        preflight.preflight(job, num_workers=2)
    assert not (tmp_path / "model").exists()


@pytest.mark.multiprocess
def test_check_command_reports_the_legacy_script_and_passes_its_migrated_version():
    before = run_module("estimator_dist.check", [f"--script={LEGACY}/before.py"], 120, check=False)
    assert before.returncode == 0, before.describe()  # Warnings only: it runs as it is.
    assert (
        f"{LEGACY}/before.py: will run with --script: yes (trains with estimator.train() at line 55"
    ) in before.output
    assert "[checkpoint-secs]" in before.output and "[estimator-train]" in before.output
    assert "train_input_fn takes no `input_context`" in before.output
    after = run_module(
        "estimator_dist.check",
        [
            f"--script={LEGACY}/model.py",
            "--",
            "--model_fn=examples.legacy_estimator.model:model_fn",
            "--input_fn=examples.legacy_estimator.model:input_fn",
        ],
        120,
    )
    assert "pre-flight: no multi-worker pitfalls found." in after.output


SERVERS = textwrap.dedent(
    """
    import http.server
    import tensorflow as tf
    from tensorflow.python.training import server_lib

    tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    worker = tf.distribute.Server(cluster_spec, job_name="worker", task_index=0, config=config)
    ps = tf.compat.v1.train.Server(cluster_spec, job_name="ps", task_index=0)
    other = server_lib.Server(cluster_spec)
    web = http.server.HTTPServer(("", 0), handler)
    mine = rpc.Server(handler)
    """
)


def test_scan_warns_of_each_tensorflow_server_the_program_starts_itself():
    # An in-process ParameterServerStrategy cluster after the Estimator part (TensorFlow's
    # multi-worker migration guide) shares the Estimator's server's request pool.
    found = [
        p for p in program_scan.scan_source(SERVERS, "guide.py") if p.code == "in-process-server"
    ]
    assert [p.message.split(":")[1] for p in found] == ["7", "8", "9"]
    assert all(not p.fatal for p in found)
    assert found[0].message == program_scan.IN_PROCESS_SERVER.format(where="guide.py:7: ")
    assert "TF_NUM_INTEROP_THREADS" in found[0].message
