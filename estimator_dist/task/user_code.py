"""Calls users' `model_fn`s and `input_fn`s exactly as `tf.estimator` does.

Legacy Estimator code comes in many shapes: `model_fn(features, labels, mode)`
with no `params`, `(features, labels, mode, config)`, a bound method, a
callable object or a `functools.partial`; input functions with or without
`mode`, `params`, `config` and `input_context`, returning a `tf.data.Dataset`
or a `(features, labels)` tuple of tensors (`numpy_input_fn`,
`pandas_input_fn`, hand-written TF1 code). Estimator reads the argument names
with `function_utils.fn_args` (`tf_runtime.transparent.fn_args`) and passes
each argument only when it is declared; this module does the same, everywhere
the package calls user code (the tasks, the dry run, the launcher's pre-flight,
`check`, export), and
refuses, before any task starts, what Estimator could not call, naming the
fix in the user's own names.

>>> def input_fn(features, labels, training=True, batch_size=256):
...     pass
>>> check_input_fn_args(input_fn, "iris:input_fn", "--input_fn")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
estimator_dist.base.errors.UsageError: --input_fn=iris:input_fn takes features, labels, ...
"""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Callable, List, Mapping, Optional, Tuple

import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.tf_runtime import transparent
from estimator_dist.tf_runtime.transparent import fn_args

#: Arguments Estimator passes to an input_fn that declares them.
INPUT_FN_ARGS = ("mode", "params", "config", "input_context")
#: Arguments Estimator passes to a model_fn that declares them (`self` of a method aside).
MODEL_FN_ARGS = ("features", "labels", "mode", "params", "config")
#: Batches an evaluation of a repeating input reads when --eval_steps is not set:
#: the default of `tf.estimator.EvalSpec(steps=...)`.
DEFAULT_EVAL_STEPS = 100
#: Logged once when --eval_steps is not set and an evaluation input repeats forever, or
#: returns tensors whose number nothing can read before they run out.
BOUNDED_EVAL_MESSAGE = (
    "The evaluation input {name} {why} and --eval_steps is not set: each evaluation reads at "
    "most {steps} batches, the default of tf.estimator.EvalSpec(steps=...). Pass --eval_steps "
    "to choose how many."
)


def _required_args(fn: Callable) -> List[str]:
    """Names of `fn`'s parameters that have no default and are not `*args`/`**kwargs`."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]


def describe(fn: Callable) -> str:
    """Returns `fn`'s name with its signature, for messages: `input_fn(features, labels)`."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    name = getattr(target, "__qualname__", type(target).__name__)
    try:
        return f"{name}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        return name


def _bind_fix(fn: Callable, name: str, flag: str, missing: List[str]) -> str:
    module, _, attribute = name.rpartition(":")
    short = attribute or getattr(fn, "__name__", "fn")
    bound = f"{short.replace('.', '_')}_bound"
    arguments = ", ".join(f"{arg}=..." for arg in missing)
    where = f" in {module}" if module else ""
    lambda_form = f" or `{bound} = lambda: {short}({arguments})`" if flag != "--model_fn" else ""
    return (
        f"Bind them{where} with `{bound} = functools.partial({short}, {arguments})`"
        f"{lambda_form}, then pass {flag}={module + ':' if module else ''}{bound}."
    )


def check_input_fn_args(fn: Callable, name: str, flag: str) -> None:
    """Refuses an input_fn with required arguments that Estimator cannot supply.

    Args:
      fn: The input function.
      name: How the user named it (`module:function`), for the message.
      flag: The flag that named it (`--input_fn` or `--eval_input_fn`).

    Raises:
      UsageError: naming the arguments and how to bind them.
    """
    missing = [arg for arg in _required_args(fn) if arg not in INPUT_FN_ARGS]
    if missing:
        raise UsageError(
            f"{flag}={name} takes {', '.join(missing)}, which Estimator cannot supply: it "
            f"passes an input_fn only {', '.join(INPUT_FN_ARGS)} (each when declared). "
            f"Received {describe(fn)}. {_bind_fix(fn, name, flag, missing)}"
        )


def check_model_fn_args(fn: Callable, name: str) -> None:
    """Refuses a model_fn that Estimator would refuse, with the fix.

    Raises:
      UsageError: when `features` is missing or other arguments are required.
    """
    args = fn_args(fn)
    unexpected = [arg for arg in args if arg not in (*MODEL_FN_ARGS, "self")]
    if "features" not in args:
        problem = "has no `features` argument"
        fix = "Declare model_fn(features, labels, mode, params, config), any subset with features."
    elif unexpected:
        problem = f"takes {', '.join(unexpected)}, which Estimator never passes"
        fix = _bind_fix(fn, name, "--model_fn", unexpected)
    else:
        return
    raise UsageError(
        f"--model_fn={name} {problem}: Estimator calls a model_fn with any subset of "
        f"{', '.join(MODEL_FN_ARGS)}. Received {describe(fn)}. {fix}"
    )


def takes_params(fn: Callable) -> bool:
    """Whether Estimator would pass `params` to `fn`, as `function_utils.fn_args` reads it."""
    return "params" in fn_args(fn)


def takes_input_context(input_fn: Callable) -> bool:
    """Whether the user's input_fn declares `input_context`, and so can shard itself."""
    return "input_context" in fn_args(getattr(input_fn, "user_fn", input_fn))


def present_input_fn(input_fn: Callable, params: Optional[Mapping[str, Any]] = None) -> Callable:
    """The function handed to `TrainSpec`/`EvalSpec` in place of a user's input_fn.

    TensorFlow reads the same arguments from it as from `input_fn`
    (`estimator_dist.tf_runtime.transparent`), so `Estimator`, `TPUEstimator`
    and any subclass pass it exactly what they would pass the user's function,
    and it passes that on unchanged. With `params` (a job of named functions,
    whose parameters are the job's), `params` is bound, as
    `functools.partial(input_fn, params=params)` binds it, and TensorFlow no
    longer passes its own. What the input_fn returns is made acceptable to
    Estimator in every setting:

    * a `tf.data.Dataset` loses tf.data autotuning unless its options set it,
      so that the session closes at once when training ends
      (`estimator_dist.tf_runtime.patches`, patch 3);
    * a `(features, labels)` tuple of tensors (`numpy_input_fn`,
      `pandas_input_fn`, `iterator.get_next()`) is returned as it is where no
      strategy is in scope, and under a strategy as the callable its input
      iterator takes (`InputFunctionIterator` accepts a Dataset or a function
      returning one batch), called once per replica device.

    Args:
      input_fn: A function of any subset of `mode`, `params`, `config`,
        `input_context`, as Estimator accepts it.
      params: Parameters to bind when `input_fn` declares `params`, or None
        to leave them to the Estimator.

    Returns:
      The wrapper; its `user_fn` attribute is `input_fn`.

    >>> def input_fn(params, mode):
    ...     return tf.data.Dataset.range(params["batch_size"])
    >>> fn_args(present_input_fn(input_fn))
    ('params', 'mode')
    >>> fn_args(present_input_fn(input_fn, {"batch_size": 4}))
    ('mode',)
    """
    if params is None and hasattr(input_fn, "user_fn"):
        return input_fn  # Presented already.
    target = input_fn
    if params is not None and "params" in fn_args(input_fn):
        target = functools.partial(input_fn, params=params)

    def presented(*args: Any, **kwargs: Any) -> Any:
        result = target(*args, **kwargs)
        if isinstance(result, tf.data.Dataset) or not tf.distribute.has_strategy():
            return without_autotune(result)
        pending = [result]

        def next_batch() -> Any:
            return pending.pop() if pending else target(*args, **kwargs)

        return next_batch

    wrapper = transparent.wrap_like(target, presented)
    wrapper.user_fn = input_fn
    return wrapper


def call_input_fn(
    input_fn: Callable,
    mode: str,
    params: Optional[Mapping[str, Any]] = None,
    config: Optional[tf.estimator.RunConfig] = None,
    input_context: Optional[tf.distribute.InputContext] = None,
) -> Any:
    """Calls `input_fn` as `Estimator` calls it: each argument only when it is declared.

    For the package's own reads of an input outside training (the dry run,
    counting batches, predictions).

    Args:
      input_fn: A user's input_fn, or one `present_input_fn` made.
      mode: A `tf.estimator.ModeKeys` value.
      params: The estimator's params (`{}` when None).
      config: The estimator's RunConfig; a default one when None.
      input_context: The `tf.distribute.InputContext`, or None.

    Returns:
      What `input_fn` returns.
    """
    accepted = fn_args(input_fn)
    given = {
        "mode": mode,
        "params": {} if params is None else params,
        "config": config,
        "input_context": input_context,
    }
    kwargs = {name: value for name, value in given.items() if name in accepted}
    if "config" in kwargs and kwargs["config"] is None:
        kwargs["config"] = tf.estimator.RunConfig()
    return input_fn(**kwargs)


def element_spec(result: Any) -> Tuple[Any, Any]:
    """Returns the (features, labels) specs of what an input_fn returned.

    Args:
      result: A Dataset, a `(features, labels)` tuple of tensors, or features alone.
    """
    if isinstance(result, tf.data.Dataset):
        spec = result.element_spec
    else:
        spec = tf.nest.map_structure(tf.TensorSpec.from_tensor, result)
    if isinstance(spec, tuple) and len(spec) == 2:
        return spec
    return spec, None


def numpy_input_epochs(input_fn: Callable) -> Tuple[bool, Optional[int]]:
    """Reads `num_epochs` of a `numpy_input_fn`/`pandas_input_fn` function.

    Returns:
      (True, num_epochs) for such a function, (False, None) for any other.
    """
    fn = getattr(input_fn, "user_fn", input_fn)
    if isinstance(fn, functools.partial):
        fn = fn.func
    qualname = getattr(fn, "__qualname__", "")
    if qualname not in ("numpy_input_fn.<locals>.input_fn", "pandas_input_fn.<locals>.input_fn"):
        return False, None
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    return True, cells["num_epochs"].cell_contents if "num_epochs" in cells else None


def repeats_forever(input_fn: Callable, result: Any) -> Optional[bool]:
    """Whether an evaluation input never ends: True, False, or None when unknown.

    Args:
      input_fn: The input function (its `numpy_input_fn` settings are read).
      result: What it returned in a scratch graph.
    """
    is_numpy, epochs = numpy_input_epochs(input_fn)
    if is_numpy:
        return epochs is None
    if not isinstance(result, tf.data.Dataset):
        return None
    cardinality = tf.data.experimental.cardinality(result)
    with tf.compat.v1.Session() as session:
        value = session.run(cardinality)
    if value == tf.data.experimental.INFINITE_CARDINALITY:
        return True
    if value == tf.data.experimental.UNKNOWN_CARDINALITY:
        return None
    return False


def without_autotune(dataset: Any) -> Any:
    """`dataset` without tf.data autotuning, unless its options set it; other values unchanged.

    An autotuned iterator's model thread can sleep out up to a minute after
    its iterator is destroyed (TensorFlow 2.15), which kept jobs idle after
    their final checkpoint (see `estimator_dist.tf_runtime.patches`, patch 3).
    `tf.data.AUTOTUNE` parallelism then means every core the task may use,
    and prefetch buffers still adapt (that tuning needs no model thread).

    Args:
      dataset: What an input_fn returned: a `tf.data.Dataset`, or anything
        else Estimator accepts (a `(features, labels)` tuple), returned as is.

    >>> without_autotune(tf.data.Dataset.range(3)).options().autotune.enabled
    False
    """
    if not isinstance(dataset, tf.data.Dataset):
        return dataset
    with warnings.catch_warnings():
        # In graph mode (Estimator's), `options()` warns that it returns only
        # the options set in Python: exactly the ones this needs to see.
        warnings.filterwarnings("ignore", "To make it possible to preserve tf.data options")
        chosen = dataset.options().autotune.enabled
    if chosen is not None:
        return dataset
    options = tf.data.Options()
    options.autotune.enabled = False
    return dataset.with_options(options)
