"""Sharded `input_fn(mode, input_context, params)` functions, by name.

`INPUT_FNS.get(name)` returns an Estimator input function; the name may
also be `package.module:function`. `prepare_input(name, params)` writes the
data of inputs that can be generated offline (the embedded `digits`) and
checks the others are present, before any worker starts.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from estimator_dist.registry import Registry
from input_fns import digits, tfds_input

INPUT_FNS = Registry("input_fn", {"digits": digits.input_fn, "mnist": tfds_input.mnist})

_PREPARE: Mapping[str, Callable[[Mapping[str, Any]], object]] = {
    "digits": digits.prepare,
    "mnist": lambda params: tfds_input.get_prepared_builder("mnist", params.get("data_dir")),
}


def prepare_input(name: str, params: Mapping[str, Any]) -> None:
    """Prepares or checks the data of input `name`; a no-op for user inputs.

    Raises:
      DatasetNotFoundError: if the data is missing and cannot be generated.
    """
    if name in _PREPARE:
        _PREPARE[name](params)


__all__ = ["INPUT_FNS", "prepare_input"]
