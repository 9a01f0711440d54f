"""Hyper-parameters of the CIFAR ResNet and the learning rate schedule they give.

`ResnetParams` validates the `params` of `model_fns.resnet_cifar.model_fn`
and derives the learning rate of every step from them, following Model
Garden's CIFAR-10 recipe (`resnet_cifar_main.py`): learning rate 0.1 per 128
examples of an update (the linear scaling rule), divided by 10 at epochs
91, 136 and 182 (`LR_SCHEDULE`), no warm-up. `LearningRateSchedule` is that
schedule in Python; `learning_rate_tensor` the same in the graph.

Example:
  >>> ResnetParams(batch_size=256).schedule().describe()
  '0.2 until step 17745, then 0.02 until step 26520, then 0.002 until step 35490, then 0.0002'
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Optional, Sequence, Tuple, Union

import tensorflow as tf

BATCH_NORM_MODES = ("local", "sync")
DTYPES = ("float32", "float64")
#: The batch size `base_learning_rate` is given for (the linear scaling rule).
REFERENCE_BATCH_SIZE = 128
#: Model Garden's CIFAR-10 learning rate decay epochs.
DEFAULT_DECAY_EPOCHS = (91, 136, 182)

Numbers = Optional[Union[str, float, List[float]]]


def parse_numbers(value: Numbers, name: str) -> Tuple[float, ...]:
    """Reads a list of numbers given as `a;b;c`, one number, or a list.

    Args:
      value: `"91;136;182"`, `91`, `[91, 136]`, `""` (none) or None (none).
      name: The parameter's name, for messages.

    Returns:
      The numbers as floats.

    Raises:
      ValueError: if an item is not a number.

    Example:
      >>> parse_numbers("91;136;182", "decay_epochs")
      (91.0, 136.0, 182.0)
    """
    if value is None:
        return ()
    if isinstance(value, str):
        items: Sequence[Any] = [item.strip() for item in value.split(";") if item.strip()]
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        items = [value]
    numbers_read = []
    for item in items:
        if isinstance(item, bool):
            item = str(item)
        try:
            numbers_read.append(float(item))
        except (TypeError, ValueError):
            raise ValueError(
                f"{name} must be numbers separated by ';' (such as 91;136;182), received "
                f"{value!r}: {item!r} is not a number."
            ) from None
    return tuple(numbers_read)


@dataclasses.dataclass(frozen=True)
class LearningRateSchedule:
    """A piecewise constant learning rate: `values[i]` up to `boundaries[i]`.

    Attributes:
      boundaries: Global steps after which the rate changes, increasing.
      values: One more rate than boundaries.
    """

    boundaries: Tuple[int, ...]
    values: Tuple[float, ...]

    def rate_at(self, step: int) -> float:
        """The rate of global step `step` (the same rule as `piecewise_constant`)."""
        for boundary, value in zip(self.boundaries, self.values):
            if step <= boundary:
                return value
        return self.values[-1]

    def describe(self) -> str:
        """One line such as `0.1 until step 35490, 0.01 until 53040, then 0.001`."""
        parts = [f"{self.values[0]:g}"]
        for index, boundary in enumerate(self.boundaries):
            parts.append(f"until step {boundary}, then {self.values[index + 1]:g}")
        return " ".join(parts) if self.boundaries else f"{self.values[0]:g} at every step"


@dataclasses.dataclass(frozen=True)
class ResnetParams:
    """Hyper-parameters of `model_fn`.

    Attributes:
      depth: Layers with weights, 6n + 2: 20, 32, 56, 110, ...
      num_classes: Output classes.
      batch_size: Global batch size (the driver passes `--batch_size`).
      gradient_accumulation_steps: Micro-batches per update (the driver
        passes `--gradient_accumulation_steps`); an update uses
        `update_batch_size` = batch_size x this examples, which scales the
        learning rate and sets the updates of an epoch.
      base_learning_rate: Learning rate per 128 examples of an update; the
        initial rate is `base_learning_rate * update_batch_size / 128`.
      momentum: Momentum of the SGD optimizer.
      weight_decay: L2 coefficient: `weight_decay * sum(w ** 2)` over the
        convolution and dense weights is added to the loss. 0 disables it.
      num_train_examples: Examples in an epoch, to turn `decay_epochs` into
        steps (`num_train_examples // update_batch_size` steps an epoch).
      decay_epochs: Epochs after which the rate is multiplied by
        `decay_rate`, as `91;136;182`, one number, or a list; `""` for a
        constant rate. Default (when `decay_steps` is not given either):
        91;136;182.
      decay_steps: The same boundaries as global steps, instead of epochs.
      decay_rate: Factor applied at each boundary.
      batch_norm: `local` (statistics of each replica's batch) or `sync`
        (of the global batch, all-reduced over replicas every layer).
      virtual_batch_size: With `local`, normalise groups of this many
        examples of each replica's batch separately (ghost batch norm). It
        must divide the per-replica batch.
      seed: Seed of the weight initialisers, so that every run (and every
        worker) starts from the same weights; None draws fresh ones.
      dtype: `float32`, or `float64` for numerical checks: float32 round-off
        in the backward pass of a batch-normalised network is about 1e-4 of
        the gradient's scale, which hides exact equalities after a few steps.
    """

    depth: int = 20
    num_classes: int = 10
    batch_size: int = REFERENCE_BATCH_SIZE
    gradient_accumulation_steps: int = 1
    base_learning_rate: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 2e-4
    num_train_examples: int = 50_000
    decay_epochs: Numbers = None
    decay_steps: Numbers = None
    decay_rate: float = 0.1
    batch_norm: str = "local"
    virtual_batch_size: Optional[int] = None
    seed: Optional[int] = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.depth < 8 or (self.depth - 2) % 6:
            raise ValueError(
                f"depth must be 6n + 2 with n >= 1 (8, 14, 20, 32, 56, 110, ...), received "
                f"{self.depth}."
            )
        positive = (
            "num_classes",
            "batch_size",
            "gradient_accumulation_steps",
            "num_train_examples",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, received {getattr(self, name)}.")
        if self.base_learning_rate <= 0:
            raise ValueError(
                f"base_learning_rate must be positive, received {self.base_learning_rate}."
            )
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), received {self.momentum}.")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay must be 0 or more, received {self.weight_decay}.")
        if not 0 < self.decay_rate <= 1:
            raise ValueError(f"decay_rate must be in (0, 1], received {self.decay_rate}.")
        if self.batch_norm not in BATCH_NORM_MODES:
            raise ValueError(
                f"batch_norm {self.batch_norm!r} is unknown; valid: {', '.join(BATCH_NORM_MODES)}."
            )
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is unknown; valid: {', '.join(DTYPES)}.")
        if self.virtual_batch_size is not None:
            self._check_virtual_batch_size()
        if self.decay_epochs is not None and self.decay_steps is not None:
            raise ValueError(
                f"give decay_epochs or decay_steps, not both; received "
                f"decay_epochs={self.decay_epochs!r} and decay_steps={self.decay_steps!r}."
            )
        self.schedule()

    def _check_virtual_batch_size(self) -> None:
        if self.virtual_batch_size < 1:
            raise ValueError(
                f"virtual_batch_size must be at least 1, received {self.virtual_batch_size}."
            )
        if self.batch_norm != "local":
            raise ValueError(
                f"virtual_batch_size works with batch_norm=local only; received "
                f"virtual_batch_size={self.virtual_batch_size} with batch_norm={self.batch_norm}."
            )
        if self.batch_size % self.virtual_batch_size:
            raise ValueError(
                f"virtual_batch_size must divide the per-replica batch; received "
                f"virtual_batch_size={self.virtual_batch_size}, which does not even divide "
                f"the global batch_size={self.batch_size}."
            )

    @property
    def update_batch_size(self) -> int:
        """Examples of one update: the global batch times the accumulated micro-batches."""
        return self.batch_size * self.gradient_accumulation_steps

    @property
    def blocks_per_stage(self) -> int:
        """n of depth = 6n + 2."""
        return (self.depth - 2) // 6

    def schedule(self) -> LearningRateSchedule:
        """The learning rate of every global step.

        Returns:
          The schedule; its first value is `base_learning_rate * update_batch_size / 128`.

        Raises:
          ValueError: if the boundaries are not positive and increasing
            (after conversion to steps) or a step boundary is not an integer.
        """
        if self.decay_steps is not None:
            steps = parse_numbers(self.decay_steps, "decay_steps")
            for step in steps:
                if step != int(step):
                    raise ValueError(
                        f"decay_steps must be whole steps, received {self.decay_steps!r}."
                    )
            boundaries = tuple(int(step) for step in steps)
            source = f"decay_steps={self.decay_steps!r}"
        else:
            epochs = (
                DEFAULT_DECAY_EPOCHS
                if self.decay_epochs is None
                else parse_numbers(self.decay_epochs, "decay_epochs")
            )
            steps_per_epoch = max(1, self.num_train_examples // self.update_batch_size)
            boundaries = tuple(int(round(epoch * steps_per_epoch)) for epoch in epochs)
            given = "91;136;182" if self.decay_epochs is None else self.decay_epochs
            source = (
                f"decay_epochs={given!r} at {steps_per_epoch} steps an epoch (num_train_examples="
                f"{self.num_train_examples} // {self.update_batch_size} examples an update)"
            )
        if any(b < 1 for b in boundaries) or list(boundaries) != sorted(set(boundaries)):
            raise ValueError(
                f"learning rate boundaries must be increasing steps of at least 1; {source} "
                f"gives steps {list(boundaries)}."
            )
        initial = self.base_learning_rate * self.update_batch_size / REFERENCE_BATCH_SIZE
        values = tuple(initial * self.decay_rate**index for index in range(len(boundaries) + 1))
        return LearningRateSchedule(boundaries, values)


def learning_rate_tensor(schedule: LearningRateSchedule, global_step: tf.Tensor) -> tf.Tensor:
    """The learning rate of `global_step` as a graph tensor.

    Args:
      schedule: From `ResnetParams.schedule()`.
      global_step: The integer global step tensor.

    Returns:
      A float32 scalar: `schedule.rate_at(global_step)`.

    Example:
      >>> schedule = ResnetParams(batch_size=256).schedule()
      >>> rate = learning_rate_tensor(schedule, tf.constant(0, tf.int64))  # 0.2
    """
    if not schedule.boundaries:
        return tf.constant(schedule.values[0], tf.float32)
    return tf.compat.v1.train.piecewise_constant(
        global_step, list(schedule.boundaries), [float(v) for v in schedule.values]
    )
