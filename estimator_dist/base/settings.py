"""Settings: dataclass fields that carry their command-line flag, each written once.

A frozen config class declares every setting once, as a field made with
`setting()`: its default, its help, and what its flag needs beyond those (a
name of its own, enum values, a lower bound, how the flag's text becomes the
field's value). From the fields:

* `define_flags(cls, flag_values, module_name)` defines one absl flag per setting, the
  settings of nested config classes included, in field order;
* `from_flags(cls, flag_values)` builds the config from parsed flags, and
  `to_args(config)` the command line that gives it to another process;
* `check_bounds(config)`, called in `__post_init__`, refuses a value below a
  setting's lower bound, so a config built in code obeys the flag's bound too.

No TensorFlow here: command-line programs define their flags without it.

>>> @dataclasses.dataclass(frozen=True)
... class Options:
...     steps: int = setting(10, "Steps to run.", lower_bound=1)
>>> flag_values = flags.FlagValues()
>>> define_flags(Options, flag_values, "doc")
>>> _ = flag_values(["program", "--steps=3"])
>>> from_flags(Options, flag_values)
Options(steps=3)
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from absl import flags

from estimator_dist.base.errors import UsageError

#: The key of a field's metadata that holds its `Flag`.
METADATA_KEY = "flag"
_KINDS = ("string", "integer", "float", "boolean", "enum", "list", "multi_string")
_SAME = object()


@dataclasses.dataclass(frozen=True)
class Flag:
    """How a setting is given on the command line.

    Attributes:
      help: The flag's help, as `--helpfull` and docs/flags.md show it.
      kind: `string`, `integer`, `float`, `boolean`, `enum`, `list` (comma-separated)
        or `multi_string` (the flag repeated).
      default: The flag's default (the field's, unless the two differ).
      name: The flag's name; the field's when empty.
      enum: The values of an `enum` flag, accepted in any case.
      lower_bound: The least value of the flag and of the field (None: any).
      required: Whether the flag must be given.
      convert: Turns the parsed flag's value into the field's; None keeps it
        (a `list` or `multi_string` becomes a tuple first).
    """

    help: str
    kind: str
    default: Any
    name: str = ""
    enum: Tuple[str, ...] = ()
    lower_bound: Optional[float] = None
    required: bool = False
    convert: Optional[Callable[[Any], Any]] = None


def setting(
    default: Any,
    help: str,
    *,
    kind: str = "",
    flag: str = "",
    flag_default: Any = _SAME,
    enum: Tuple[str, ...] = (),
    lower_bound: Optional[float] = None,
    required: bool = False,
    convert: Optional[Callable[[Any], Any]] = None,
    default_factory: Optional[Callable[[], Any]] = None,
) -> Any:
    """A dataclass field that is also a command-line flag.

    Args:
      default: The field's default.
      help: The flag's help.
      kind: The flag's type; by default `enum` with `enum`, else read from
        the default's type (needed when the default is None).
      flag: The flag's name, when it is not the field's.
      flag_default: The flag's default, when it is not the field's.
      enum: The values of an enum flag.
      lower_bound: The least value of the flag and of the field.
      required: Whether the flag must be given.
      convert: Turns the parsed flag's value into the field's.
      default_factory: Makes the field's default instead of `default` (a dict).

    Returns:
      A `dataclasses.field` carrying a `Flag` in its metadata.

    Raises:
      TypeError: if the flag's type can be neither read nor is given.
    """
    shown = default if flag_default is _SAME else flag_default
    if not kind:
        kind = "enum" if enum else _kind_of(shown)
    if kind not in _KINDS:
        raise TypeError(f"flag kind {kind!r} of --{flag or '?'}; expected one of {_KINDS}.")
    if isinstance(shown, tuple):
        shown = list(shown) if kind == "multi_string" else ",".join(shown)
    spec = Flag(help, kind, shown, flag, tuple(enum), lower_bound, required, convert)
    metadata = {METADATA_KEY: spec}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def none_for_zero(value: Optional[float]) -> Optional[float]:
    """A `convert` for a flag whose 0 means none: 0 (or None) becomes None.

    >>> none_for_zero(0), none_for_zero(2.5)
    (None, 2.5)
    """
    return value or None


def _kind_of(default: Any) -> str:
    kinds = {bool: "boolean", int: "integer", float: "float", str: "string", tuple: "list"}
    kind = kinds.get(type(default))
    if kind is None:
        raise TypeError(f"give kind= for a setting whose default is {default!r}.")
    return kind


def _fields(cls: type) -> Iterator[Tuple[dataclasses.Field, Optional[Flag], Optional[type]]]:
    """Each field of `cls`, with its `Flag` or, for a nested config class, that class."""
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        spec = field.metadata.get(METADATA_KEY)
        nested = hints[field.name]
        yield field, spec, nested if spec is None and dataclasses.is_dataclass(nested) else None


def flag_name(field: dataclasses.Field) -> str:
    """The flag name of a setting's field."""
    return field.metadata[METADATA_KEY].name or field.name


def flag_names(cls: type) -> Tuple[str, ...]:
    """The flags of `cls`'s settings (nested config classes' included), in field order."""
    names = []
    for field, spec, nested in _fields(cls):
        if nested is not None:
            names.extend(flag_names(nested))
        elif spec is not None:
            names.append(flag_name(field))
    return tuple(names)


def define_flags(
    cls: type,
    flag_values: flags.FlagValues,
    module_name: str,
    helps: Optional[Mapping[str, str]] = None,
) -> None:
    """Defines a flag for every setting of `cls` and of the config classes it nests.

    Args:
      cls: A dataclass whose settings are made with `setting()`.
      flag_values: Where to define them.
      module_name: The module the flags are listed under (`--helpfull`,
        docs/flags.md), usually the caller's `__name__`.
      helps: Help texts replacing the settings' own, by flag name, for a
        program where a flag means something narrower.
    """
    for field, spec, nested in _fields(cls):
        if nested is not None:
            define_flags(nested, flag_values, module_name, helps)
        if spec is None:
            continue
        name = flag_name(field)
        text = (helps or {}).get(name) or spec.help
        common = dict(flag_values=flag_values, module_name=module_name)
        if spec.kind == "enum":
            flags.DEFINE_enum(name, spec.default, spec.enum, text, case_sensitive=False, **common)
        elif spec.kind in ("integer", "float"):
            define = flags.DEFINE_integer if spec.kind == "integer" else flags.DEFINE_float
            define(name, spec.default, text, lower_bound=spec.lower_bound, **common)
        else:
            define = {
                "string": flags.DEFINE_string,
                "boolean": flags.DEFINE_boolean,
                "list": flags.DEFINE_list,
                "multi_string": flags.DEFINE_multi_string,
            }[spec.kind]
            define(name, spec.default, text, **common)
        if spec.required:
            flags.mark_flag_as_required(name, flag_values=flag_values)


def from_flags(
    cls: type,
    flag_values: flags.FlagValues,
    given: Optional[Mapping[str, Any]] = None,
    **fields: Any,
) -> Any:
    """Builds `cls` (and the config classes it nests) from parsed flags.

    Args:
      cls: A dataclass whose settings are made with `setting()`.
      flag_values: Parsed flags defined by `define_flags(cls, ...)`.
      given: Field values by flag name, used instead of the flags' own (the
        values another mapping already decided, such as Model Garden's).
      **fields: Values of `cls`'s fields that have no flag.

    Returns:
      The config; its `__post_init__` validates it.
    """
    given = given or {}
    values: Dict[str, Any] = dict(fields)
    for field, spec, nested in _fields(cls):
        if nested is not None:
            values[field.name] = from_flags(nested, flag_values, given)
        elif spec is not None:
            name = flag_name(field)
            values[field.name] = given[name] if name in given else _value(spec, flag_values[name])
    return cls(**values)


def _value(spec: Flag, flag: flags.Flag) -> Any:
    value = flag.value
    if spec.kind in ("list", "multi_string"):
        value = tuple(value or ())
    return value if spec.convert is None else spec.convert(value)


def to_args(config: Any) -> List[str]:
    """The command line that gives `config`'s settings, nested configs' included, in field order.

    A None value is left out, so its flag's default, which makes None, applies.

    >>> @dataclasses.dataclass(frozen=True)
    ... class Options:
    ...     steps: int = setting(10, "Steps to run.")
    ...     fast: bool = setting(False, "Run fast.")
    >>> to_args(Options())
    ['--steps=10', '--fast=false']
    """
    args = []
    for field, spec, nested in _fields(type(config)):
        value = getattr(config, field.name)
        if nested is not None:
            args.extend(to_args(value))
        if spec is None or value is None:
            continue
        if spec.kind == "multi_string":
            args.extend(f"--{flag_name(field)}={item}" for item in value)
            continue
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, tuple):
            value = ",".join(value)
        args.append(f"--{flag_name(field)}={value}")
    return args


def check_bounds(config: Any) -> None:
    """Refuses a setting of `config` below its lower bound; call it in `__post_init__`.

    Raises:
      UsageError: naming the setting, the value and the bound.
    """
    hints = typing.get_type_hints(type(config))
    for field in dataclasses.fields(config):
        spec = field.metadata.get(METADATA_KEY)
        value = getattr(config, field.name)
        if spec is None or spec.lower_bound is None or value is None:
            continue
        if value < spec.lower_bound:
            optional = " or None" if type(None) in typing.get_args(hints[field.name]) else ""
            raise UsageError(
                f"{field.name} must be at least {spec.lower_bound:g}{optional}, received {value}."
            )
