"""A legacy program's own code, as a task sees it: where it is, what its failures mean.

And the entry points wrapped while it runs (`swap`, `holders_of`, `routed`,
`rmtrees`, `given_model_dir`, `keras_bridge`, `recording`), for
`estimator_dist.programs.task`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import sysconfig
import traceback
from typing import Any, Callable, List, Optional, Sequence, Set, Tuple

from absl import logging

from estimator_dist.base.errors import Error, UserCodeError


def own_dirs() -> Tuple[str, ...]:
    """The directories of this package's code."""
    here = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
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


#: Why code that needs eager execution fails in a program run by `estimator_dist.script`.
GRAPH_MODE = (
    "Programs run in graph mode here (eager execution is turned off before the program "
    "starts: TensorFlow's evaluator and the cluster's collectives need it), so code outside "
    "the Estimator that needs eager execution, such as a loop printing a batch of the input, "
    "fails: remove it, or run it only when TF_CONFIG is not set."
)


def user_code_error(error: BaseException, script: str) -> UserCodeError:
    """Explains an exception that the script, its model_fn or its input_fn raised (exit 5).

    Args:
      error: The exception, with its traceback.
      script: The script's path.
    """
    frames = traceback.extract_tb(error.__traceback__)
    users = [frame for frame in frames if is_users(frame.filename)]
    where = f" in {users[-1].name}() at {user_frame(users).rstrip(': ')}" if users else ""
    hint = f" {GRAPH_MODE}" if "eager" in str(error) else ""
    return UserCodeError(
        f"the script {shown(script)} raised {type(error).__name__}: {error}{where}.{hint} "
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


def _shared(arguments: dict, given: Optional[str], temporary: Set[str], what: str) -> Optional[str]:
    """Gives `arguments` (`model_dir`, `config`) `given` where their model_dir is not shared.

    That is no model_dir (a temporary one would be made) or a temporary
    directory the program made (`tempfile.mkdtemp()`, recorded in
    `temporary`): either way one per task, sharing no checkpoint. Returns the
    model_dir the call will use, or None when it is left to the call.
    """
    config = arguments.get("config")
    own, configured = arguments.get("model_dir"), getattr(config, "model_dir", None)

    def unshared(path: Optional[str]) -> bool:
        return path is None or os.path.abspath(path) in temporary

    if not given or not (unshared(own) and unshared(configured)):
        return own or configured
    made = own or configured
    logging.info(
        "estimator_dist: %s given %s uses --model_dir=%s, which every task shares.",
        what,
        f"the temporary directory {made} the program made" if made else "no model_dir",
        given,
    )
    arguments["model_dir"] = given
    if configured is not None:
        arguments["config"] = config.replace(model_dir=given)
    return given


def given_model_dir(init: Callable, given: Optional[str], temporary: Set[str]) -> Callable:
    """Wraps `Estimator.__init__`: `given` (--model_dir) for a model_dir that is not shared.

    Args:
      init: `Estimator.__init__`.
      given: --model_dir, or None to leave every estimator as built.
      temporary: The directories the program made with `tempfile.mkdtemp()`.

    Returns:
      The wrapper, to put in place of `Estimator.__init__`.
    """
    import inspect

    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(estimator: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(estimator, *args, **kwargs)
        _shared(bound.arguments, given, temporary, "an Estimator")
        init(*bound.args, **bound.kwargs)

    return __init__


def keras_bridge(
    model_to_estimator: Callable, given: Optional[str], temporary: Set[str]
) -> Callable:
    """Wraps `model_to_estimator` for a task of a cluster, as `estimator_dist.train` calls it.

    It writes the Keras model's weights to `model_dir/keras` on every task, for
    the estimator to start from, so the model_dir must be the shared one, and
    the tasks take turns (the first writes, the others find it); every
    training task starts from them, as a chief does (TensorFlow's bridge
    warm-starts on the chief alone, and the tasks then initialise their
    variables with different collectives and hang creating the session); and
    the "saver" checkpoint format, since the object-based default builds its
    Saver in a replica context, where a model with batch normalization fails
    at its first step.

    Args:
      model_to_estimator: The bridge, v1 or v2.
      given: --model_dir, or None.
      temporary: The directories the program made with `tempfile.mkdtemp()`.

    Returns:
      The wrapper, to put in place of the bridge.
    """
    import inspect
    import tempfile

    import tensorflow as tf

    from estimator_dist.base import files

    signature = inspect.signature(model_to_estimator)

    @functools.wraps(model_to_estimator)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        model_dir = _shared(bound.arguments, given, temporary, "model_to_estimator")
        if bound.arguments["checkpoint_format"] != "saver":
            logging.info("estimator_dist: model_to_estimator gets checkpoint_format='saver'.")
            bound.arguments["checkpoint_format"] = "saver"
        # Only a chief's config warm-starts from the Keras weights, and a worker that does
        # not initialises its variables with other collectives than the chief: both hang.
        config = bound.arguments["config"] or tf.estimator.RunConfig(model_dir=model_dir)
        chief = config.is_chief
        bound.arguments["config"] = config.replace()
        bound.arguments["config"]._is_chief = True
        with files.model_dir_lock(model_dir or tempfile.gettempdir(), "keras_bridge"):
            estimator = model_to_estimator(*bound.args, **bound.kwargs)
        estimator._config._is_chief = chief
        return estimator

    return wrapper


def recording(mkdtemp: Callable, made: Set[str]) -> Callable:
    """`tempfile.mkdtemp`, adding each directory it makes to `made`.

    Args:
      mkdtemp: `tempfile.mkdtemp`.
      made: Collects the directories made.

    Returns:
      The wrapper.
    """

    @functools.wraps(mkdtemp)
    def wrapper(*args: Any, **kwargs: Any) -> str:
        path = mkdtemp(*args, **kwargs)
        made.add(os.path.abspath(path))
        return path

    return wrapper


def rmtrees() -> List[Tuple[Any, str]]:
    """The recursive deletes a program may call, as (module, attribute name)."""
    import shutil

    import tensorflow as tf

    return [(shutil, "rmtree"), (tf.io.gfile, "rmtree"), (tf.compat.v1.gfile, "DeleteRecursively")]


def routed(function: Callable, handler: Callable) -> Callable:
    """`function`, whose calls become `handler(function, *args, **kwargs)`.

    Args:
      function: What the program calls.
      handler: Decides what the call does; `function` does the work where it should.

    Returns:
      The wrapper.
    """

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return handler(function, *args, **kwargs)

    return wrapper


def keras_estimator_modules() -> List[Any]:
    """The modules through which a program reaches `model_to_estimator` (v1 and v2), once each."""
    import tensorflow as tf

    modules = [tf.keras.estimator, tf.compat.v1.keras.estimator, tf.compat.v2.keras.estimator]
    return list({id(module): module for module in modules}.values())
