"""A table of malformed TF_CONFIG and flag inputs: each exits 2, explains, writes nothing.

Every case runs the real `estimator_dist.train` entry point in a subprocess.
TF_CONFIG and absl flag errors are caught before TensorFlow is imported, so
most cases take well under a second.
"""

import json
import os

import pytest

from tests.estimator_dist.base.cluster_test import MALFORMED
from tests.procs import run_module

TWO = {"chief": ["localhost:2222"], "worker": ["localhost:2223"]}

TF_CONFIG_CASES = [raw for raw, _ in MALFORMED] + [
    json.dumps({"cluster": TWO, "task": {"type": "worker", "index": 1.5}}),
    json.dumps({"cluster": TWO, "task": {"type": None, "index": 0}}),
    json.dumps({"cluster": TWO, "task": {"type": "chief", "index": 1}}),
    json.dumps(
        {
            "cluster": {"chief": ["localhost:2222"], "worker": ["localhost"]},
            "task": {"type": "chief"},
        }
    ),
    json.dumps({"cluster": {"chief": [None]}, "task": {"type": "chief"}}),
    json.dumps({"cluster": {"chief": ["a b:1"]}, "task": {"type": "chief"}}),
    json.dumps({"cluster": {"evaluator": ["e:1"]}, "task": {"type": "evaluator"}}),
    json.dumps({"cluster": TWO, "task": {"type": "chief"}, "rpc_layer": 7}),
    "null",
    "42",
    '{"cluster": {"chief": ["localhost:2222"]}, "task": {"type": "chief", "index": 0}',
]

FLAG_CASES = [
    ["--communication=BOGUS"],
    ["--communication=ring2"],
    ["--distribution_strategy=bogus"],
    ["--eval_distribution_strategy=multi_worker_mirrored"],
    ["--batch_size=0"],
    ["--batch_size=many"],
    ["--train_steps=-1"],
    ["--eval_steps=0"],
    ["--learning_rate=-0.1"],
    ["--collective_timeout=-5"],
    ["--startup_timeout=0"],
    ["--stall_timeout=0"],
    ["--save_checkpoints_steps=0"],
    ["--keep_checkpoint_max=0"],
    ["--intra_op_threads=-1"],
    ["--bytes_per_pack=-1"],
    ["--gradient_wire_dtype=int8"],
    ["--gradient_accumulation_steps=0"],
    ["--micro_batches=0"],
    ["--micro_batches=3", "--batch_size=64"],
    ["--seed=abc"],
    ["--unknown_flag=1"],
    ["--model_fn=mnist_cnn", "--keras_model=mnist_cnn"],
    ["positional"],
    ["--params=depth"],
    ["--params=/no/such/params.yaml"],
]


def assert_usage_error(run):
    assert run.returncode == 2, run.describe()
    assert "estimator_dist.train: error: " in run.output, run.output
    assert "Traceback" not in run.output, run.output
    assert not os.path.exists(run.model_dir), "a usage error must write nothing to model_dir"


def test_the_table_has_at_least_50_inputs():
    assert len(TF_CONFIG_CASES) + len(FLAG_CASES) >= 50


@pytest.mark.multiprocess
@pytest.mark.parametrize("tf_config", TF_CONFIG_CASES)
def test_malformed_tf_config(tmp_path, tf_config):
    model_dir = str(tmp_path / "model")
    run = run_module(
        "estimator_dist.train",
        [f"--model_dir={model_dir}"],
        timeout=60,
        env={"TF_CONFIG": tf_config},
        model_dir=model_dir,
        check=False,
    )
    assert_usage_error(run)
    assert "Invalid TF_CONFIG" in run.output


@pytest.mark.multiprocess
@pytest.mark.parametrize("args", FLAG_CASES, ids=" ".join)
def test_bad_flag(tmp_path, args):
    model_dir = str(tmp_path / "model")
    run = run_module(
        "estimator_dist.train",
        [f"--model_dir={model_dir}", *args],
        timeout=60,
        model_dir=model_dir,
        check=False,
    )
    assert_usage_error(run)
    flag = args[0].split("=")[0]
    assert flag.lstrip("-") in run.output or args[0] in run.output, run.output
