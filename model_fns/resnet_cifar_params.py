"""Hyper-parameters of the CIFAR ResNet and the learning rate schedule they give.

`ResnetParams` validates the `params` of `model_fns.resnet_cifar.model_fn`
and derives the learning rate of every step from them, following Model
Garden's CIFAR-10 recipe (`resnet_cifar_main.py`): learning rate 0.1 per 128
examples of an update (the linear scaling rule), divided by 10 at epochs
91, 136 and 182 (`LR_SCHEDULE`), no warm-up. Epochs become steps by the
package's one rule (`model_fns.learning_rates`): epoch e ends at step
ceil(e x 50,000 / examples an update). `LearningRateSchedule` is that
schedule in Python; `learning_rate_tensor` the same in the graph.

Example:
  >>> ResnetParams(batch_size=256).schedule().describe()
  '0.2 until step 17774, then 0.02 until step 26563, then 0.002 until step 35547, then 0.0002'
"""

from __future__ import annotations

import dataclasses
from typing import Optional

from model_fns.learning_rates import (
    LearningRateSchedule,
    Numbers,
    decaying,
    epoch_boundaries,
    learning_rate_tensor,
    parse_numbers,
)

BATCH_NORM_MODES = ("local", "sync")
DTYPES = ("float32", "float64")
#: The batch size `base_learning_rate` is given for (the linear scaling rule).
REFERENCE_BATCH_SIZE = 128
#: Model Garden's CIFAR-10 learning rate decay epochs.
DEFAULT_DECAY_EPOCHS = (91, 136, 182)


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
        steps: epoch e ends at step ceil(e x num_train_examples /
        update_batch_size) (`model_fns.learning_rates.epochs_to_steps`, the
        rule of `--train_epochs` and `--save_checkpoints_epochs` too).
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
            boundaries = epoch_boundaries(epochs, self.num_train_examples, self.update_batch_size)
            given = "91;136;182" if self.decay_epochs is None else self.decay_epochs
            source = (
                f"decay_epochs={given!r} over num_train_examples={self.num_train_examples} at "
                f"{self.update_batch_size} examples an update"
            )
        initial = self.base_learning_rate * self.update_batch_size / REFERENCE_BATCH_SIZE
        return decaying(initial, self.decay_rate, boundaries, source)


__all__ = ["LearningRateSchedule", "ResnetParams", "learning_rate_tensor", "parse_numbers"]
