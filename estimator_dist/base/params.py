"""Hyper-parameters: parse `--params`, and build validated parameter objects.

Estimator hands one `params` dict to both `model_fn` and `input_fn`. The
driver fills it with the job's settings (`batch_size`, `learning_rate`,
`data_dir`, `seed`) and the user's `--params`; each model or input function
turns it into its own frozen dataclass with `from_params`, which rejects
misspelt keys and wrong types instead of ignoring them.

>>> parse_params_flag("depth=20,optimizer=momentum,label_smoothing=0.1")
{'depth': 20, 'optimizer': 'momentum', 'label_smoothing': 0.1}
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from typing import Any, Mapping, Type, TypeVar

import yaml

from estimator_dist.base.errors import UsageError

#: Every field of the registered input functions' parameter classes (`input_fns.REGISTERED`,
#: which a test holds to exactly this set): the same `params` dict feeds the input_fn and
#: the model_fn, so a model function must accept them, while a misspelt key still fails.
INPUT_KEYS = frozenset(
    {
        "batch_size",
        "cache",
        "columns",
        "data_dir",
        "dataset",
        "delimiter",
        "eval_files",
        "eval_split",
        "features",
        "files",
        "header",
        "id_feature",
        "image_shape",
        "image_size",
        "label_key",
        "num_classes",
        "num_examples",
        "record_read_ids",
        "resize",
        "seed",
        "shuffle_buffer",
        "skip_bad_records",
        "split",
    }
)
#: The fields of `model_fns.learning_rates.EpochParams` (learning rates by epoch), which any
#: model function may be given.
EPOCH_KEYS = frozenset({"decay_epochs", "decay_rate", "num_train_examples"})
#: `params` key of `--gradient_accumulation_steps` (`model_fns.optimizers`).
ACCUMULATION_STEPS = "gradient_accumulation_steps"
#: `params` key of `--micro_batches` (`model_fns.optimizers`).
MICRO_BATCHES = "micro_batches"
#: `params` key of `--mixed_precision` (`model_fns.optimizers`: loss scaling for float16).
MIXED_PRECISION = "mixed_precision"
#: Keys the driver puts into every model's `params` from its own flags; model functions
#: may read or ignore them.
JOB_KEYS = frozenset({ACCUMULATION_STEPS, MICRO_BATCHES, MIXED_PRECISION})
#: The keys every model function accepts besides its own fields.
SHARED_KEYS = INPUT_KEYS | EPOCH_KEYS | JOB_KEYS

P = TypeVar("P")


def parse_params_flag(value: str) -> dict:
    """Parses `--params`: `key=value,...` or a JSON/YAML file path.

    Values are read as YAML scalars, so `3` is an int, `0.1` a float, `true`
    a bool and anything else a string.

    Args:
      value: The flag's value; empty means no parameters.

    Returns:
      The parameters as a dict.

    Raises:
      UsageError: if the file cannot be read or parsed, does not hold a
        mapping, or an item is not `key=value`.
    """
    value = value.strip()
    if not value:
        return {}
    if "=" not in value and (value.endswith((".json", ".yaml", ".yml")) or os.path.isfile(value)):
        return _load_params_file(value)
    params = {}
    for item in value.split(","):
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(
                f"--params item {item!r} is not key=value; received --params={value!r}. "
                "Write --params=key=value,key2=value2 or pass a .json/.yaml file."
            )
        try:
            params[key] = yaml.safe_load(raw.strip()) if raw.strip() else ""
        except yaml.YAMLError:
            raise UsageError(
                f"--params value {raw.strip()!r} of {key!r} is not a valid YAML scalar; "
                "quote it, or pass the parameters as a .json/.yaml file."
            ) from None
    return params


def _load_params_file(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as stream:
            text = stream.read()
    except OSError as error:
        raise UsageError(
            f"--params file {path!r} cannot be read: {error.strerror}. Pass an "
            "existing JSON or YAML file, or key=value pairs."
        ) from None
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as error:
        raise UsageError(f"--params file {path!r} is not valid JSON/YAML: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(
            f"--params file {path!r} holds a {type(data).__name__}; expected a mapping "
            "of parameter names to values."
        )
    return data


def _accepts(hint: Any, value: Any) -> bool:
    if hint is Any:
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Union:
        return any(_accepts(option, value) for option in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(value, hint)


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Union:
        return " or ".join(_type_name(option) for option in typing.get_args(hint))
    return "None" if hint is type(None) else getattr(hint, "__name__", str(hint))


def from_params(cls: Type[P], params: Mapping[str, Any], owner: str, strict: bool = True) -> P:
    """Builds the dataclass `cls` from `params`, checking names and types.

    Model functions are strict: every key must be one of their fields or in
    `SHARED_KEYS`, so a misspelt `--params` key fails. Input functions pass
    `strict=False` and take only their own fields, since the same dict
    carries the model's hyper-parameters.

    Args:
      cls: A dataclass whose fields have defaults.
      params: The Estimator params dict.
      owner: Who reads these parameters, for messages (e.g. `mnist_cnn`).
      strict: Whether unknown keys are an error.

    Returns:
      An instance of `cls`.

    Raises:
      UsageError: for an unknown key or a value of the wrong type.
    """
    hints = typing.get_type_hints(cls)
    fields = {field.name for field in dataclasses.fields(cls)}
    unknown = sorted(set(params) - fields - SHARED_KEYS)
    if unknown and strict:
        raise UsageError(
            f"Unknown parameter(s) {', '.join(unknown)} for {owner}; it accepts "
            f"{', '.join(sorted(fields))}. Check --params."
        )
    values = {}
    for name in fields & set(params):
        value = params[name]
        hint = hints[name]
        if not _accepts(hint, value):
            raise UsageError(
                f"Parameter {name}={value!r} for {owner} has type {type(value).__name__}; "
                f"expected {_type_name(hint)}."
            )
        floats = hint is float or float in typing.get_args(hint)
        values[name] = float(value) if floats and isinstance(value, int) else value
    try:
        return cls(**values)
    except ValueError as error:
        raise UsageError(f"Invalid parameters for {owner}: {error}") from None
