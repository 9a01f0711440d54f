"""The `estimator_dist.train` entry point: its usage errors, and runs as a real subprocess.

The usage errors are checked in this process (`usage_table_test.usage_error_in_process`:
main's stages up to the pre-flight, through `usage_exit`), each with its own message.
End to end, as a subprocess, run: training in one process, a missing --model_dir, an
unknown model_fn (a usage error the driver finds, turned into exit 2 by main), a
strategy that does not fit the cluster (found after the pre-flight, on a task of a
cluster) and a repeating evaluation of tensors; `usage_table_test` runs a malformed
TF_CONFIG, a bad flag value and a positional argument end to end.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from tests.estimator_dist.usage_table_test import usage_error_in_process
from tests.procs import run_module

multiprocess = pytest.mark.multiprocess

TIMEOUT = 180


def train(tmp_path, args, env=None, check=False):
    model_dir = str(tmp_path / "model")
    return run_module(
        "estimator_dist.train", [f"--model_dir={model_dir}", *args], TIMEOUT, env, model_dir, check
    )


def assert_refused_in_process(capsys, tmp_path, args, fragments, tf_config=None):
    code, output, model_dir = usage_error_in_process(
        capsys, tmp_path, args, tf_config, preflight=True
    )
    assert code == 2, (code, output)
    assert "estimator_dist.train: error: " in output
    for fragment in fragments:
        assert fragment in output, output
    assert "Traceback" not in output
    assert not os.path.exists(model_dir), "a usage error must write nothing to model_dir"


def assert_usage_error(run, *fragments):
    assert run.returncode == 2, run.describe()
    assert "estimator_dist.train: error: " in run.output
    for fragment in fragments:
        assert fragment in run.output, run.output
    assert "Traceback" not in run.output
    assert not os.path.exists(run.model_dir), "a usage error must write nothing to model_dir"


@multiprocess
def test_single_process_without_tf_config(tmp_path, data_dir):
    run = train(
        tmp_path,
        [f"--data_dir={data_dir}", "--train_steps=100", "--save_checkpoints_steps=50"],
        check=True,
    )
    assert "Final evaluation: global_step=100, accuracy=" in run.output
    final = run.json("eval_metrics.json")
    assert final["final"] and final["metrics"]["global_step"] == 100
    assert final["metrics"]["accuracy"] > 0.6
    record = run.json("run_record.json")
    assert (record["role"], record["num_workers"], record["num_replicas"]) == ("local", 1, 1)
    assert tf.train.latest_checkpoint(run.model_dir).endswith("model.ckpt-100")


def test_bogus_communication_exits_2(capsys, tmp_path):
    fragments = ["--communication=BOGUS", "AUTO", "RING", "NCCL", "Fix the flag"]
    assert_refused_in_process(capsys, tmp_path, ["--communication=BOGUS"], fragments)


@pytest.mark.parametrize(
    "tf_config, fragment",
    [
        ("{not json", "not valid JSON"),
        (
            json.dumps({"cluster": {"chief": ["h:1"]}, "task": {"type": "worker", "index": 0}}),
            "has no such job",
        ),
        (
            json.dumps(
                {
                    "cluster": {"chief": ["h:1"], "worker": ["h:2"]},
                    "task": {"type": "worker", "index": 4},
                }
            ),
            "out of range",
        ),
    ],
)
def test_malformed_tf_config_exits_2(capsys, tmp_path, tf_config, fragment):
    fragments = ["Invalid TF_CONFIG", fragment, "TF_CONFIG environment variable"]
    assert_refused_in_process(capsys, tmp_path, [], fragments, tf_config=tf_config)


#: Refused by the driver, found by this case end to end (the others: in this process).
UNKNOWN_MODEL_FN = (
    ["--model_fn=nope"],
    ["Unknown model_fn 'nope'", "mnist_cnn", "package.module:function"],
)
#: Refused where the task builds its strategies for the cluster, after the pre-flight.
MIRRORED_ON_A_CLUSTER = (
    ["--distribution_strategy=mirrored"],
    ["trains in one process", "2 workers"],
)


@pytest.mark.parametrize(
    "args, fragments",
    [
        UNKNOWN_MODEL_FN,
        (["--input_fn=no.such.module:fn"], ["Cannot import module 'no.such.module'"]),
        (["--params=optimizer=rmsprop"], ["optimizer 'rmsprop' is unknown"]),
        (["--params=lerning_rate=0.1"], ["Unknown parameter(s) lerning_rate"]),
        (["--params=depth"], ["--params item 'depth' is not key=value"]),
        (["--params=learning_rate=0.5"], ["use --learning_rate"]),
        (
            ["--model_fn=mnist_cnn", "--keras_model=mnist_cnn"],
            ["At most one of (model_fn, keras_model, estimator)"],
        ),
        (["--train_steps=0"], ["--train_steps"]),
        (["--input_fn=mnist"], ["tfds build mnist"]),
        # A positional argument, main's own check: usage_table_test's subprocess case.
        (["--params=gradient_accumulation_steps=2"], ["use --gradient_accumulation_steps"]),
        (
            ["--gradient_accumulation_steps=2", "--keras_model=mnist_cnn"],
            ["--keras_model and --estimator build their optimizers inside TensorFlow"],
        ),
        (
            [
                "--gradient_accumulation_steps=4",
                "--model_fn=examples.legacy_estimator.model:model_fn",
                "--input_fn=examples.legacy_estimator.model:input_fn",
            ],
            ["--gradient_accumulation_steps=4", "applies its gradients directly", "with_gradient_"],
        ),
        (
            ["--micro_batches=2", "--keras_model=mnist_cnn"],
            ["--micro_batches=2 needs a model_fn", "Use --model_fn, or --micro_batches=1"],
        ),
        (
            [
                "--micro_batches=2",
                "--model_fn=examples.legacy_estimator.model:model_fn",
                "--input_fn=examples.legacy_estimator.model:input_fn",
            ],
            ["--micro_batches=2", "computes each batch whole", "minimize_in_micro_batches"],
        ),
        (
            ["--micro_batches=3", "--batch_size=64"],
            ["--micro_batches=3 must divide", "--batch_size=64", "such as 63 or 66"],
        ),
    ],
)
@pytest.mark.slow  # the pre-flight builds each case's model in this process: about a second
def test_fail_with_bad_flags(capsys, tmp_path, data_dir, args, fragments):
    assert_refused_in_process(capsys, tmp_path, [f"--data_dir={data_dir}", *args], fragments)


@multiprocess
@pytest.mark.parametrize("args, fragments", [UNKNOWN_MODEL_FN, MIRRORED_ON_A_CLUSTER])
def test_fail_with_bad_flags_end_to_end(tmp_path, data_dir, args, fragments):
    env = None
    if args == MIRRORED_ON_A_CLUSTER[0]:
        env = {
            "TF_CONFIG": json.dumps(
                {
                    "cluster": {"chief": ["localhost:1"], "worker": ["localhost:2"]},
                    "task": {"type": "chief", "index": 0},
                }
            )
        }
    run = train(tmp_path, [f"--data_dir={data_dir}", *args], env=env)
    assert_usage_error(run, *fragments)


@multiprocess
def test_missing_model_dir_exits_2():
    run = run_module("estimator_dist.train", [], TIMEOUT, check=False)
    assert run.returncode == 2
    assert "--model_dir" in run.output and "Traceback" not in run.output


def repeating_tensor_eval_input_fn():
    """A TF1 evaluation input: tensors of an iterator over data that repeats (no EvalSpec steps)."""
    ones = np.ones([8, 1], np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((ones, ones)).repeat().batch(4)
    return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()


@multiprocess
@pytest.mark.timeout(TIMEOUT + 30)
def test_an_evaluation_of_tensors_that_repeat_ends_in_a_single_process(tmp_path):
    """The TF1 shape that relied on EvalSpec(steps=100): it hung one process before."""
    run = train(
        tmp_path,
        [
            "--model_fn=tests.task_models:linear_model_fn",
            "--input_fn=tests.task_models:ones_input_fn",
            f"--eval_input_fn={__name__}:repeating_tensor_eval_input_fn",
            "--train_steps=20",
            "--save_checkpoints_steps=10",
        ],
        check=True,
    )
    assert "whose number is unknown and --eval_steps is not set" in run.output, run.describe()
    assert "reads at most 100 batches" in run.output
    final = run.json("eval_metrics.json")
    assert final["final"] is True and final["metrics"]["global_step"] == 20, final
    assert "Traceback" not in run.output
