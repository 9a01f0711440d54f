"""Programs in the shapes of public Estimator programs end on a cluster as in plain TensorFlow.

Each program of `PROGRAMS` is the package's own, written in the shape of public
programs it was measured on (named in its docstring); `tests.differential`
runs it unchanged in plain TensorFlow, through the package in one process, and
on 2 workers + an evaluator, and every difference distribution does not explain
fails the test: the exit code, the last checkpoint's step, whether that step
was evaluated, the exports, what the program printed.
"""

from __future__ import annotations

import os
import shutil

import pytest

from tests import differential
from tests.differential import Program
from tests.legacy import shape_data
from tests.procs import REPO

pytestmark = [pytest.mark.multiprocess, pytest.mark.timeout(400)]

SCRIPTS = os.path.join(REPO, "tests", "legacy", "scripts")
PACKAGES = os.path.join(REPO, "tests", "legacy", "programs")
#: Seconds each run may take (the launcher's --timeout_secs; the harness waits 30 s more).
TIMEOUT = 240


def _script(name: str) -> str:
    return os.path.join(SCRIPTS, name)


def _pretrained(data_dir: str, model_dir: str) -> None:
    """Puts the checkpoint that `train_only.py` trained (see `data_dir`) into `model_dir`."""
    shutil.rmtree(model_dir)
    shutil.copytree(os.path.join(data_dir, "pretrained"), model_dir)


PROGRAMS = {
    program.name: program
    for program in (
        Program(
            "tpu_mnist",
            ("--data_dir={data_dir}", "--model_dir={model_dir}", "--train_steps=40"),
            script=_script("tpu_mnist.py"),
        ),
        Program(
            "keras_own_strategies",
            ("{model_dir}", "40"),
            script=_script("keras_own_strategies.py"),
            launcher_args=("--model_dir={model_dir}",),
        ),
        Program(
            "eager_peek",
            ("--model_dir={model_dir}",),
            script=_script("eager_peek.py"),
        ),
        Program(
            "keras_mirrored",
            ("--model_dir={model_dir}", "--epochs=3"),
            script=_script("keras_mirrored.py"),
            input_ends=True,
        ),
        Program(
            "census_trainer",
            (
                "--job-dir={model_dir}",
                "--train-files",
                "{data_dir}/train.csv",
                "--eval-files",
                "{data_dir}/eval.csv",
                "--train-steps=40",
            ),
            module="trainer.task",
            package_path=os.path.join(PACKAGES, "census_pkg"),
        ),
        Program(
            "sequence_package",
            ("--output_dir={model_dir}", "--train_steps=40"),
            module="textgru.task",
            package_path=os.path.join(PACKAGES, "sequence_pkg"),
            launcher_args=("--model_dir={model_dir}",),
        ),
        Program(
            "hooks_tf1",
            ("--model_dir={model_dir}", "--epochs=5"),
            script=_script("hooks_tf1.py"),
        ),
        Program(
            "stop_hook_finite",
            ("--model_dir={model_dir}",),
            script=_script("stop_hook_finite.py"),
        ),
        Program(
            "train_only",
            ("--model_dir={model_dir}", "--steps=30"),
            script=_script("train_only.py"),
        ),
        Program(
            "evaluate_only",
            ("--model_dir={model_dir}",),
            script=_script("evaluate_only.py"),
            prepare=_pretrained,
        ),
        Program(
            "warm_started_pair",
            ("--model_dir={model_dir}",),
            script=_script("warm_started_pair.py"),
        ),
        Program(
            "migration_functions",
            ("--model_dir={model_dir}",),
            script=os.path.join(REPO, "tests", "legacy", "migration_functions.py"),
            train_flags=(
                "--model_dir={model_dir}",
                "--model_fn=tests.legacy.migration_functions:model_fn",
                "--input_fn=tests.legacy.migration_functions:input_fn",
                "--eval_input_fn=tests.legacy.migration_functions:eval_input_fn",
            ),
            input_ends=True,
        ),
    )
}


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The programs' data, made once in the layouts they read."""
    path = str(tmp_path_factory.mktemp("data"))
    shape_data.mnist_records(path)
    shape_data.census_csv(os.path.join(path, "train.csv"), 256, 0)
    shape_data.census_csv(os.path.join(path, "eval.csv"), 64, 1)
    pretrained = os.path.join(path, "pretrained")
    run = differential.run(
        Program(
            "pretrain", ("--model_dir={model_dir}", "--steps=20"), script=_script("train_only.py")
        ),
        differential.PLAIN,
        os.path.join(path, "pretraining"),
        path,
        TIMEOUT,
    )
    assert run.exit_code == 0, run.output
    shutil.copytree(run.model_dir, pretrained)
    return path


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_the_cluster_ends_as_plain_tensorflow_does(name, data_dir, tmp_path):
    program = PROGRAMS[name]
    outcomes = differential.run_all(program, str(tmp_path), data_dir, TIMEOUT)
    found = differential.compare(outcomes, program)
    assert outcomes[differential.PLAIN].exit_code == 0, outcomes[differential.PLAIN].output
    assert not any(found.values()), differential.explain(program, outcomes, found)
