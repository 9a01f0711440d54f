"""Settings: a dataclass field written once makes its flag, its parsing and its bound."""

import dataclasses
from typing import Optional, Tuple

import pytest
from absl import flags

from estimator_dist.base import settings
from estimator_dist.base.errors import UsageError
from estimator_dist.base.settings import setting


@dataclasses.dataclass(frozen=True)
class Inner:
    timeout: Optional[float] = setting(
        None,
        "Seconds; 0 waits forever.",
        kind="float",
        flag="wait",
        flag_default=0,
        lower_bound=0.0,
        convert=settings.none_for_zero,
    )
    mode: str = setting("fast", "How.", enum=("fast", "slow"))


@dataclasses.dataclass(frozen=True)
class Outer:
    name: str = setting(
        dataclasses.MISSING, "Who.", kind="string", flag_default=None, required=True
    )
    steps: int = setting(10, "Steps.", lower_bound=1)
    eval_steps: Optional[int] = setting(None, "Evaluation steps.", kind="integer", lower_bound=1)
    inner: Inner = Inner()
    exports: Tuple[str, ...] = setting(("a", "b"), "What to export.", flag="export")
    tags: Tuple[str, ...] = setting((), "A tag, repeated.", kind="multi_string", flag="tag")
    fast: bool = setting(True, "Go fast.")
    notes: Tuple[str, ...] = ()

    def __post_init__(self):
        settings.check_bounds(self)


def parsed(*args, helps=None):
    flag_values = flags.FlagValues()
    settings.define_flags(Outer, flag_values, __name__, helps)
    flag_values(["program", *args])
    return flag_values


def test_flags_are_generated_from_the_fields_in_their_order():
    flag_values = parsed("--name=x")
    names = [flag.name for flag in flag_values.flags_by_module_dict()[__name__]]
    assert names == ["name", "steps", "eval_steps", "wait", "mode", "export", "tag", "fast"]
    assert settings.flag_names(Outer) == tuple(names)
    assert flag_values["export"].default == ["a", "b"]
    assert flag_values["mode"].parser.case_sensitive is False


def test_the_config_is_built_from_the_parsed_flags_nested_ones_included():
    built = settings.from_flags(
        Outer,
        parsed("--name=x", "--wait=2.5", "--mode=SLOW", "--export=b", "--tag=t1", "--tag=t2"),
        notes=("a note",),
    )
    assert built == Outer(
        "x", inner=Inner(2.5, "slow"), exports=("b",), tags=("t1", "t2"), notes=("a note",)
    )
    assert settings.from_flags(Outer, parsed("--name=x")) == Outer("x")  # 0 waits: None.


def test_values_given_by_flag_name_replace_the_flags_own():
    built = settings.from_flags(Outer, parsed("--name=x", "--steps=5"), {"steps": 7, "wait": 3.0})
    assert (built.steps, built.inner.timeout) == (7, 3.0)


def test_to_args_round_trips_through_the_flags():
    config = Outer("x", steps=3, exports=("a",), tags=("t1", "t2"), fast=False)
    args = settings.to_args(config)
    assert args == [
        "--name=x",
        "--steps=3",
        "--mode=fast",
        "--export=a",
        "--tag=t1",
        "--tag=t2",
        "--fast=false",
    ]
    assert settings.from_flags(Outer, parsed(*args)) == config


def test_a_required_flag_must_be_given_and_a_flag_below_its_bound_is_refused():
    with pytest.raises(flags.IllegalFlagValueError, match="--name"):
        parsed()
    with pytest.raises(flags.IllegalFlagValueError, match="steps"):
        parsed("--name=x", "--steps=0")


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"steps": 0}, "steps must be at least 1, received 0."),
        ({"eval_steps": 0}, "eval_steps must be at least 1 or None, received 0."),
    ],
)
def test_a_config_built_in_code_obeys_the_same_bounds(fields, message):
    with pytest.raises(UsageError) as raised:
        Outer("x", **fields)
    assert str(raised.value) == message


def test_a_program_may_give_a_flag_a_narrower_help():
    assert parsed("--name=x", helps={"steps": "Steps here."})["steps"].help == "Steps here."


def test_a_setting_whose_type_cannot_be_read_is_refused_at_once():
    with pytest.raises(TypeError, match="give kind="):
        setting(None, "No type.")
