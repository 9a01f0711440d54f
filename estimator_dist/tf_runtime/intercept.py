"""TensorFlow's entry points, replaced while a user's program runs, and put back after.

A program runs unchanged (`estimator_dist.programs`): it calls
`tf.estimator.train_and_evaluate`, `Estimator.train`/`evaluate`/
`export_saved_model`, builds estimators, converts Keras models, makes temporary
directories and deletes its model_dir. `intercepted` puts the package's
functions in their place for as long as the program runs, in every module
object through which a program reaches them (`tf.estimator` and
`tf.compat.v1.estimator` are lazy loaders holding copies of the names), and
restores them afterwards. What each replacement does is the program task's
decision (`estimator_dist.programs.task`); here is only where and how.
Checked on TensorFlow 2.15: `tests/estimator_dist/script_test.py` (the
wrappers are installed only while the script runs).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import shutil
import sys
import tempfile
from typing import Any, Callable, ContextManager, Iterator, List, Mapping, Optional, Set, Tuple

import tensorflow as tf
from tensorflow_estimator.python.estimator import estimator as estimator_lib
from tensorflow_estimator.python.estimator import training

from estimator_dist.tf_runtime import estimators

#: Decides a model_dir: given a call's bound arguments (`model_dir`, `config`) and what is
#: built, changes them in place where the model_dir must be another; returns the model_dir used.
ModelDirPolicy = Callable[[dict, str], Optional[str]]


def swap(stack: contextlib.ExitStack, owner: Any, name: str, value: Any) -> None:
    """Sets `owner.name` to `value` until `stack` closes."""
    previous = getattr(owner, name)
    setattr(owner, name, value)
    stack.callback(setattr, owner, name, previous)


def holders_of(function: Callable) -> List[Any]:
    """Every module object through which a program can reach `function` by its name."""
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


def keras_estimator_modules() -> List[Any]:
    """The modules through which a program reaches `model_to_estimator` (v1 and v2), once each."""
    modules = [tf.keras.estimator, tf.compat.v1.keras.estimator, tf.compat.v2.keras.estimator]
    return list({id(module): module for module in modules}.values())


def rmtrees() -> List[Tuple[Any, str]]:
    """The recursive deletes a program may call, as (module, attribute name)."""
    return [(shutil, "rmtree"), (tf.io.gfile, "rmtree"), (tf.compat.v1.gfile, "DeleteRecursively")]


def estimators_being_built() -> List[Any]:
    """The estimators whose constructors are running on this thread, innermost first.

    An estimator's constructor may build and train another estimator of its
    own: TensorFlow Lattice's crystals ensembles train a prefitting Estimator,
    in a temporary directory, on the chief alone (`if config.is_chief:`), while
    the other tasks wait for the file it leaves. That helper is the outer
    estimator's business, made as plain TensorFlow makes it, on the task that
    makes it (`estimator_dist.programs.loop.LoopTask.train`).
    """
    found: List[Any] = []
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "__init__":
            owner = frame.f_locals.get("self")
            if isinstance(owner, estimator_lib.Estimator) and all(owner is not e for e in found):
                found.append(owner)
        frame = frame.f_back
    return found


def _estimator_init(init: Callable, policy: ModelDirPolicy) -> Callable:
    """`Estimator.__init__`, its model_dir decided by `policy` first.

    An estimator built inside another's constructor is left as TensorFlow makes it.
    """
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(estimator: Any, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(estimator, *args, **kwargs)
        if not any(other is not estimator for other in estimators_being_built()):
            policy(bound.arguments, "an Estimator")
        init(*bound.args, **bound.kwargs)

    return __init__


def _configured(overwrite: Callable, policy: ModelDirPolicy) -> Callable:
    """`maybe_overwrite_model_dir_and_session_config`, its model_dir decided by `policy` first.

    Estimator's constructor calls it to settle the model_dir (making a
    temporary directory when none is given), and so do estimators that need
    the directory before their constructor (TensorFlow Lattice's canned
    estimators write their feature keypoints there, which non-chief tasks
    then wait for): both get the directory an Estimator would, made at once
    where TensorFlow would have made a temporary one.
    """
    signature = inspect.signature(overwrite)

    @functools.wraps(overwrite)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if len(estimators_being_built()) > 1:  # The constructor of an estimator's own helper.
            return overwrite(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        asked = bound.arguments.get("model_dir")
        given = policy(bound.arguments, "an Estimator's configuration")
        if given and not asked and bound.arguments.get("model_dir") == given:
            # TensorFlow's temporary directory exists when the call returns: so does this one.
            tf.io.gfile.makedirs(given)
        return overwrite(*bound.args, **bound.kwargs)

    return wrapper


def _keras_bridge(
    model_to_estimator: Callable,
    policy: ModelDirPolicy,
    lock: Callable[[str], ContextManager[None]],
) -> Callable:
    """`model_to_estimator` as a task of a cluster needs it.

    It writes the Keras model's weights to `model_dir/keras` on every task, for
    the estimator to start from, so the model_dir must be the shared one, and
    the tasks take turns (`lock`: the first writes, the others find it); every
    training task starts from them, as a chief does (TensorFlow's bridge
    warm-starts on the chief alone, and the tasks then initialise their
    variables with different collectives and hang creating the session); and
    the "saver" checkpoint format, since the object-based default builds its
    Saver in a replica context, where a model with batch normalization fails
    at its first step.
    """
    from absl import logging

    signature = inspect.signature(model_to_estimator)

    @functools.wraps(model_to_estimator)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        model_dir = policy(bound.arguments, "model_to_estimator")
        if bound.arguments["checkpoint_format"] != "saver":
            logging.info("estimator_dist: model_to_estimator gets checkpoint_format='saver'.")
            bound.arguments["checkpoint_format"] = "saver"
        _legacy_optimizer(bound.arguments.get("keras_model"))
        config = bound.arguments["config"] or tf.estimator.RunConfig(model_dir=model_dir)
        chief = config.is_chief
        bound.arguments["config"] = config.replace()
        estimators.set_chief(bound.arguments["config"], True)
        with lock(model_dir or tempfile.gettempdir()):
            estimator = model_to_estimator(*bound.args, **bound.kwargs)
        estimators.set_chief(estimator.config, chief)
        return estimator

    return wrapper


def _legacy_optimizer(model: Any) -> None:
    """Gives a compiled Keras model the legacy optimizer the bridge needs, as it does in eager mode.

    `model_to_estimator` converts a `tf.keras.optimizers.Optimizer` (the
    non-legacy kind) to its legacy equivalent when eager execution is on, and
    refuses it in graph mode, where a task of a cluster runs.
    """
    from absl import logging

    optimizer = getattr(model, "optimizer", None)
    if tf.executing_eagerly() or not isinstance(
        optimizer, tf.keras.optimizers.experimental.Optimizer
    ):
        return
    logging.info(
        "estimator_dist: model_to_estimator gets the legacy equivalent of the model's %s, as "
        "TensorFlow gives it in eager mode.",
        type(optimizer).__name__,
    )
    model.optimizer = tf.keras.__internal__.optimizers.convert_to_legacy_optimizer(optimizer)


def _recording(mkdtemp: Callable, made: Set[str]) -> Callable:
    """`tempfile.mkdtemp`, adding each directory it makes to `made`."""

    @functools.wraps(mkdtemp)
    def wrapper(*args: Any, **kwargs: Any) -> str:
        path = mkdtemp(*args, **kwargs)
        made.add(os.path.abspath(path))
        return path

    return wrapper


def _routed(function: Callable, handler: Callable) -> Callable:
    """`function`, whose calls become `handler(function, *args, **kwargs)`."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return handler(function, *args, **kwargs)

    return wrapper


@contextlib.contextmanager
def intercepted(
    train_and_evaluate: Callable[..., Any],
    estimator_methods: Mapping[str, Callable[[Callable], Callable]],
    model_dir_policy: ModelDirPolicy,
    temporary: Set[str],
    rmtree: Callable[..., Any],
    keras_lock: Optional[Callable[[str], ContextManager[None]]] = None,
) -> Iterator[Callable]:
    """Replaces TensorFlow's entry points while a program runs; restores them after.

    Args:
      train_and_evaluate: Called as `train_and_evaluate(original, estimator,
        train_spec, eval_spec)` for the program's calls, `original` being
        TensorFlow's.
      estimator_methods: For `train`, `evaluate`, `export_saved_model`: makes
        the replacement of `Estimator.<name>` from TensorFlow's method.
      model_dir_policy: Decides the model_dir of every Estimator built (and
        of `model_to_estimator`'s, and of each configuration settled by
        `maybe_overwrite_model_dir_and_session_config` before a constructor).
      temporary: Collects the directories the program makes with
        `tempfile.mkdtemp`.
      rmtree: Called as `rmtree(original, path, ...)` for the program's
        recursive deletes.
      keras_lock: Serialises `model_to_estimator` between the tasks sharing a
        model_dir; None leaves the bridge as it is (one process).

    Yields:
      TensorFlow's own `train_and_evaluate`.
    """
    original = training.train_and_evaluate

    @functools.wraps(original)
    def wrapper(estimator: Any, train_spec: Any, eval_spec: Any) -> Any:
        return train_and_evaluate(original, estimator, train_spec, eval_spec)

    with contextlib.ExitStack() as stack:
        for holder in holders_of(original):
            swap(stack, holder, "train_and_evaluate", wrapper)
        for method, make in estimator_methods.items():
            swap(
                stack,
                estimator_lib.Estimator,
                method,
                make(getattr(estimator_lib.Estimator, method)),
            )
        swap(stack, tempfile, "mkdtemp", _recording(tempfile.mkdtemp, temporary))
        init = estimator_lib.Estimator.__init__
        swap(stack, estimator_lib.Estimator, "__init__", _estimator_init(init, model_dir_policy))
        overwrite = estimator_lib.maybe_overwrite_model_dir_and_session_config
        configured = _configured(overwrite, model_dir_policy)
        swap(stack, estimator_lib, overwrite.__name__, configured)
        if keras_lock is not None:
            for holder in keras_estimator_modules():
                bridge = _keras_bridge(holder.model_to_estimator, model_dir_policy, keras_lock)
                swap(stack, holder, "model_to_estimator", bridge)
        for owner, name in rmtrees():
            swap(stack, owner, name, _routed(getattr(owner, name), rmtree))
        yield original
