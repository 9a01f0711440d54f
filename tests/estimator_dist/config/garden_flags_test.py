"""Model Garden's ResNet command as its users type it, and training counted in epochs.

The flags are parsed as `estimator_dist.train` and the launcher parse them
(`train_args.job_from_args`); the end-to-end test runs Model Garden's
command on 2 workers and an evaluator, reading a CIFAR-10 binary folder.
"""

import json
import os
import re

import pytest
import tensorflow as tf

from estimator_dist.base import exit_codes
from estimator_dist.base.errors import UsageError
from estimator_dist.config import garden_flags
from estimator_dist.config.train_args import job_from_args
from estimator_dist.report.console import SUPERVISED_ENV
from tests.input_fns.cifar10_binary_test import write_release
from tests.procs import run_module

#: Model Garden's command of the issue, with --num_gpus 0 (no GPU here).
GARDEN_COMMAND = ["--distribution_strategy", "multi_worker_mirrored", "--num_gpus", "0"]


@pytest.fixture
def notes(monkeypatch):
    """The lines `garden_flags` logs, as a person reads them."""
    logged = []
    monkeypatch.setattr(garden_flags.logging, "info", lambda fmt, *args: logged.append(fmt % args))
    return logged


def job(tmp_path, *args):
    return job_from_args([f"--model_dir={tmp_path / 'model'}", *args])


# --- Model Garden's command ---------------------------------------------------------------


def test_model_gardens_command_reads_the_binary_folder_on_the_cpu(tmp_path, notes):
    folder = write_release(tmp_path / "cifar-10-batches-bin", records=128)
    garden = job(tmp_path, "--data_dir", folder, *GARDEN_COMMAND, "--model_fn=resnet_cifar")
    assert (garden.input_fn, garden.eval_input_name) == ("cifar10_binary", "cifar10_binary")
    assert (garden.strategy.name, garden.strategy.num_gpus) == ("multi_worker_mirrored", 0)
    assert notes == [
        f"estimator_dist: --data_dir={folder} holds CIFAR-10's binary release: no --input_fn "
        "reads it with --input_fn=cifar10_binary (not a prepared TFDS dataset)"
    ]
    explicit = job(
        tmp_path, f"--data_dir={folder}", "--input_fn=cifar10", "--eval_input_fn=cifar10"
    )
    assert (explicit.input_fn, explicit.eval_input_fn) == ("cifar10_binary", "cifar10_binary")


def test_cifar10_without_the_binary_layout_stays_tfds_and_the_default_stays_digits(tmp_path):
    assert job(tmp_path, f"--data_dir={tmp_path}", "--input_fn=cifar10").input_fn == "cifar10"
    assert job(tmp_path, f"--data_dir={tmp_path}").input_fn == "digits"


@pytest.mark.parametrize(
    "args, communication",
    [
        (["--all_reduce_alg=ring"], "RING"),
        (["--all_reduce_alg=NCCL"], "NCCL"),
        (["--all_reduce_alg=nccl", "--communication=nccl"], "NCCL"),
        ([], "AUTO"),
    ],
)
def test_all_reduce_alg_is_communication(tmp_path, args, communication):
    assert job(tmp_path, *args).strategy.communication == communication


def test_aliases_and_resnet_size_mean_ours(tmp_path, notes):
    garden = job(
        tmp_path,
        "--max_train_steps=50",
        "--inter_op_parallelism_threads=2",
        "--intra_op_parallelism_threads=3",
        "--resnet_size=32",
        "--num_gpus=-1",
    )
    assert garden.train_steps == 50
    assert (garden.run.inter_op_threads, garden.run.intra_op_threads) == (2, 3)
    assert (garden.model_fn, garden.params["depth"]) == ("resnet_cifar", 32)
    assert garden.strategy.num_gpus is None  # Model Garden's -1: every visible GPU.
    assert notes == [
        "estimator_dist: --resnet_size=32 is --model_fn=resnet_cifar --params=depth=32"
    ]


@pytest.mark.parametrize("name", sorted(garden_flags.REFUSED))
def test_refused_flags_name_the_equivalent(tmp_path, name):
    value = [f"--{name}"] if name in garden_flags._BOOLEANS else [f"--{name}=1"]
    with pytest.raises(UsageError) as raised:
        job(tmp_path, *value)
    assert str(raised.value) == (
        f"--{name} is Model Garden's, not used here: {garden_flags.REFUSED[name]}."
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--all_reduce_alg=hierarchical_copy"],
            "--all_reduce_alg=hierarchical_copy: valid here are ring, nccl",
        ),
        (
            ["--all_reduce_alg=ring", "--communication=nccl"],
            "--all_reduce_alg=ring and --communication=NCCL disagree; give one of them.",
        ),
        (
            ["--resnet_size=20", "--model_fn=mnist_cnn"],
            "--resnet_size=20 is the depth of resnet_cifar, but the model is mnist_cnn.",
        ),
        (
            ["--resnet_size=20", "--params=depth=32"],
            "--resnet_size=20 and --params=depth=32 disagree; give one of them.",
        ),
        (
            ["--num_gpus=2", "--distribution_strategy=one_device"],
            "--distribution_strategy=one_device trains on one device, but --num_gpus=2 asks "
            "for 2. Use --distribution_strategy=mirrored (one process) or "
            "multi_worker_mirrored, or --num_gpus=1.",
        ),
        (
            ["--num_gpus=8", "--distribution_strategy=off"],
            "--distribution_strategy=off trains on one device, but --num_gpus=8 asks for 8.",
        ),
    ],
)
def test_fail_with_flags_that_do_not_fit(tmp_path, args, message):
    with pytest.raises(UsageError) as raised:
        job(tmp_path, *args)
    assert message in str(raised.value)


# --- epochs --------------------------------------------------------------------------------


def test_train_epochs_are_steps_and_the_mapping_is_logged(tmp_path, notes):
    garden = job(tmp_path, "--train_epochs=2", "--batch_size=128", "--num_train_examples=50000")
    assert garden.train_steps == 782
    assert notes == [
        "estimator_dist: --train_epochs=2 is 782 steps of 128 examples over 50,000 training "
        "examples"
    ]
    assert garden.notes == tuple(note.removeprefix("estimator_dist: ") for note in notes)
    assert garden.model_params["num_train_examples"] == 50000


def test_epochs_count_the_binary_folder_and_checkpoint_at_each_epoch(tmp_path, notes):
    folder = write_release(tmp_path / "bin", records=128)
    garden = job(
        tmp_path,
        f"--data_dir={folder}",
        "--train_epochs=2",
        "--epochs_between_evals=1",
        "--batch_size=64",
        "--gradient_accumulation_steps=2",
        "--model_fn=resnet_cifar",
    )
    # 640 examples, 128 an update: 5 updates an epoch.
    assert (garden.train_steps, garden.run.save_checkpoints_steps) == (10, 5)
    assert garden.num_train_examples == 640
    assert notes[1:] == [
        "estimator_dist: --train_epochs=2 is 10 steps of 128 examples (64 x 2 accumulated) over "
        "640 training examples",
        "estimator_dist: --epochs_between_evals=1 is a checkpoint every 5 steps of 128 examples "
        "(64 x 2 accumulated) over 640 training examples, each one evaluated",
    ]


def test_train_steps_stop_the_epochs_early_as_max_train_steps_does(tmp_path, notes):
    garden = job(tmp_path, "--train_epochs=3", "--train_steps=100", "--num_train_examples=6400")
    assert garden.train_steps == 100  # 3 epochs would be 300 steps of 64.
    assert notes[0].endswith(
        "is 300 steps of 64 examples over 6,400 training examples, stopping at --train_steps=100"
    )


def test_fractional_epochs_and_save_checkpoints_epochs(tmp_path):
    garden = job(
        tmp_path,
        "--input_fn=synthetic",
        "--params=num_examples=1000",
        "--train_epochs=0.5",
        "--save_checkpoints_epochs=0.1",
        "--batch_size=10",
    )
    assert (garden.train_steps, garden.run.save_checkpoints_steps) == (50, 10)


def test_under_the_launcher_a_task_logs_the_mapping_to_its_log_only(tmp_path, notes, monkeypatch):
    monkeypatch.setenv(SUPERVISED_ENV, "1")
    job(tmp_path, "--train_epochs=1", "--num_train_examples=640")
    assert notes == ["--train_epochs=1 is 10 steps of 64 examples over 640 training examples"]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["--train_epochs=1", "--input_fn=csv"],
            "--train_epochs needs the number of training examples, which input_fn csv cannot "
            "count; pass --num_train_examples=N.",
        ),
        (
            [
                "--save_checkpoints_epochs=1",
                "--save_checkpoints_steps=9",
                "--num_train_examples=9",
            ],
            "--save_checkpoints_epochs=1 and --save_checkpoints_steps=9 disagree",
        ),
        (
            ["--save_checkpoints_epochs=1", "--epochs_between_evals=2", "--num_train_examples=9"],
            "--save_checkpoints_epochs=1 and --epochs_between_evals=2 disagree",
        ),
        (["--train_epochs=0", "--num_train_examples=9"], "--train_epochs must be more than 0"),
        (
            ["--num_train_examples=9", "--params=num_train_examples=10"],
            "--params=num_train_examples=10 and --num_train_examples=9 disagree",
        ),
    ],
)
def test_fail_with_epochs_that_cannot_be_steps(tmp_path, args, message):
    with pytest.raises(UsageError) as raised:
        job(tmp_path, *args)
    assert message in str(raised.value)


def test_fail_with_a_truncated_binary_file_exits_3(tmp_path):
    folder = write_release(tmp_path / "bin")
    with open(os.path.join(folder, "test_batch.bin"), "ab") as stream:
        stream.write(b"x")
    with pytest.raises(Exception) as raised:
        job(tmp_path, f"--data_dir={folder}", "--train_epochs=1")
    assert raised.value.exit_code == exit_codes.BAD_DATA
    assert "expected a positive multiple of 3,073" in str(raised.value)


# --- end to end ----------------------------------------------------------------------------


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_model_gardens_command_trains_two_workers_and_an_evaluator_from_the_binary_folder(
    tmp_path,
):
    # 64 records a file, the least that still gives each epoch more than one step and a
    # checkpoint of its own: the epochs' mapping, the sharding by file and the evaluator's
    # split are proved at any size, and each step of ResNet costs CPU time on 3 tasks.
    folder = write_release(tmp_path / "cifar-10-batches-bin", records=64)
    model_dir = str(tmp_path / "model")
    args = [
        "--num_workers=2",
        "--evaluator",
        "--timeout_secs=800",
        "--",
        f"--model_dir={model_dir}",
        "--data_dir",
        folder,
        *GARDEN_COMMAND,
        "--model_fn=resnet_cifar",
        "--resnet_size=8",
        "--batch_size=64",
        "--train_epochs=2",
        "--epochs_between_evals=1",
        "--log_step_count_steps=5",
        "--eval_throttle_secs=1",
    ]
    run = run_module("estimator_dist.launch", args, 850, model_dir=model_dir)

    # 320 training records, 64 a step: 5 steps an epoch, a checkpoint at each epoch's end.
    line = "--train_epochs=2 is 10 steps of 64 examples over 320 training examples"
    assert run.output.count(line) == 1 and f"[launcher] estimator_dist: {line}" in run.output
    state = tf.train.get_checkpoint_state(model_dir)
    steps = [int(path.rsplit("-", 1)[1]) for path in state.all_model_checkpoint_paths]
    assert {5, 10} <= set(steps) <= {0, 5, 10}, steps
    final = run.json("eval_metrics.json")
    assert final["final"] and final["metrics"]["global_step"] == 10
    assert 0 <= final["metrics"]["accuracy"] <= 1 and final["metrics"]["loss"] > 0

    record = run.json("run_record.json")
    assert record["strategy_class"] == "CollectiveAllReduceStrategy"
    assert (record["num_workers"], record["num_replicas"]) == (2, 2)
    assert record["communication_used"] == "RING"
    assert record["config"]["strategy"]["num_gpus"] == 0
    assert record["num_gpus"] == 0
    assert len(record["devices"]) == 1 and record["devices"][0].endswith("CPU:0"), record["devices"]
    assert record["config"]["input_fn"] == "cifar10_binary"
    assert line in record["config"]["notes"]
    assert re.search(
        r"\[chief\] \[100%\] loss = [\d.]+, learning_rate = 0\.05, step = 10/10", run.output
    )
    logs = {
        name: open(os.path.join(model_dir, "logs", f"{name}.log")).read()
        for name in ("chief-0", "worker-0", "evaluator-0")
    }
    assert (
        "input_fn cifar10_binary train split=data_batch_2.bin, data_batch_4.bin" in logs["worker-0"]
    )
    assert "pipeline 1 of 2; sharding by file (5 files over 2 pipelines)" in logs["worker-0"]
    assert "input_fn cifar10_binary eval split=test_batch.bin" in logs["evaluator-0"]
    assert (
        "over /job:worker/replica:0/task:0/device:CPU:0; 0 GPU(s); collectives RING"
        in logs["worker-0"]
    )
    with open(os.path.join(model_dir, "run_record.json")) as stream:
        assert json.load(stream)["config"]["num_train_examples"] == 320


# --- --dtype -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, meant", [("fp32", "off"), ("bf16", "bfloat16"), ("fp16", "float16")]
)
def test_dtype_is_mixed_precision(tmp_path, notes, dtype, meant):
    assert job(tmp_path, f"--dtype={dtype}").run.precision.mixed_precision == meant
    assert notes == [f"estimator_dist: --dtype={dtype} is --mixed_precision={meant}"]


def test_dtype_and_mixed_precision_that_disagree_are_refused(tmp_path):
    with pytest.raises(UsageError, match="--dtype=bf16 means --mixed_precision=bfloat16, but"):
        job(tmp_path, "--dtype=bf16", "--mixed_precision=off")
    assert job(tmp_path, "--dtype=bf16", "--mixed_precision=BFLOAT16").run.precision == (
        job(tmp_path, "--mixed_precision=bfloat16").run.precision
    )
