"""JobConfig: its settings, each a field carrying its flag, validated on construction."""

import dataclasses

import pytest
from absl import flags

from estimator_dist.base import settings
from estimator_dist.base.errors import UsageError
from estimator_dist.config import train_flags
from estimator_dist.config.evaluation import EvaluationConfig
from estimator_dist.config.guards import GuardConfig
from estimator_dist.config.job import JobConfig
from estimator_dist.config.results import ResultsConfig
from run_config.options import RunConfigOptions, StrategyConfig


def job(**fields):
    return JobConfig(run=RunConfigOptions("/tmp/m"), **fields)


def test_the_model_gets_the_examples_of_an_epoch_unless_its_params_give_them():
    assert job(num_train_examples=640).model_params["num_train_examples"] == 640
    assert "num_train_examples" not in job().model_params
    given = job(params={"num_train_examples": 50_000})
    assert given.model_params["num_train_examples"] == 50_000
    same = job(num_train_examples=640, params={"num_train_examples": 640})
    assert same.model_params["num_train_examples"] == 640


def test_notes_are_recorded_with_the_job():
    notes = ("--train_epochs=2 is 20 steps of 64 examples over 640 training examples",)
    assert job(notes=notes).to_dict()["notes"] == list(notes)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"num_train_examples": 0}, "num_train_examples must be at least 1 or None, received 0"),
        (
            {"num_train_examples": 9, "params": {"num_train_examples": 10}},
            "--params=num_train_examples=10 and --num_train_examples=9 disagree",
        ),
    ],
)
def test_fail_with_epoch_settings_that_disagree(fields, message):
    with pytest.raises(UsageError, match=message):
        job(**fields)


def test_num_gpus_is_stored_once_with_the_strategy():
    assert "num_gpus" not in {field.name for field in dataclasses.fields(RunConfigOptions)}
    assert job(strategy=StrategyConfig(num_gpus=0)).to_dict()["strategy"]["num_gpus"] == 0


def test_every_setting_of_the_job_is_a_training_flag_with_its_default():
    flag_values = flags.FlagValues()
    train_flags.define_flags(flag_values)
    flag_values(["train", "--model_dir=/tmp/m"])
    built = train_flags.job_from_flags(flag_values, read_data=False)
    for config in (built, built.run, built.strategy):
        for field in dataclasses.fields(config):
            if settings.METADATA_KEY in field.metadata:
                assert settings.flag_name(field) in flag_values, field.name
    assert built == job(), "the flags' defaults make the job's defaults"


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"train_steps": 0}, "train_steps must be at least 1 or None, received 0."),
        ({"eval_steps": 0}, "eval_steps must be at least 1 or None, received 0."),
        ({"guards": {"stall_timeout": 0.5}}, "stall_timeout must be at least 1, received 0.5."),
        ({"evaluation": {"throttle_secs": -1}}, "throttle_secs must be at least 0 or None"),
        ({"learning_rate": 0.0}, "learning_rate must be positive, received 0.0."),
    ],
)
def test_a_setting_below_its_flags_bound_is_refused_in_code_too(fields, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        nested = {"guards": GuardConfig, "evaluation": EvaluationConfig}
        for name, config in nested.items():  # A nested config refuses its own settings.
            if name in fields:
                fields = {name: config(**fields[name])}
        job(**fields)


def test_the_model_dir_is_given_once():
    given = JobConfig(results=ResultsConfig("/tmp/m"))
    assert given.run.model_dir == given.results.model_dir == "/tmp/m"
    with pytest.raises(UsageError, match="no --model_dir"):
        JobConfig()
    with pytest.raises(UsageError, match="two model_dirs for one job: /tmp/a and /tmp/b"):
        JobConfig(run=RunConfigOptions("/tmp/a"), results=ResultsConfig("/tmp/b"))


def test_the_seed_is_stored_once_for_the_graph_and_the_data():
    seeded = JobConfig(run=RunConfigOptions("/tmp/m", tf_random_seed=7))
    assert seeded.seed == 7 and seeded.model_params["seed"] == 7
