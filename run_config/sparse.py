"""Sparse gradients all-reduced as dense tensors, so that any model trains on several workers.

Embedding, hashed, crossed and vocabulary feature columns, and
`tf.nn.embedding_lookup` or `tf.gather` in a model_fn, give their variables
sparse gradients (`tf.IndexedSlices`): one row per id a worker looked up, so
the number of rows depends on the examples each worker read.
MultiWorkerMirroredStrategy all-reduces them in graph mode by all-gathering
every worker's rows, padded to the longest; that collective fails as soon as
its size changes from one step to the next, which real data makes it do at
once ("Shape mismatch in the collective instance 108. Op at device
/job:chief/... expected shape [10,4] but another member in the group expected
shape [14,4]"). That breaks the tabular model_fns, TensorFlow's canned
estimators and any user's model_fn alike.

`reduce_sparse_as_dense(strategy)` makes the strategy convert every sparse
value to a dense tensor of its variable's full shape, on the value's own
device, just before its gradient all-reduce. Every worker then sends the same
shape, and the sum is the same as that of the sparse gradients.

Where it hooks in: in TensorFlow 2.15, `tf.compat.v1.train.Optimizer._distributed_apply`
and the Keras legacy optimizers (`tf.keras.optimizers.legacy.*`, which the
V2 canned estimators take; their `all_reduce_sum_gradients` goes through
`merge_call` except under XLA on GPUs) both all-reduce gradients with
`strategy.extended.batch_reduce_to`, which calls `_batch_reduce_to`. That
is the one method replaced, on the strategy's own `extended` object (no
other strategy is touched). `_reduce_to`, behind `strategy.reduce`, received
only the dense loss Estimator logs when a v1 and a V2
`DNNLinearCombinedClassifier` with hashed, crossed and embedding columns
trained, so it is left as it is. The replacement is a bound method of the
instance: Estimator's distribute coordinator deep-copies the strategy and
reconfigures it on every task, which keeps (and rebinds) such a method. It
calls whatever `_batch_reduce_to` was installed before it, so it chains with
`run_config.wire.send_gradients_as` in either order; install it last so
that the dense gradients are also sent in the wire dtype.

The cost: each step all-reduces the sparse variable's full shape, whatever
few rows the batch touched. Fine for tables up to a few million floats (a
1,000,000 x 4 float32 table adds 16 MB to every step's all-reduce); for
huge embeddings use the `parameter_server` strategy, whose sparse updates
send only the rows touched.

`tests/run_config/sparse_test.py` shows it: two worker processes, whose
batches hold numbers of distinct ids that differ between the workers and
from step to step, train a v1 and a V2 `DNNLinearCombinedClassifier`
(hashed, crossed, vocabulary and embedding columns; Ftrl and Adagrad) and a
model_fn with `tf.nn.embedding_lookup`; without this patch all three fail
with the shape mismatch above.

Example:
  >>> import tensorflow as tf
  >>> strategy = tf.distribute.MultiWorkerMirroredStrategy()  # doctest: +SKIP
  >>> reduce_sparse_as_dense(strategy)  # doctest: +SKIP
"""

from __future__ import annotations

import types
from typing import Any, List, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.distribute import collective_all_reduce_strategy
from tensorflow.python.distribute import values as value_lib

# Marks an `extended` object already patched; deep-copied with it.
_INSTALLED = "_estimator_dist_reduces_sparse_as_dense"


def _densify(value: Any, destination: Any) -> Any:
    """Returns `value` with each IndexedSlices component made dense on its own device."""
    if isinstance(value, value_lib.DistributedValues):
        parts = tuple(_densify(part, destination) for part in value.values)
        if all(new is old for new, old in zip(parts, value.values)):
            return value
        return value_lib.PerReplica(parts)
    if not isinstance(value, tf.IndexedSlices):
        return value
    # On the value's own device: the strategy batches all gradients into one
    # all-reduce only when values and destinations share devices, and every
    # task must batch alike, or their collectives' keys diverge.
    with tf.device(value.device):
        dense = tf.convert_to_tensor(value)
    # The row count comes from a tensor; the variable's static shape lets the
    # strategy pack this gradient with the others (`bytes_per_pack`).
    if isinstance(destination, tf.Variable) and destination.shape.is_compatible_with(dense.shape):
        dense.set_shape(destination.shape)
    return dense


def reduce_sparse_as_dense(strategy: tf.distribute.Strategy) -> None:
    """Makes `strategy` all-reduce sparse (IndexedSlices) gradients as dense tensors.

    Installing it again on the same strategy (or a deep copy of it) does
    nothing.

    Args:
      strategy: A MultiWorkerMirroredStrategy, changed in place.

    Raises:
      TypeError: if `strategy` is not a MultiWorkerMirroredStrategy.
    """
    extended = strategy.extended
    if not isinstance(extended, collective_all_reduce_strategy.CollectiveAllReduceExtended):
        raise TypeError(
            "sparse gradients are made dense for MultiWorkerMirroredStrategy only, received "
            f"{type(strategy).__name__}; other strategies all-reduce IndexedSlices themselves."
        )
    if getattr(extended, _INSTALLED, False):
        return
    # The function, not the bound method: a deep copy of the strategy must
    # call it on the copy, which the coordinator reconfigured for this task.
    installed_before = extended._batch_reduce_to.__func__

    def batch_reduce_sparse_as_dense(
        extended: tf.distribute.StrategyExtended,
        reduce_op: tf.distribute.ReduceOp,
        value_destination_pairs: Sequence[Tuple[Any, Any]],
        options: Any,
    ) -> List[Any]:
        pairs = [
            (_densify(value, destination), destination)
            for value, destination in value_destination_pairs
        ]
        return installed_before(extended, reduce_op, pairs, options)

    extended._batch_reduce_to = types.MethodType(batch_reduce_sparse_as_dense, extended)
    setattr(extended, _INSTALLED, True)
