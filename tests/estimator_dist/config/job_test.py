"""JobConfig: the settings epochs and `--num_gpus` add, validated on construction."""

import pytest

from estimator_dist.base.errors import UsageError
from estimator_dist.config.job import JobConfig
from run_config.run_config import RunConfigOptions
from run_config.strategies import StrategyConfig


def job(num_gpus=None, **fields):
    return JobConfig(
        run=RunConfigOptions("/tmp/m", num_gpus=num_gpus),
        strategy=StrategyConfig(num_gpus=num_gpus),
        **fields,
    )


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
        ({"num_train_examples": 0}, "num_train_examples must be at least 1, received 0"),
        (
            {"num_train_examples": 9, "params": {"num_train_examples": 10}},
            "--params=num_train_examples=10 and --num_train_examples=9 disagree",
        ),
    ],
)
def test_fail_with_epoch_settings_that_disagree(fields, message):
    with pytest.raises(UsageError, match=message):
        job(**fields)


def test_fail_with_gpu_settings_that_differ():
    with pytest.raises(UsageError, match=r"num_gpus must be the same for the strategy \(0\)"):
        JobConfig(run=RunConfigOptions("/tmp/m"), strategy=StrategyConfig(num_gpus=0))
