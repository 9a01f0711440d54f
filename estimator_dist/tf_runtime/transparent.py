"""Wrappers that TensorFlow cannot tell from the user's function.

The package hands TensorFlow its own function in place of a user's in a few
places (an input_fn whose result it adjusts, above all). TensorFlow decides
how to call a function by reading its argument names
(`function_utils.fn_args`, through `tf_inspect`), and so do its subclasses:
`Estimator` passes `params`, `config`, `mode` and `input_context` only to an
input_fn that declares them, and `TPUEstimator` refuses one without
`params`. A plain wrapper (`def wrapper(*args, **kwargs)`, or one with a
fixed signature of its own) reads differently, and changes what TensorFlow
passes or refuses.

`wrap_like(target, wrapper)` marks `wrapper` as a TensorFlow decorator of
`target` (`tf_decorator.make_decorator`), the mechanism TensorFlow's own
decorators use: `tf_inspect` then reads the target's arguments, and Python's
`inspect.signature` follows `__wrapped__` to it. Name, qualified name,
module, docstring and attributes are the target's. A callable object is
presented as its bound `__call__`, which is how `fn_args` reads one; a
`functools.partial` by the arguments Python's `inspect.signature` leaves it
(`tf_inspect` would count the `self` of a callable object inside it).
Checked on TensorFlow 2.15: `tests/estimator_dist/tf_runtime/transparent_test.py`
compares `fn_args` and `inspect.signature` of the wrapper and of the target
for functions, bound methods, static and class methods, callable objects,
lambdas and `functools.partial` objects.

>>> def input_fn(params, mode):
...     return params["batch_size"], mode
>>> wrapper = wrap_like(input_fn, lambda **kwargs: input_fn(**kwargs))
>>> from tensorflow.python.util import function_utils
>>> function_utils.fn_args(wrapper), wrapper.__name__
(('params', 'mode'), 'input_fn')
"""

from __future__ import annotations

import functools
import inspect
from typing import Callable

from tensorflow.python.util import function_utils, tf_decorator


def wrap_like(target: Callable, wrapper: Callable) -> Callable:
    """Returns `wrapper`, presented to TensorFlow and `inspect` as `target`.

    Args:
      target: The user's callable (function, method, callable object, partial).
      wrapper: A function that takes whatever `target` takes and calls it.

    Returns:
      `wrapper` itself, changed in place, whose `__wrapped__` is `target` (or
      its `__call__`, for a callable object).
    """
    if isinstance(target, functools.partial):
        spec = _full_arg_spec(inspect.signature(target))
        return tf_decorator.make_decorator(target, wrapper, "estimator_dist", "", spec)
    shown = target
    if function_utils._is_callable_object(target):
        shown = target.__call__  # fn_args reads a callable object's bound __call__.
    return tf_decorator.make_decorator(shown, wrapper, decorator_name="estimator_dist")


def _full_arg_spec(signature: inspect.Signature) -> inspect.FullArgSpec:
    """`signature` as the `FullArgSpec` that `tf_inspect.getfullargspec` returns."""
    kinds = inspect.Parameter
    parameters = list(signature.parameters.values())
    positional = [
        p for p in parameters if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD)
    ]
    defaults = tuple(p.default for p in positional if p.default is not p.empty)
    keyword_only = [p for p in parameters if p.kind == kinds.KEYWORD_ONLY]
    return inspect.FullArgSpec(
        args=[p.name for p in positional],
        varargs=next((p.name for p in parameters if p.kind == kinds.VAR_POSITIONAL), None),
        varkw=next((p.name for p in parameters if p.kind == kinds.VAR_KEYWORD), None),
        defaults=defaults or None,
        kwonlyargs=[p.name for p in keyword_only],
        kwonlydefaults={p.name: p.default for p in keyword_only if p.default is not p.empty}
        or None,
        annotations={},
    )
