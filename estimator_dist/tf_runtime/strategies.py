"""What the package reads of a strategy's internals, and the per-replica values it builds.

`MultiWorkerMirroredStrategy` has no public way to say which collective
implementation it was built with, nor to apply gradients that are already
per-replica values; gradient accumulation (`model_fns.optimizers`) and the
record of what ran (`run_config.strategies`) need both. Checked on TensorFlow
2.15: `tests/run_config/strategies_test.py`, `tests/model_fns/optimizers_test.py`.

>>> is_collective(None)
False
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.distribute import collective_all_reduce_strategy
from tensorflow.python.distribute import values as value_lib

#: The extended object of every collective (MultiWorkerMirrored) strategy.
COLLECTIVE_EXTENDED = collective_all_reduce_strategy.CollectiveAllReduceExtended


def is_collective(strategy: Optional[tf.distribute.Strategy]) -> bool:
    """Whether `strategy` all-reduces with collectives (a MultiWorkerMirroredStrategy)."""
    return strategy is not None and isinstance(strategy.extended, COLLECTIVE_EXTENDED)


def collective_implementation(strategy: tf.distribute.Strategy) -> str:
    """RING, NCCL or AUTO: what a collective strategy was built with."""
    return strategy.extended._communication_options.implementation.name


def per_replica(values: Sequence[Any]) -> Any:
    """One value per local replica, as a strategy's `run` returns them."""
    return value_lib.PerReplica(tuple(values))


def distributed_apply(
    optimizer: Any,
    strategy: tf.distribute.Strategy,
    grads_and_vars: Sequence[Tuple[Any, tf.Variable]],
    global_step: Any,
) -> tf.Operation:
    """Applies per-replica gradients with a `tf.compat.v1.train` optimizer (cross-replica).

    `apply_gradients` would all-reduce them first; these are already reduced.
    """
    return optimizer._distributed_apply(strategy, list(grads_and_vars), global_step, None)
