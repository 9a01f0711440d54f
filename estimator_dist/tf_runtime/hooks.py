"""TensorFlow's own training hooks, as the package needs to tell them apart.

`tf.estimator.experimental.stop_if_*` build their hooks from private
classes of `tensorflow_estimator` (`make_early_stopping_hook`): on the chief
one that asks a predicate every so often and stops its own session, on the
other tasks one that follows a variable the chief sets. The package replaces
them on a cluster (`estimator_dist.task.early_stopping`), and needs their
predicate and timer to do so. `StopAtStepHook` stops every task at the same
global step, so a stop it asks for needs no agreement between tasks.
Checked on TensorFlow 2.15: `tests/estimator_dist/task/early_stopping_test.py`.

>>> is_early_stopping(tf.estimator.StopAtStepHook(last_step=10))
False
>>> stops_every_task_alike(tf.estimator.StopAtStepHook(last_step=10))
True
"""

from __future__ import annotations

from typing import Any, Callable, Tuple

import tensorflow as tf
from tensorflow_estimator.python.estimator import early_stopping

#: The hooks that decide an early stop (the chief's, or every task's under a strategy).
_DECIDING = (early_stopping._StopOnPredicateHook, early_stopping._MultiWorkerEarlyStoppingHook)
#: The hooks of the other tasks, which follow the chief's decision.
_FOLLOWING = (early_stopping._CheckForStoppingHook,)


def is_early_stopping(hook: Any) -> bool:
    """Whether `hook` is one of the hooks `make_early_stopping_hook` builds."""
    return isinstance(hook, _DECIDING + _FOLLOWING)


def decides_early_stop(hook: Any) -> bool:
    """Whether `hook` is an early-stopping hook that asks the predicate itself."""
    return isinstance(hook, _DECIDING)


def early_stop_predicate(hook: Any) -> Tuple[Callable[[], bool], Any]:
    """The predicate and the `SecondOrStepTimer` of a deciding early-stopping hook."""
    return hook._should_stop_fn, hook._timer


def stops_every_task_alike(hook: Any) -> bool:
    """Whether a stop `hook` asks for comes at the same global step on every task."""
    return isinstance(hook, tf.compat.v1.train.StopAtStepHook)
