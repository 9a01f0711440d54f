"""Gradients in bfloat16 or float16 on the network: half the bytes per all-reduce.

`send_gradients_as(strategy, "bfloat16")` makes a MultiWorkerMirroredStrategy
round every float32 gradient to bfloat16 before its all-reduce and convert the
sum back to float32 before the optimizer applies it. What changes in the math:

* each worker's gradient values are rounded to 8 significant bits (bfloat16)
  or 11 (float16), a relative error of at most 2^-9 or 2^-12;
* the sum over workers is computed in that dtype by the ring (each of the
  N - 1 additions of a value rounds again);
* nothing else: the loss, the local accumulation of micro-batches
  (`model_fns.optimizers`), the optimizer's slots and the weights stay
  float32, and the update is computed in float32 from the converted sum.

bfloat16 keeps float32's exponent range. float16 does not: gradient values
below about 6e-8 become 0 and sums above 65504 become infinite (no loss
scaling is applied), so prefer bfloat16 unless the gradients are known to fit.

Only gradient batch all-reduces are cast (what optimizers send); the single
reductions Estimator does for logging (the loss) stay float32. Sparse
gradients (`IndexedSlices`) are left as they are, unless
`run_config.sparse.reduce_sparse_as_dense` is installed after this: it
makes them dense before they get here.

This hooks into TensorFlow 2.15's `_batch_reduce_to` of the strategy
instance given (no other strategy is touched), as a bound method of its
`extended` object: Estimator's distribute coordinator deep-copies the strategy
and reconfigures it on every task, which rebuilds its collective ops but keeps
(and rebinds) that method. It calls whatever `_batch_reduce_to` was installed
before it, so it chains with `run_config.sparse` in either order. The package
pins TensorFlow 2.15; a test checks on real workers that the cast happens.

Example:
  >>> import tensorflow as tf
  >>> strategy = tf.distribute.MultiWorkerMirroredStrategy()  # doctest: +SKIP
  >>> send_gradients_as(strategy, "bfloat16")  # doctest: +SKIP
"""

from __future__ import annotations

import types
from typing import Any, List, Sequence, Tuple

import tensorflow as tf
from tensorflow.python.distribute import values as value_lib


def _cast(value: Any, source: tf.DType, target: tf.DType, wrap: type) -> Any:
    """Casts the dense `source` components of a (distributed) value to `target`."""
    if isinstance(value, value_lib.DistributedValues):
        return wrap(tuple(_cast(part, source, target, wrap) for part in value.values))
    if isinstance(value, tf.Tensor) and value.dtype == source:
        # On the value's own device: the strategy batches all gradients into one
        # all-reduce only when values and destinations share devices, and every
        # task must batch alike, or their collectives' keys diverge.
        with tf.device(value.device):
            return tf.cast(value, target)
    return value


def send_gradients_as(strategy: tf.distribute.Strategy, dtype: str) -> None:
    """Makes `strategy` all-reduce float32 gradients in `dtype`.

    Args:
      strategy: A MultiWorkerMirroredStrategy, changed in place.
      dtype: `bfloat16` or `float16`.

    Raises:
      ValueError: if `dtype` is not a 16-bit float type.
    """
    wire = tf.as_dtype(dtype)
    if wire not in (tf.bfloat16, tf.float16):
        raise ValueError(f"gradients can cross the wire as bfloat16 or float16, not {dtype!r}.")

    extended = strategy.extended
    # The function, not the bound method: a deep copy of the strategy must
    # call it on the copy, which the coordinator reconfigured for this task.
    installed_before = extended._batch_reduce_to.__func__

    def batch_reduce_in_wire_dtype(
        extended: tf.distribute.StrategyExtended,
        reduce_op: tf.distribute.ReduceOp,
        value_destination_pairs: Sequence[Tuple[Any, Any]],
        options: Any,
    ) -> List[Any]:
        narrowed = [_is_float32(value) for value, _ in value_destination_pairs]
        pairs = [
            (_cast(value, tf.float32, wire, value_lib.PerReplica) if narrow else value, destination)
            for narrow, (value, destination) in zip(narrowed, value_destination_pairs)
        ]
        reduced = installed_before(extended, reduce_op, pairs, options)
        return [
            _cast(result, wire, tf.float32, value_lib.Mirrored) if narrow else result
            for narrow, result in zip(narrowed, reduced)
        ]

    extended._batch_reduce_to = types.MethodType(batch_reduce_in_wire_dtype, extended)


def _is_float32(value: Any) -> bool:
    parts = value.values if isinstance(value, value_lib.DistributedValues) else (value,)
    return all(isinstance(part, tf.Tensor) and part.dtype == tf.float32 for part in parts)
