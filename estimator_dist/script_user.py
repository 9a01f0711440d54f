"""A legacy program's own code, as a task sees it: where it is, what its failures mean.

And the entry points wrapped while it runs (`swap`, `holders_of`, `routed`,
`rmtrees`, `given_model_dir`), for `estimator_dist.script_task`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import sysconfig
import traceback
from typing import Any, Callable, List, Optional, Sequence, Tuple

from absl import logging

from estimator_dist.base.errors import Error, UserCodeError


def own_dirs() -> Tuple[str, ...]:
    """The directories of this package's code."""
    here = os.path.dirname(os.path.realpath(__file__))
    return here, os.path.join(os.path.dirname(here), "run_config")


def is_users(filename: str) -> bool:
    """Whether `filename` is user code: not Python's, not an installed package's, not ours."""
    paths = sysconfig.get_paths()
    others = tuple(os.path.realpath(p) for p in (paths["stdlib"], paths["purelib"]))
    real = os.path.realpath(filename)
    return not filename.startswith("<") and not real.startswith((*others, *own_dirs()))


def shown(path: str) -> str:
    """`path` relative to the current directory when it is below it, else absolute."""
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative


def user_frame(frames: Sequence[traceback.FrameSummary]) -> str:
    """`file:line: ` of the innermost frame of user code in `frames`, or ''."""
    for frame in reversed(frames):
        if is_users(frame.filename):
            return f"{shown(frame.filename)}:{frame.lineno}: "
    return ""


def user_code_error(error: BaseException, script: str) -> UserCodeError:
    """Explains an exception that the script, its model_fn or its input_fn raised (exit 5).

    Args:
      error: The exception, with its traceback.
      script: The script's path.
    """
    frames = traceback.extract_tb(error.__traceback__)
    users = [frame for frame in frames if is_users(frame.filename)]
    where = f" in {users[-1].name}() at {user_frame(users).rstrip(': ')}" if users else ""
    return UserCodeError(
        f"the script {shown(script)} raised {type(error).__name__}: {error}{where}. "
        "The traceback is in the log above. It would raise again on every task and after "
        "every restart, so the job stops: fix the code and run again."
    )


def explained(error: BaseException, script: str) -> BaseException:
    """What a failure ends the task with; the traceback of user code is printed first.

    An exception raised by this package's own code (its innermost frame is
    ours) is not the user's: it stays as it is, and ends the task with exit 1.
    """
    import tensorflow as tf

    frames = traceback.extract_tb(error.__traceback__)
    ours = bool(frames) and os.path.realpath(frames[-1].filename).startswith(own_dirs())
    if isinstance(error, (Error, tf.errors.OpError)) or ours:
        return error
    traceback.print_exception(type(error), error, error.__traceback__)
    return user_code_error(error, script)


def swap(stack: contextlib.ExitStack, owner: Any, name: str, value: Any) -> None:
    """Sets `owner.name` to `value` until `stack` closes."""
    previous = getattr(owner, name)
    setattr(owner, name, value)
    stack.callback(setattr, owner, name, previous)


def holders_of(function: Callable) -> List[Any]:
    """Every module object through which a script can reach `function` by its name.

    `tf.estimator` and `tf.compat.v1.estimator` are lazy loaders that copy the
    module's names into themselves when first used, so they are patched as
    well as the modules behind them.
    """
    import tensorflow as tf

    holders = [tf.estimator, tf.compat.v1.estimator, tf.compat.v2.estimator]
    name = function.__name__
    for holder in holders:
        getattr(holder, name)  # Loads a lazy module, which copies its names in.
    holders += [
        module
        for module_name, module in list(sys.modules.items())
        if module_name.startswith("tensorflow") and getattr(module, name, None) is function
    ]
    unique = {id(holder): holder for holder in holders}
    return [holder for holder in unique.values() if getattr(holder, name) is function]


def given_model_dir(init: Callable, given: Optional[str]) -> Callable:
    """Wraps `Estimator.__init__`: an estimator given no model_dir gets `given` (--model_dir).

    Without one, Estimator makes a temporary directory of its own on every
    task, and the tasks would share no checkpoint.
    """
    import inspect

    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(estimator: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(estimator, *args, **kwargs)
        config = bound.arguments.get("config")
        unset = bound.arguments.get("model_dir") is None
        if given and unset and getattr(config, "model_dir", None) is None:
            logging.info("estimator_dist: an Estimator given no model_dir uses %s.", given)
            bound.arguments["model_dir"] = given
        init(*bound.args, **bound.kwargs)

    return __init__


def rmtrees() -> List[Tuple[Any, str]]:
    """The recursive deletes a program may call, as (module, attribute name)."""
    import shutil

    import tensorflow as tf

    return [(shutil, "rmtree"), (tf.io.gfile, "rmtree"), (tf.compat.v1.gfile, "DeleteRecursively")]


def routed(function: Callable, handler: Callable) -> Callable:
    """`function`, whose calls become `handler(function, *args, **kwargs)`."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return handler(function, *args, **kwargs)

    return wrapper
