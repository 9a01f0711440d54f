"""`--params` parsing and validated parameter dataclasses."""

import dataclasses
import json
import subprocess
import sys
from typing import Optional

import pytest

from estimator_dist.base import params as params_lib
from estimator_dist.base.errors import UsageError
from estimator_dist.base.params import SHARED_KEYS, from_params, parse_params_flag
from tests import procs


@dataclasses.dataclass(frozen=True)
class Hparams:
    rate: float = 0.1
    depth: int = 2
    name: str = "net"
    flag: bool = False
    note: Optional[str] = None
    seed: Optional[int] = 0

    def __post_init__(self):
        if self.depth > 100:
            raise ValueError(f"depth must be at most 100, received {self.depth}.")


# --- parse_params_flag: key=value ---------------------------------------------


def test_key_values_are_typed_as_yaml_scalars():
    params = parse_params_flag("depth=20,rate=0.1,flag=true,name=momentum,off=false")
    assert params == {"depth": 20, "rate": 0.1, "flag": True, "name": "momentum", "off": False}
    assert type(params["depth"]) is int
    assert type(params["rate"]) is float
    assert type(params["flag"]) is bool
    assert type(params["name"]) is str


def test_key_values_strip_spaces_and_keep_empty_values():
    assert parse_params_flag(" a = 1 , b= ,c=x y") == {"a": 1, "b": "", "c": "x y"}


def test_quoted_value_stays_a_string():
    assert parse_params_flag("a='3',b=\"true\"") == {"a": "3", "b": "true"}


def test_scientific_and_negative_numbers():
    assert parse_params_flag("lr=1.0e-3,offset=-4") == {"lr": 0.001, "offset": -4}


@pytest.mark.parametrize("value", ["", "   ", "\n"])
def test_empty_value_means_no_params(value):
    assert parse_params_flag(value) == {}


@pytest.mark.parametrize("value, item", [("depth", "depth"), ("a=1,b", "b"), ("=3", "=3")])
def test_fail_with_item_without_equals_or_key(value, item):
    with pytest.raises(UsageError) as raised:
        parse_params_flag(value)
    message = str(raised.value)
    assert f"--params item {item!r} is not key=value" in message
    assert f"received --params={value!r}" in message


def test_fail_with_invalid_yaml_value_is_a_usage_error():
    # An unparseable value is a bad flag: it must be reported as UsageError
    # (exit code 2 with a message), not escape as a raw yaml ParserError.
    with pytest.raises(UsageError, match="depths"):
        parse_params_flag("depths=[1,lr=0.1")


def test_value_ending_in_json_is_a_value_not_a_file():
    # `key=value` items whose value happens to be a file name must not turn
    # the whole flag into a file path.
    assert parse_params_flag("label_map=classes.json") == {"label_map": "classes.json"}


# --- parse_params_flag: files -------------------------------------------------


def test_json_file(tmp_path):
    path = tmp_path / "params.json"
    path.write_text(json.dumps({"depth": 3, "rate": 0.5, "name": "x", "flag": True}))
    assert parse_params_flag(str(path)) == {"depth": 3, "rate": 0.5, "name": "x", "flag": True}


@pytest.mark.parametrize("suffix", [".yaml", ".yml", ".txt", ""])
def test_yaml_file(tmp_path, suffix):
    path = tmp_path / f"params{suffix}"
    path.write_text("depth: 3\nrate: 1.5e-2\noptimizer: sgd\nnested:\n  a: [1, 2]\n")
    assert parse_params_flag(f"  {path}  ") == {
        "depth": 3,
        "rate": 0.015,
        "optimizer": "sgd",
        "nested": {"a": [1, 2]},
    }


def test_empty_yaml_file_means_no_params(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("")
    assert parse_params_flag(str(path)) == {}


@pytest.mark.parametrize(
    "name, text, kind", [("list.json", "[1, 2]", "list"), ("list.yaml", "- a\n- b\n", "list")]
)
def test_fail_with_file_holding_a_list(tmp_path, name, text, kind):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UsageError) as raised:
        parse_params_flag(str(path))
    message = str(raised.value)
    assert repr(str(path)) in message
    assert f"holds a {kind}; expected a mapping" in message


@pytest.mark.parametrize("name", ["missing.json", "missing.yaml", "missing.yml"])
def test_fail_with_unreadable_file(tmp_path, name):
    path = str(tmp_path / "nowhere" / name)
    with pytest.raises(UsageError) as raised:
        parse_params_flag(path)
    message = str(raised.value)
    assert f"--params file {path!r} cannot be read" in message
    assert "No such file or directory" in message


def test_fail_with_directory_named_like_a_file(tmp_path):
    path = tmp_path / "dir.json"
    path.mkdir()
    with pytest.raises(UsageError, match="cannot be read"):
        parse_params_flag(str(path))


@pytest.mark.parametrize(
    "name, text",
    [
        ("bad.json", '{"depth": 3,}'),
        ("bad.json", "depth: 3"),
        ("bad.yaml", "depth: [1, 2\n"),
        ("bad.yml", "a: b: c\n"),
    ],
)
def test_fail_with_invalid_file_contents(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(UsageError) as raised:
        parse_params_flag(str(path))
    assert f"--params file {str(path)!r} is not valid JSON/YAML" in str(raised.value)


# --- from_params --------------------------------------------------------------


def test_from_params_defaults_and_values():
    assert from_params(Hparams, {}, "net") == Hparams()
    built = from_params(Hparams, {"depth": 5, "name": "big", "flag": True}, "net")
    assert built == Hparams(depth=5, name="big", flag=True)


def test_fail_with_unknown_key_lists_valid_fields():
    with pytest.raises(UsageError) as raised:
        from_params(Hparams, {"dept": 3, "rte": 0.1}, "mynet")
    message = str(raised.value)
    assert "Unknown parameter(s) dept, rte for mynet" in message
    assert "it accepts depth, flag, name, note, rate, seed" in message


def test_input_keys_are_ignored():
    params = {key: object() for key in SHARED_KEYS}
    assert {"batch_size", "data_dir", "seed", "shuffle_buffer", "columns"} <= SHARED_KEYS
    # `seed` is also a field of Hparams, so it is validated and taken.
    params["seed"] = 7
    assert from_params(Hparams, params, "net") == Hparams(seed=7)


def test_non_strict_ignores_unknown_keys():
    built = from_params(Hparams, {"depth": 4, "learning_rate": 0.3}, "input", strict=False)
    assert built == Hparams(depth=4)


def test_non_strict_still_checks_types_of_own_fields():
    with pytest.raises(UsageError, match="depth='4'"):
        from_params(Hparams, {"depth": "4", "other": 1}, "input", strict=False)


@pytest.mark.parametrize(
    "name, value, type_name, expected",
    [
        ("rate", "0.1", "str", "float"),
        ("rate", True, "bool", "float"),
        ("depth", True, "bool", "int"),
        ("depth", 2.0, "float", "int"),
        ("name", 3, "int", "str"),
        ("flag", 1, "int", "bool"),
    ],
)
def test_fail_with_wrong_type(name, value, type_name, expected):
    with pytest.raises(UsageError) as raised:
        from_params(Hparams, {name: value}, "mynet")
    assert str(raised.value) == (
        f"Parameter {name}={value!r} for mynet has type {type_name}; expected {expected}."
    )


@pytest.mark.parametrize(
    "name, value, type_name, inner",
    [("seed", "1", "str", "int"), ("note", 5, "int", "str")],
)
def test_fail_with_wrong_type_for_optional_names_the_inner_type(name, value, type_name, inner):
    with pytest.raises(UsageError) as raised:
        from_params(Hparams, {name: value}, "mynet")
    message = str(raised.value)
    assert f"Parameter {name}={value!r} for mynet has type {type_name}; expected " in message
    # The user must learn which type to pass: "expected Optional." does not say.
    expected = message.split("; expected ", 1)[1]
    assert inner in expected


def test_int_for_float_field_is_converted():
    built = from_params(Hparams, {"rate": 1}, "net")
    assert built.rate == 1.0
    assert type(built.rate) is float


@dataclasses.dataclass(frozen=True)
class OptionalRate:
    rate: Optional[float] = None


def test_int_for_optional_float_field_is_converted():
    # Like a plain float field, an Optional[float] given an int gets a float.
    built = from_params(OptionalRate, {"rate": 2}, "net")
    assert built.rate == 2.0
    assert type(built.rate) is float


def test_optional_float_field_accepts_none_and_float():
    assert from_params(OptionalRate, {"rate": None}, "net").rate is None
    assert from_params(OptionalRate, {"rate": 0.5}, "net").rate == 0.5


@pytest.mark.parametrize("name", ["note", "seed"])
def test_optional_fields_accept_none(name):
    assert getattr(from_params(Hparams, {name: None}, "net"), name) is None


def test_optional_fields_accept_their_type():
    built = from_params(Hparams, {"note": "hello", "seed": 3}, "net")
    assert (built.note, built.seed) == ("hello", 3)


def test_fail_with_none_for_required_type():
    with pytest.raises(UsageError, match="has type NoneType"):
        from_params(Hparams, {"depth": None}, "net")


def test_post_init_value_error_becomes_usage_error():
    with pytest.raises(UsageError) as raised:
        from_params(Hparams, {"depth": 101}, "mynet")
    assert str(raised.value) == (
        "Invalid parameters for mynet: depth must be at most 100, received 101."
    )
    assert raised.value.__cause__ is None


def test_the_shared_keys_are_exactly_the_fields_of_the_classes_they_name():
    # One list, read by every model function without importing the inputs; held here to
    # the parameter classes it stands for.
    from input_fns import REGISTERED
    from model_fns.learning_rates import EpochParams

    def names(cls):
        return {field.name for field in dataclasses.fields(cls)}

    inputs = set().union(*(names(entry.parameters) for entry in REGISTERED.values()))
    assert params_lib.INPUT_KEYS == inputs
    assert params_lib.EPOCH_KEYS == names(EpochParams)


@pytest.mark.multiprocess
def test_checking_params_needs_no_import_of_the_libraries():
    code = (
        "import sys\n"
        "from estimator_dist.base.params import SHARED_KEYS\n"
        "assert 'resize' in SHARED_KEYS\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('input_fns', 'model_fns')]\n"
        "assert not loaded, loaded\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=procs.REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
