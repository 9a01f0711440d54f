"""Feature specs: which named, typed and shaped values a record holds.

The TFRecord reader (`features`), the CSV reader (`columns`) and the
`convert` command share one small grammar, so a spec fits on a command line:

  name:dtype[:shape];name:dtype[:shape];...

`dtype` is one of `int64`, `float32`, `string` or `uint8`; `shape` is
empty (a scalar) or dimensions joined by `x`, such as `28x28x1`. In a
TFRecord, `uint8` is one bytes value holding the raw pixels (what
`python -m input_fns.convert` writes); in a CSV, every feature takes as many
consecutive columns as its shape has elements. A JSON/YAML `--params` file
may give the spec as a mapping `{name: "dtype[:shape]"}` instead.

>>> [str(spec) for spec in parse_specs("image:uint8:28x28x1;label:int64", "features")]
['image:uint8:28x28x1', 'label:int64']
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Mapping, Optional, Tuple, Union

import tensorflow as tf

#: The dtypes a spec may name, with the TensorFlow dtype each decodes to.
DTYPES: Mapping[str, tf.dtypes.DType] = {
    "int64": tf.int64,
    "float32": tf.float32,
    "string": tf.string,
    "uint8": tf.uint8,
}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")
_SHAPE = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*)*$")

SpecInput = Union[str, Mapping[str, str]]


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
    """One named value of a record.

    Attributes:
      name: Feature or column name.
      dtype: A key of `DTYPES`.
      shape: Dimensions; `()` for a scalar.
    """

    name: str
    dtype: str
    shape: Tuple[int, ...] = ()

    @property
    def size(self) -> int:
        """Number of scalar values: CSV columns, or TFRecord values (bytes for uint8)."""
        return math.prod(self.shape)

    @property
    def tf_dtype(self) -> tf.dtypes.DType:
        """The TensorFlow dtype of the decoded value."""
        return DTYPES[self.dtype]

    def __str__(self) -> str:
        shape = "x".join(str(dim) for dim in self.shape)
        return f"{self.name}:{self.dtype}:{shape}" if shape else f"{self.name}:{self.dtype}"


def _parse_one(name: str, text: str, owner: str, source: str) -> FeatureSpec:
    if not _NAME.match(name):
        raise ValueError(
            f"{owner}: feature name {name!r} in {source!r} is not valid; use letters, digits "
            "and _ . / -, starting with a letter or _."
        )
    dtype, _, shape_text = text.partition(":")
    if dtype not in DTYPES:
        raise ValueError(
            f"{owner}: feature {name!r} has dtype {dtype!r} in {source!r}; expected one of "
            f"{', '.join(DTYPES)}."
        )
    if shape_text and not _SHAPE.match(shape_text):
        raise ValueError(
            f"{owner}: feature {name!r} has shape {shape_text!r} in {source!r}; expected "
            "positive dimensions joined by 'x', such as 28x28x1, or nothing for a scalar."
        )
    shape = tuple(int(dim) for dim in shape_text.split("x")) if shape_text else ()
    if dtype == "string" and shape:
        raise ValueError(
            f"{owner}: feature {name!r} is a string with shape {shape_text!r}; string "
            "features are scalars."
        )
    return FeatureSpec(name, dtype, shape)


def parse_specs(spec: SpecInput, owner: str) -> Tuple[FeatureSpec, ...]:
    """Parses a feature spec string or mapping.

    Args:
      spec: `"name:dtype[:shape];..."` or a mapping `{name: "dtype[:shape]"}`.
      owner: The parameter being parsed, for messages (e.g. `features`).

    Returns:
      The features, in the order given.

    Raises:
      ValueError: for an empty spec, a bad item, a repeated name, or an
        unknown dtype or bad shape.
      TypeError: if `spec` is neither a string nor a mapping of strings.
    """
    if isinstance(spec, str):
        items = [item.strip() for item in spec.split(";") if item.strip()]
        pairs = []
        for item in items:
            name, sep, rest = item.partition(":")
            if not sep:
                raise ValueError(
                    f"{owner}: item {item!r} of {spec!r} is not name:dtype[:shape], such "
                    "as label:int64 or image:uint8:28x28x1."
                )
            pairs.append((name.strip(), rest.strip()))
    elif isinstance(spec, Mapping):
        pairs = []
        for name, text in spec.items():
            if not isinstance(text, str):
                raise TypeError(
                    f"{owner}: feature {name!r} maps to {text!r}; expected a string "
                    "'dtype[:shape]', such as 'uint8:28x28x1'."
                )
            pairs.append((str(name), text.strip()))
    else:
        raise TypeError(
            f"{owner} is a {type(spec).__name__}; expected 'name:dtype[:shape];...' or a "
            "mapping of names to 'dtype[:shape]'."
        )
    if not pairs:
        raise ValueError(
            f"{owner} is empty; expected 'name:dtype[:shape];...', such as "
            "'image:uint8:28x28x1;label:int64'."
        )
    specs = tuple(_parse_one(name, text, owner, str(spec)) for name, text in pairs)
    names = [item.name for item in specs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"{owner} names {', '.join(repeated)} more than once: {spec!r}.")
    return specs


def format_specs(specs: Tuple[FeatureSpec, ...]) -> str:
    """Returns the string form of `specs`, which `parse_specs` reads back."""
    return ";".join(str(spec) for spec in specs)


def find_spec(specs: Tuple[FeatureSpec, ...], name: str) -> Optional[FeatureSpec]:
    """Returns the spec named `name`, or None."""
    return next((spec for spec in specs if spec.name == name), None)


def parse_spec_param(spec: SpecInput, param: str) -> Tuple[FeatureSpec, ...]:
    """`parse_specs` of the parameter `param`, for a params dataclass.

    Raises:
      ValueError: for any malformed spec, a wrong type included, so that
        `from_params` reports it as a bad parameter.
    """
    try:
        return parse_specs(spec, param)
    except TypeError as error:
        raise ValueError(str(error)) from None


def check_keys(specs: Tuple[FeatureSpec, ...], param: str, **keys: Optional[str]) -> None:
    """Checks that every key given, such as `label_key="label"`, names a feature of `specs`.

    Raises:
      ValueError: for a key that is not None and is not in `specs`.
    """
    for role, key in keys.items():
        if key is not None and find_spec(specs, key) is None:
            raise ValueError(
                f"{role}={key!r} is not in {param} {format_specs(specs)!r}; add it to "
                f"the spec or set {role} to one of its names."
            )
