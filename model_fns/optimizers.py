"""Gradients of several micro-batches per update: within one step, or across steps.

Both make one update from the mean gradient of k micro-batches, which equals
the update of one k times larger batch when the loss is a mean over examples
(batch norm and dropout, which work per micro-batch, excepted).

**Within one step** (`--micro_batches=k`): `minimize_in_micro_batches`
splits each replica's batch into k micro-batches whose forward and backward
passes run one after another, sums their gradients as they come, and applies
the mean once. The global batch stays `--batch_size`; what changes is memory:
only one micro-batch's activations are alive at a time, so a per-worker batch
k times larger than what fits runs anyway. Each step still makes one gradient
all-reduce and one loss all-reduce, now per k micro-batches:

  >>> import tensorflow as tf
  >>> graph = tf.Graph()
  >>> with graph.as_default():
  ...     w = tf.compat.v1.Variable(1.0)
  ...     loss, train_op = minimize_in_micro_batches(
  ...         tf.compat.v1.train.GradientDescentOptimizer(0.1),
  ...         lambda x, y: tf.reduce_mean((w * x - y) ** 2),
  ...         tf.ones([8]), tf.zeros([8]), micro_batches=4)

**Across steps** (`--gradient_accumulation_steps=k`):
`with_gradient_accumulation(optimizer, params)` wraps a `tf.compat.v1.train`
optimizer, so it works in any model_fn. Each training step runs the forward
and backward pass of one micro-batch and adds its gradients to per-worker
accumulators; every k-th step the mean of the k accumulated gradients is
all-reduced across workers, in one collective, applied once by the wrapped
optimizer, and the accumulators are reset. What it changes:

* one update uses k steps' batches: the **effective global batch is k times
  `--batch_size`**;
* the global step counts updates, so `--train_steps` updates read k times
  as many examples; checkpoints are written after an update, when the
  accumulators are empty, and the accumulators are not saved;
* a learning rate tuned for `--batch_size` may need scaling for the k times
  larger effective batch (`resnet_cifar` scales its own);
* every micro-batch is still a session step, with Estimator's loss
  all-reduce keeping the workers in lockstep: on the 2-core benchmark
  machine that per-step synchronisation, not the gradient all-reduce, was
  most of the 2-worker overhead, and k = 8 measured no faster than k = 1.
  For speed, prefer a larger per-worker batch, with `--micro_batches` if it
  does not fit.

With k = 1 it returns the optimizer unchanged:

  >>> optimizer = with_gradient_accumulation(
  ...     tf.compat.v1.train.GradientDescentOptimizer(0.1), {"gradient_accumulation_steps": 1})
  >>> type(optimizer).__name__
  'GradientDescentOptimizer'

**The learning rate, by epoch** (`--params=decay_epochs=30;60,decay_rate=0.1`):
`learning_rate(params, base_rate)` is the rate to build the optimizer with:
`base_rate`, multiplied by `decay_rate` after each epoch of `decay_epochs`
(`model_fns.learning_rates`; the driver sets `num_train_examples`, the
examples in an epoch). It also shows the rate on the progress line and as
the `learning_rate` TensorBoard scalar. `with_gradient_accumulation` refuses
`decay_epochs` when the model_fn built its optimizer without it.
"""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.base.params import ACCUMULATION_STEPS, MICRO_BATCHES, MIXED_PRECISION
from estimator_dist.hardware import precision
from estimator_dist.tf_runtime import strategies as tf_strategies
from model_fns import learning_rates

#: Graph collection that records every micro-batched update built; the driver
#: checks it to refuse `--micro_batches` a model_fn would silently ignore.
MICRO_BATCH_COLLECTION = "estimator_dist_micro_batches"
#: Graph collection that records every accumulating optimizer built; the
#: driver checks it to refuse accumulation a model_fn would silently ignore.
COLLECTION = "estimator_dist_gradient_accumulation"


def accumulation_steps(params: Optional[Mapping[str, Any]]) -> int:
    """Returns k, the micro-batches per update that `params` asks for (1 if none)."""
    return int((params or {}).get(ACCUMULATION_STEPS, 1))


def micro_batches(params: Optional[Mapping[str, Any]]) -> int:
    """Returns k, the micro-batches per step that `params` asks for (1 if none)."""
    return int((params or {}).get(MICRO_BATCHES, 1))


def _split(value: Any, parts: int) -> List[Any]:
    """Splits every tensor of the nest `value` into `parts` along its first axis."""
    tensors = tf.nest.flatten(value)
    for tensor in tensors:
        rows = tensor.shape[0] if tensor.shape.rank else None
        if rows is not None and rows % parts:
            raise ValueError(
                f"--micro_batches={parts} must divide each replica's batch, which has {rows} "
                f"examples ({tensor.name}); use a --batch_size of a multiple of "
                f"{parts} x the number of replicas."
            )
    pieces = [tf.split(tensor, parts, axis=0) for tensor in tensors]
    return [tf.nest.pack_sequence_as(value, [p[i] for p in pieces]) for i in range(parts)]


def minimize_in_micro_batches(
    optimizer: tf.compat.v1.train.Optimizer,
    loss_fn: Callable[[Any, Any], tf.Tensor],
    features: Any,
    labels: Any,
    micro_batches: int,
    global_step: Optional[tf.Variable] = None,
) -> Tuple[tf.Tensor, tf.Operation]:
    """One update from `micro_batches` slices of the batch, computed one after another.

    Args:
      optimizer: A `tf.compat.v1.train` optimizer (possibly wrapped by
        `with_gradient_accumulation`); its `compute_gradients` scales the
        loss by 1/replicas under a strategy, as `minimize` does.
      loss_fn: `(features, labels) -> scalar mean loss` of one micro-batch;
        it must reuse the model's layers, so that every call shares weights.
      features: The batch's features (a tensor or a nest of tensors).
      labels: The batch's labels (a tensor or a nest of tensors).
      micro_batches: k; 1 computes the whole batch at once.
      global_step: Incremented by the update.

    Returns:
      `(loss, train_op)`: the mean of the micro-batches' losses, and the op
      that applies the mean of their gradients.

    Raises:
      ValueError: if k is below 1 or does not divide the batch's known size.
    """
    if micro_batches < 1:
        raise ValueError(f"micro_batches must be at least 1, received {micro_batches}.")
    if micro_batches == 1:
        loss = loss_fn(features, labels)
        return loss, optimizer.minimize(loss, global_step=global_step)
    tf.compat.v1.add_to_collection(MICRO_BATCH_COLLECTION, tf.constant(micro_batches))
    losses, sums, variables = [], None, None
    for part_features, part_labels in zip(
        _split(features, micro_batches), _split(labels, micro_batches)
    ):
        # The next micro-batch starts once this one's gradients are summed, so
        # only one micro-batch's activations are alive at a time.
        with tf.control_dependencies(sums or []):
            part_features, part_labels = tf.nest.map_structure(
                tf.identity, (part_features, part_labels)
            )
            loss = loss_fn(part_features, part_labels)
            pairs = [(g, v) for g, v in optimizer.compute_gradients(loss) if g is not None]
        if not pairs:
            raise ValueError("no variable has a gradient; check the loss of loss_fn.")
        if variables is None:
            variables = [v for _, v in pairs]
            sums = [tf.convert_to_tensor(g) for g, _ in pairs]
        else:
            sums = [total + tf.convert_to_tensor(g) for total, (g, _) in zip(sums, pairs)]
        losses.append(loss)
    means = [total / micro_batches for total in sums]
    train_op = optimizer.apply_gradients(list(zip(means, variables)), global_step=global_step)
    return tf.add_n(losses) / micro_batches, train_op


def learning_rate(params: Optional[Mapping[str, Any]], base_rate: float) -> tf.Tensor:
    """The learning rate of the current global step, for the optimizer of a model_fn.

    Args:
      params: The model_fn's params: `decay_epochs`, `decay_rate`,
        `num_train_examples` (`learning_rates.EpochParams`), and the
        driver's `batch_size` and `gradient_accumulation_steps`.
      base_rate: The rate until the first of `decay_epochs` (such as
        `params["learning_rate"]`).

    Returns:
      A float32 scalar tensor, shown on the progress line and written as the
      `learning_rate` summary.

    Raises:
      UsageError: for invalid schedule parameters.

    Example:
      >>> with tf.Graph().as_default():
      ...     rate = learning_rate({"decay_epochs": "2", "num_train_examples": 640,
      ...                           "batch_size": 64}, 0.1)  # 0.1, then 0.01 after step 20
    """
    schedule = learning_rates.epoch_schedule(base_rate, params)
    step = tf.compat.v1.train.get_or_create_global_step()
    return learning_rates.track(learning_rates.learning_rate_tensor(schedule, step))


def with_gradient_accumulation(
    optimizer: tf.compat.v1.train.Optimizer, params: Optional[Mapping[str, Any]]
) -> tf.compat.v1.train.Optimizer:
    """Wraps `optimizer` to accumulate `params["gradient_accumulation_steps"]` micro-batches.

    With `params["mixed_precision"]` float16 on this machine (`float16`, or
    `auto` on GPUs that compute in it) it also scales the loss (`loss_scaled`).

    Args:
      optimizer: A `tf.compat.v1.train` optimizer.
      params: The model_fn's params.

    Returns:
      `optimizer` itself when k is 1 without float16, otherwise it wrapped:
      in a `MixedPrecisionLossScaleOptimizer` for float16, in a
      `GradientAccumulationOptimizer` for k > 1.

    Raises:
      UsageError: if `params` set `decay_epochs` but the model_fn built no
        learning rate with `learning_rate` (it would be silently constant).
    """
    decay = (params or {}).get("decay_epochs")
    if decay not in (None, "") and learning_rates.tracked() is None:
        raise UsageError(
            f"--params sets decay_epochs={decay!r}, but this model_fn built its optimizer with "
            "a fixed learning rate, which would not decay. Build it with "
            "`model_fns.optimizers.learning_rate(params, base_rate)`, or leave decay_epochs out."
        )
    if precision.resolve((params or {}).get(MIXED_PRECISION, precision.OFF)).used == (
        precision.FLOAT16
    ):
        optimizer = loss_scaled(optimizer)
    steps = accumulation_steps(params)
    return optimizer if steps == 1 else GradientAccumulationOptimizer(optimizer, steps)


def loss_scaled(optimizer: tf.compat.v1.train.Optimizer) -> tf.compat.v1.train.Optimizer:
    """`optimizer` with dynamic loss scaling, as `enable_mixed_precision_graph_rewrite` wraps it.

    For `--mixed_precision=float16`, which `with_gradient_accumulation` wraps
    with it (a model_fn with an optimizer of its own calls it itself): the
    loss is multiplied by a scale before the gradients and they are divided
    by it after, so that float16 gradients do not underflow; a step whose
    gradients are not finite is skipped and the scale halved, and the scale
    doubles after 2,000 finite steps.

    >>> type(loss_scaled(tf.compat.v1.train.GradientDescentOptimizer(0.1))).__name__
    'MixedPrecisionLossScaleOptimizer'
    """
    return tf.compat.v1.mixed_precision.MixedPrecisionLossScaleOptimizer(optimizer, "dynamic")


def _local_variable(initial: Any, name: str) -> tf.Variable:
    # Per-replica state that is never synchronised nor saved, like metric variables.
    return tf.compat.v1.Variable(
        initial,
        trainable=False,
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
        synchronization=tf.VariableSynchronization.ON_READ,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        name=name,
        use_resource=True,
    )


class GradientAccumulationOptimizer(tf.compat.v1.train.Optimizer):
    """Applies the mean gradient of `steps` micro-batches once every `steps` steps.

    Args:
      optimizer: The `tf.compat.v1.train` optimizer that applies the update;
        its loss scaling under a strategy (1/replicas) is kept.
      steps: Micro-batches per update, at least 1.
      name: Name scope of the accumulation ops.

    Raises:
      TypeError: if `optimizer` is not a `tf.compat.v1.train.Optimizer`.
      ValueError: if `steps` is below 1.
    """

    def __init__(
        self,
        optimizer: tf.compat.v1.train.Optimizer,
        steps: int,
        name: str = "GradientAccumulation",
    ) -> None:
        if not isinstance(optimizer, tf.compat.v1.train.Optimizer):
            raise TypeError(
                f"gradient accumulation wraps a tf.compat.v1.train optimizer, received "
                f"{type(optimizer).__name__}; build the model's optimizer with "
                "tf.compat.v1.train (Estimator scales only those by 1/replicas)."
            )
        if steps < 1:
            raise ValueError(f"gradient accumulation steps must be at least 1, received {steps}.")
        super().__init__(use_locking=False, name=name)
        self._optimizer = optimizer
        self._steps = steps

    @property
    def steps(self) -> int:
        """Micro-batches per update."""
        return self._steps

    def compute_gradients(self, *args: Any, **kwargs: Any) -> List[Tuple[Any, tf.Variable]]:
        """The wrapped optimizer's gradients (of one micro-batch)."""
        return self._optimizer.compute_gradients(*args, **kwargs)

    def get_slot(self, var: tf.Variable, name: str) -> Optional[tf.Variable]:
        """The wrapped optimizer's slot."""
        return self._optimizer.get_slot(var, name)

    def get_slot_names(self) -> List[str]:
        """The wrapped optimizer's slot names."""
        return self._optimizer.get_slot_names()

    def variables(self) -> List[tf.Variable]:
        """The wrapped optimizer's variables (the accumulators are local, not saved)."""
        return self._optimizer.variables()

    def apply_gradients(
        self,
        grads_and_vars: Sequence[Tuple[Any, tf.Variable]],
        global_step: Optional[tf.Variable] = None,
        name: Optional[str] = None,
    ) -> tf.Operation:
        """Adds this micro-batch's gradients; every `steps`-th call also applies their mean.

        Returns:
          The training op. `global_step` is incremented on applying steps only.

        Raises:
          ValueError: if no variable has a gradient.
        """
        pairs = [(g, v) for g, v in grads_and_vars if g is not None]
        if not pairs:
            raise ValueError("no variable has a gradient; check the loss and var_list.")
        variables = [v for _, v in pairs]
        with tf.compat.v1.name_scope(name, self._name):
            accumulators = [
                _local_variable(tf.zeros(v.shape, v.dtype.base_dtype), "accumulator")
                for v in variables
            ]
            count = _local_variable(tf.zeros([], tf.int64), "micro_batches")
            tf.compat.v1.add_to_collection(COLLECTION, count)
            adds = [
                accumulator.assign_add(tf.convert_to_tensor(g))
                for accumulator, (g, _) in zip(accumulators, pairs)
            ]
            with tf.control_dependencies(adds):
                apply_now = tf.equal(count.assign_add(1) % self._steps, 0)
            arguments = (apply_now, accumulators, variables, global_step)
            if tf.distribute.has_strategy():
                context = tf.distribute.get_replica_context()
                applied = context.merge_call(self._apply_if, args=arguments)
            else:
                applied = self._apply_if(None, *arguments)
            return tf.group(applied)

    def _apply_if(
        self,
        strategy: Optional[tf.distribute.Strategy],
        apply_now: Any,
        accumulators: List[tf.Variable],
        variables: List[tf.Variable],
        global_step: Optional[tf.Variable],
    ) -> tf.Tensor:
        """In cross-replica context: if `apply_now`, all-reduce and apply the mean, then reset."""

        def parts(accumulator: tf.Variable) -> Sequence[tf.Variable]:
            # This worker's copies, one per local replica, read without any all-reduce.
            return strategy.experimental_local_results(accumulator) if strategy else (accumulator,)

        def apply() -> tf.Tensor:
            means = [[part.read_value() / self._steps for part in parts(a)] for a in accumulators]
            if strategy is None:
                grads = [mean for (mean,) in means]
                update = self._optimizer.apply_gradients(zip(grads, variables), global_step)
            else:
                grads = [tf_strategies.per_replica(mean) for mean in means]
                update = tf_strategies.distributed_apply(
                    self._optimizer, strategy, zip(grads, variables), global_step
                )
            with tf.control_dependencies([update]):
                resets = [
                    part.assign(tf.zeros_like(part)) for a in accumulators for part in parts(a)
                ]
            with tf.control_dependencies(resets):
                return tf.constant(True)

        predicate = parts(apply_now)[0] if strategy else apply_now
        return tf.cond(predicate, apply, lambda: tf.constant(False))
