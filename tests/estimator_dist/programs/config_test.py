"""`ScriptConfig`: a script or a module of a package, checked by its files, and its command line.

Each bad program is refused with one message (what, the value, what was
expected, the fix) and exit code 2; the entry points are also run as the real
subprocesses they are (`estimator_dist.script`, and the launcher once), which
run no user code and import no TensorFlow before refusing.
"""

import os

import pytest
from absl import flags

from estimator_dist.base import exit_codes
from estimator_dist.base.errors import UsageError
from estimator_dist.config.evaluation import EvaluationConfig
from estimator_dist.config.guards import GuardConfig
from estimator_dist.config.results import ResultsConfig
from estimator_dist.programs import config as script_config
from estimator_dist.programs.config import ScriptConfig, config_from_flags
from run_config.options import StrategyConfig
from tests.procs import REPO, run_module

TRAINER = os.path.join(REPO, "tests", "legacy", "programs", "trainer_pkg")


def make_package(root, files):
    """Writes `files` (relative path to source) under `root`; returns `root` as a string."""
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return str(root)


def refused(**kwargs):
    with pytest.raises(UsageError) as raised:
        ScriptConfig(**kwargs)
    assert raised.value.exit_code == exit_codes.USAGE
    return str(raised.value)


def run_script_entry(args):
    """`python -m estimator_dist.script ARGS`: exit code and output."""
    run = run_module("estimator_dist.script", args, 60, check=False)
    assert "Traceback" not in run.output, run.describe()
    return run.returncode, run.output


def test_a_module_is_found_by_its_files_and_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(TRAINER)
    config = ScriptConfig(module="trainer.task", args=["--job-dir=/tmp/x"])
    assert config.package_path == TRAINER
    assert config.path == os.path.join(TRAINER, "trainer", "task.py")
    assert config.program == "module trainer.task"


def test_a_package_with_main_runs_its_main(tmp_path):
    root = make_package(tmp_path, {"app/__init__.py": "", "app/__main__.py": "print(1)\n"})
    config = ScriptConfig(module="app", package_path=root)
    assert config.path == os.path.join(root, "app", "__main__.py")


def test_to_args_round_trips_through_the_flags(tmp_path):
    config = ScriptConfig(
        module="trainer.task",
        package_path=os.path.relpath(TRAINER),
        args=["--job-dir", "/tmp/x"],
        strategy=StrategyConfig(communication="ring", bytes_per_pack=1024),
        evaluation=EvaluationConfig(throttle_secs=1),
        results=ResultsConfig(model_dir=str(tmp_path)),
    )
    args = config.to_args()
    assert args[:2] == ["--module=trainer.task", f"--package_path={TRAINER}"]
    flag_values = flags.FlagValues()
    script_config.define_flags(flag_values)
    flag_values.set_gnu_getopt(False)
    rest = flag_values(["estimator_dist.script", *args])
    assert config_from_flags(flag_values, None, rest[1:]) == config
    # A copy keeps the module's file, which it found the first time.
    assert ScriptConfig(**{**vars(config), "guards": GuardConfig(stall_timeout=9.0)}).path == (
        config.path
    )


@pytest.mark.parametrize(
    "strategy, fragments",
    [
        (
            StrategyConfig("mirrored"),
            ["--distribution_strategy=mirrored", "multi_worker_mirrored", "RunConfig"],
        ),
        (StrategyConfig(num_gpus=1), ["--num_gpus=1", "CUDA_VISIBLE_DEVICES"]),
    ],
)
def test_fail_with_strategy_settings_a_program_cannot_take(strategy, fragments):
    message = refused(path=__file__, strategy=strategy)
    assert all(fragment in message for fragment in fragments), message


def test_the_job_settings_are_the_named_jobs_own_flags():
    """One declaration: a program's strategy, evaluation and results flags are the train job's."""
    from estimator_dist.config import train_flags

    named = flags.FlagValues()
    train_flags.define_flags(named)
    program = flags.FlagValues()
    script_config.define_flags(program)
    shared = set(script_config.FLAG_NAMES) & set(named)
    for name in (
        "model_dir",
        "storage",
        "communication",
        "collective_timeout",
        "eval_throttle_secs",
        "eval_start_delay_secs",
        "stall_timeout",
    ):
        assert name in shared, name
        assert program[name].default == named[name].default, name


@pytest.mark.multiprocess
def test_fail_with_a_module_not_found(tmp_path):
    root = make_package(tmp_path, {"trainer/__init__.py": ""})
    message = refused(module="trainer.task", package_path=root)
    assert message.startswith("--module=trainer.task not found: there is no trainer.task under ")
    assert f"(looked for {root}/trainer/task.py and {root}/trainer/task/)" in message
    assert "fix --package_path or the module's name" in message
    code, output = run_script_entry(["--module=trainer.task", f"--package_path={root}", "--"])
    assert code == exit_codes.USAGE
    assert "estimator_dist.script: error: --module=trainer.task not found" in output


def test_fail_with_a_parent_that_is_not_a_package(tmp_path):
    root = make_package(tmp_path, {"trainer.py": "x = 1\n"})
    message = refused(module="trainer.task", package_path=root)
    assert f"trainer is a module ({root}/trainer.py), not a package" in message
    assert "expected a directory" in message


def test_fail_with_a_package_without_main(tmp_path):
    root = make_package(tmp_path, {"trainer/__init__.py": ""})
    message = refused(module="trainer", package_path=root)
    assert "is a package" in message and "without __main__.py" in message
    assert "such as --module=trainer.task" in message


def test_fail_with_a_module_that_is_not_python(tmp_path):
    root = make_package(tmp_path, {"trainer/__init__.py": "", "trainer/task.py": "def (:\n"})
    message = refused(module="trainer.task", package_path=root)
    assert message.startswith("--module=trainer.task is not a Python script (")
    assert "line 1" in message


def test_fail_with_a_file_path_as_module_name():
    message = refused(module="trainer/task.py")
    assert "--module=trainer/task.py is not a module name" in message
    assert "use --script=FILE for a file" in message


@pytest.mark.multiprocess
def test_fail_with_a_package_path_that_is_missing(tmp_path):
    missing = str(tmp_path / "nowhere")
    message = refused(module="trainer.task", package_path=missing)
    assert message.startswith(f"--package_path={missing} is not a directory (looked for ")
    code, output = run_script_entry(["--module=trainer.task", f"--package_path={missing}", "--"])
    assert code == exit_codes.USAGE
    assert f"estimator_dist.script: error: --package_path={missing} is not a directory" in output


def test_fail_with_a_package_path_without_module():
    message = refused(path=__file__, package_path="/tmp")
    assert message.startswith("--package_path=/tmp was given without --module")


def test_fail_with_neither_script_nor_module():
    message = refused()
    assert message.startswith("no program given (neither --script nor --module)")
    assert "--module=trainer.task" in message


def test_fail_with_both_script_and_module():
    flag_values = flags.FlagValues()
    script_config.define_flags(flag_values)
    flag_values(["prog", "--module=trainer.task", f"--package_path={TRAINER}"])
    with pytest.raises(UsageError, match=r"^both --script=train\.py and --module=trainer\.task"):
        config_from_flags(flag_values, "train.py", [])


@pytest.mark.multiprocess
def test_fail_with_both_script_and_module_in_the_launcher(tmp_path):
    run = run_module(
        "estimator_dist.launch",
        ["--module=trainer.task", f"--script={__file__}", "--", f"--job-dir={tmp_path}"],
        120,
        check=False,
    )
    assert run.returncode == exit_codes.USAGE, run.describe()
    assert (
        f"estimator_dist.launch: error: both --script={__file__} and --module=trainer.task were "
        "given; expected one program"
    ) in run.output
    assert "started" not in run.output and "Traceback" not in run.output


def test_mixed_precision_is_a_flag_of_scripts_and_passed_on():
    flag_values = flags.FlagValues()
    script_config.define_flags(flag_values)
    flag_values(["estimator_dist.script", "--mixed_precision=BFloat16"])
    config = config_from_flags(flag_values, __file__, ["--steps=1"])
    assert config.precision.mixed_precision == "bfloat16"
    args = config.to_args()
    assert "--mixed_precision=bfloat16" in args
    assert args[args.index("--") :] == ["--", __file__, "--steps=1"]
    again = flags.FlagValues()
    script_config.define_flags(again)
    again(["estimator_dist.script", *args[: args.index("--")]])
    assert config_from_flags(again, __file__, ["--steps=1"]) == config
