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
`functools.partial` by the arguments `fn_args` reads from it (`tf_inspect`
alone would count the `self` of a callable object inside it, and Python's
`inspect` makes keyword-only every argument after one bound by keyword).
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
from typing import Callable, Tuple

from tensorflow.python.util import function_utils, tf_decorator


def fn_args(fn: Callable) -> Tuple[str, ...]:
    """The argument names TensorFlow reads from `fn` to decide what to pass it.

    >>> fn_args(lambda mode, params=None: None)
    ('mode', 'params')
    """
    return function_utils.fn_args(fn)


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
        spec = _full_arg_spec(target)
        return tf_decorator.make_decorator(target, wrapper, "estimator_dist", "", spec)
    shown = target
    if function_utils._is_callable_object(target):
        shown = target.__call__  # fn_args reads a callable object's bound __call__.
    return tf_decorator.make_decorator(shown, wrapper, decorator_name="estimator_dist")


def _full_arg_spec(partial: functools.partial) -> inspect.FullArgSpec:
    """The `FullArgSpec` whose arguments are those `fn_args` reads from `partial`.

    Python's `inspect.signature` makes every argument after one bound by
    keyword keyword-only, where `fn_args` still counts it.
    """
    return inspect.FullArgSpec(
        args=list(function_utils.fn_args(partial)),
        varargs=None,
        varkw=None,
        defaults=None,
        kwonlyargs=[],
        kwonlydefaults=None,
        annotations={},
    )
