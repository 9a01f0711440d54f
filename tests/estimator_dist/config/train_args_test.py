"""Training flags after a program's `--` are checked strictly, before any task starts."""

import pytest

from estimator_dist.base.errors import UsageError
from estimator_dist.config.train_args import job_from_args, parse_args


def test_a_misspelt_training_flag_is_refused_with_a_suggestion():
    with pytest.raises(UsageError) as raised:
        parse_args(["--model_dir=/tmp/run", "--trian_steps=5"])
    message = str(raised.value)
    assert "trian_steps" in message and "train_steps" in message


def test_absls_own_flags_parse_as_on_a_task():
    parsed = parse_args(["--model_dir=/tmp/run", "--verbosity=1", "--train_steps=7"])
    assert parsed["train_steps"].value == 7 and parsed["verbosity"].value == 1


def test_a_positional_argument_is_refused():
    with pytest.raises(UsageError, match=r"unexpected positional arguments after '--': \['oops'\]"):
        parse_args(["--model_dir=/tmp/run", "oops"])


def test_the_job_is_made_from_the_arguments():
    assert job_from_args(["--model_dir=/tmp/run", "--train_steps=50"]).train_steps == 50
