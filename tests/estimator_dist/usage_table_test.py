"""A table of malformed TF_CONFIG and flag inputs: each exits 2, explains, writes nothing.

The table's rows are checked in this process (`usage_error_in_process`): the
stages of `estimator_dist.train`'s main that refuse them (the real flags
parser, TF_CONFIG, the job) with fresh absl flag values, each refusal through
`usage_exit`, so each row still proves its own exit code 2 and message.
Starting a process per row proved nothing more and cost a process each.

End to end, in a subprocess of the real entry point (`SUBPROCESS_CASES`): one
malformed TF_CONFIG, one bad flag value and a positional argument (main's own
check), each exiting 2 with the message on its output and nothing written.
"""

import json
import os

import pytest
from absl import flags

from estimator_dist.base.errors import UsageError
from estimator_dist.cluster.platform_env import cluster_from_environment
from estimator_dist.config.train_flags import PROGRAM, define_flags, job_from_flags
from estimator_dist.report.cli import make_flags_parser, usage_exit
from tests.estimator_dist.cluster.tf_config_test import MALFORMED
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


#: Rows also run end to end as `python -m estimator_dist.train` (TF_CONFIG, flags).
SUBPROCESS_CASES = [
    ({"TF_CONFIG": TF_CONFIG_CASES[0]}, [], "Invalid TF_CONFIG"),
    ({}, ["--communication=BOGUS"], "communication"),
    ({}, ["positional"], "unexpected positional arguments ['positional']; every setting is"),
]


def usage_error_in_process(capsys, tmp_path, args, tf_config=None, preflight=False):
    """Runs `estimator_dist.train`'s checks of its flags and TF_CONFIG in this process.

    The stages of `train.main` that refuse bad usage, in its order, with the
    real parser (`cli.make_flags_parser`, which `run_program` uses) on fresh
    flag values: the flags, TF_CONFIG (`cluster_from_environment`), the job
    (`job_from_flags`) and, with `preflight`, the driver's first check of
    names, data and model (`task.preflight.preflight`, which leaves eager
    mode and the process as they were); a `UsageError` goes through
    `usage_exit`, as main does. Returns `(exit code, stderr, model_dir)`.
    """
    model_dir = str(tmp_path / "model")
    flag_values = flags.FlagValues()
    define_flags(flag_values)
    parse = make_flags_parser(PROGRAM, flag_values)
    environ = {} if tf_config is None else {"TF_CONFIG": tf_config}
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        parse([PROGRAM, f"--model_dir={model_dir}", *args])
        try:
            cluster = cluster_from_environment(environ)
            job = job_from_flags(flag_values)
            if preflight:
                from estimator_dist.task.preflight import preflight as check

                check(job, cluster.num_workers)
        except UsageError as error:
            usage_exit(PROGRAM, str(error))
    return exited.value.code, capsys.readouterr().err, model_dir


def assert_refused(code, output, model_dir):
    assert code == 2, (code, output)
    assert "estimator_dist.train: error: " in output, output
    assert "Traceback" not in output, output
    assert not os.path.exists(model_dir), "a usage error must write nothing to model_dir"


def assert_usage_error(run):
    assert run.returncode == 2, run.describe()
    assert "estimator_dist.train: error: " in run.output, run.output
    assert "Traceback" not in run.output, run.output
    assert not os.path.exists(run.model_dir), "a usage error must write nothing to model_dir"


def test_the_table_has_at_least_50_inputs():
    assert len(TF_CONFIG_CASES) + len(FLAG_CASES) >= 50


@pytest.mark.parametrize("tf_config", TF_CONFIG_CASES)
def test_malformed_tf_config(capsys, tmp_path, tf_config):
    code, output, model_dir = usage_error_in_process(capsys, tmp_path, [], tf_config)
    assert_refused(code, output, model_dir)
    assert "Invalid TF_CONFIG" in output


# `positional` is main's own check, before the stages run here: its row is a subprocess case.
@pytest.mark.parametrize("args", [a for a in FLAG_CASES if a != ["positional"]], ids=" ".join)
def test_bad_flag(capsys, tmp_path, args):
    code, output, model_dir = usage_error_in_process(capsys, tmp_path, args)
    assert_refused(code, output, model_dir)
    flag = args[0].split("=")[0]
    assert flag.lstrip("-") in output or args[0] in output, output


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "env, args, fragment", SUBPROCESS_CASES, ids=["tf_config", "flag", "positional"]
)
def test_the_entry_point_exits_2_and_says_why(tmp_path, env, args, fragment):
    """End to end: the exit code, the message on the output, nothing written."""
    model_dir = str(tmp_path / "model")
    run = run_module(
        "estimator_dist.train",
        [f"--model_dir={model_dir}", *args],
        timeout=60,
        env=env,
        model_dir=model_dir,
        check=False,
    )
    assert_usage_error(run)
    assert fragment in run.output, run.output
