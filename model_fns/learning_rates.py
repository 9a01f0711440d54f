"""Learning rates that change at epoch boundaries, and the one rule turning epochs into steps.

An epoch is `num_train_examples` examples; a global step trains on
`batch_size` x `gradient_accumulation_steps` of them (an update), so epoch
`e` ends at step `ceil(e * num_train_examples / examples_per_step)`
(`epochs_to_steps`), the step at which `e` epochs of examples have been read.
The driver's `--train_epochs`, `--save_checkpoints_epochs` and
`--epochs_between_evals`, `resnet_cifar`'s `decay_epochs`, and the
`decay_epochs` any model_fn reads with `model_fns.optimizers.learning_rate`
all use this rule, so a rate decays at the step where an epoch's checkpoint
is written.

>>> epochs_to_steps(2, num_examples=50_000, examples_per_step=128)
782
>>> schedule = epoch_schedule(0.1, {"decay_epochs": "1;2", "num_train_examples": 1000,
...                                 "batch_size": 100})
>>> schedule.describe()
'0.1 until step 10, then 0.01 until step 20, then 0.001'
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

import tensorflow as tf

from estimator_dist.base import params as params_lib
from estimator_dist.base.errors import UsageError

#: Graph collection of the learning rate tensors a model_fn trains with (one per
#: replica); the progress line and the `learning_rate` summary show the first.
COLLECTION = "estimator_dist_learning_rate"

Numbers = Optional[Union[str, float, List[float]]]


def epochs_to_steps(epochs: float, num_examples: int, examples_per_step: int) -> int:
    """The global step at which `epochs` epochs of `num_examples` examples have been read.

    Args:
      epochs: Epochs, possibly fractional.
      num_examples: Examples in one epoch.
      examples_per_step: Examples one global step trains on (the global
        batch times the accumulated micro-batches).

    Returns:
      `ceil(epochs * num_examples / examples_per_step)`, with the examples
      rounded to a whole number first (so that 0.1 x 1,000 is 100).
    """
    examples = round(epochs * num_examples)
    return -(-examples // examples_per_step)


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
        """One line such as `0.1 until step 35547, then 0.01 until step 53125, then 0.001`."""
        parts = [f"{self.values[0]:g}"]
        for index, boundary in enumerate(self.boundaries):
            parts.append(f"until step {boundary}, then {self.values[index + 1]:g}")
        return " ".join(parts) if self.boundaries else f"{self.values[0]:g} at every step"


def decaying(
    initial: float,
    decay_rate: float,
    boundaries: Sequence[int],
    source: str,
) -> LearningRateSchedule:
    """`initial`, multiplied by `decay_rate` after each boundary.

    Raises:
      ValueError: if the boundaries are not increasing steps of at least 1;
        `source` says where they came from.
    """
    boundaries = tuple(boundaries)
    if any(b < 1 for b in boundaries) or list(boundaries) != sorted(set(boundaries)):
        raise ValueError(
            f"learning rate boundaries must be increasing steps of at least 1; {source} "
            f"gives steps {list(boundaries)}."
        )
    values = tuple(initial * decay_rate**index for index in range(len(boundaries) + 1))
    return LearningRateSchedule(boundaries, values)


def epoch_boundaries(
    epochs: Sequence[float], num_examples: int, examples_per_step: int
) -> Tuple[int, ...]:
    """The global steps at which each of `epochs` ends (`epochs_to_steps`)."""
    return tuple(epochs_to_steps(e, num_examples, examples_per_step) for e in epochs)


@dataclasses.dataclass(frozen=True)
class EpochParams:
    """The `params` keys of a learning rate decayed by epoch; every model_fn accepts them.

    Attributes:
      decay_epochs: Epochs after which the rate is multiplied by
        `decay_rate`, as `30;60;80`, one number, or a list; None or `""`
        for a constant rate.
      decay_rate: Factor applied at each boundary, in (0, 1].
      num_train_examples: Examples in an epoch. The driver sets it when it
        knows (`--num_train_examples`, or counted from the input for
        `--train_epochs`); a model_fn's own default may apply otherwise.
    """

    decay_epochs: Numbers = None
    decay_rate: float = 0.1
    num_train_examples: Optional[int] = None

    def __post_init__(self) -> None:
        if not 0 < self.decay_rate <= 1:
            raise ValueError(f"decay_rate must be in (0, 1], received {self.decay_rate}.")
        if self.num_train_examples is not None and self.num_train_examples < 1:
            raise ValueError(
                f"num_train_examples must be at least 1, received {self.num_train_examples}."
            )


def epoch_schedule(base_rate: float, params: Optional[Mapping[str, Any]]) -> LearningRateSchedule:
    """`base_rate`, decayed by `params["decay_rate"]` after each of `params["decay_epochs"]`.

    Args:
      base_rate: The rate before the first boundary.
      params: The model_fn's params: `decay_epochs`, `decay_rate`,
        `num_train_examples`, and the driver's `batch_size` and
        `gradient_accumulation_steps`.

    Returns:
      The schedule over global steps; constant without `decay_epochs`.

    Raises:
      UsageError: for invalid values, or `decay_epochs` without
        `num_train_examples`.
    """
    params = params or {}
    settings = params_lib.from_params(EpochParams, params, "the learning rate", strict=False)
    try:
        epochs = parse_numbers(settings.decay_epochs, "decay_epochs")
    except ValueError as error:
        raise UsageError(str(error)) from None
    if epochs and settings.num_train_examples is None:
        raise UsageError(
            f"decay_epochs={settings.decay_epochs!r} needs the examples in an epoch: pass "
            "--num_train_examples=N (or --params=num_train_examples=N)."
        )
    per_step = int(params.get("batch_size", 1)) * int(params.get("gradient_accumulation_steps", 1))
    boundaries = epoch_boundaries(epochs, settings.num_train_examples or 1, per_step)
    source = (
        f"decay_epochs={settings.decay_epochs!r} over num_train_examples="
        f"{settings.num_train_examples} at {per_step} examples a step"
    )
    try:
        return decaying(base_rate, settings.decay_rate, boundaries, source)
    except ValueError as error:
        raise UsageError(str(error)) from None


def learning_rate_tensor(schedule: LearningRateSchedule, global_step: tf.Tensor) -> tf.Tensor:
    """The learning rate of `global_step` as a graph tensor.

    Args:
      schedule: The schedule.
      global_step: The integer global step tensor.

    Returns:
      A float32 scalar: `schedule.rate_at(global_step)`.
    """
    if not schedule.boundaries:
        return tf.constant(schedule.values[0], tf.float32)
    return tf.compat.v1.train.piecewise_constant(
        global_step, list(schedule.boundaries), [float(v) for v in schedule.values]
    )


def track(rate: tf.Tensor) -> tf.Tensor:
    """Shows `rate` in the progress line and as the `learning_rate` TensorBoard scalar.

    Call it once in the TRAIN graph with the rate the optimizer uses.

    Returns:
      `rate`, as a float32 tensor.
    """
    rate = tf.cast(rate, tf.float32)
    tf.compat.v1.add_to_collection(COLLECTION, rate)
    tf.compat.v1.summary.scalar("learning_rate", rate)
    return rate


def tracked(graph: Optional[tf.Graph] = None) -> Optional[tf.Tensor]:
    """The learning rate `track` recorded in `graph` (the default graph), or None."""
    rates = (graph or tf.compat.v1.get_default_graph()).get_collection(COLLECTION)
    return rates[0] if rates else None
