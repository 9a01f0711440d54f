"""ResNet-20/32/56 (depth 6n+2) for 32x32x3 images, the CIFAR-10 recipe of TF Model Garden.

The network and the training recipe follow Model Garden's Keras ResNet for
CIFAR (`official/benchmark/models/resnet_cifar_model.py` and
`resnet_cifar_main.py`):

* a 3x3 convolution with 16 filters, then 3 stages of n basic blocks with
  16, 32 and 64 filters (the first block of stages 2 and 3 has stride 2);
  each block is conv-BN-ReLU-conv-BN plus a shortcut, then ReLU. The first
  block of every stage has a 1x1 convolution + BN shortcut (a projection,
  as in Model Garden), the others the identity. Global average pooling and
  a dense layer produce the logits. ResNet-20 has 272,762 trainable
  parameters.
* batch norm with decay 0.997 and epsilon 1e-5; He-normal convolution
  kernels and a N(0, 0.01) dense kernel, seeded from `seed`;
* L2 weight decay 2e-4 * sum(w^2) over the convolution and dense weights
  (not batch norm), added to the loss;
* momentum SGD (0.9) with learning rate 0.1 per 128 examples of the global
  batch, divided by 10 at epochs 91, 136 and 182 (Model Garden's
  `LR_SCHEDULE`); no warm-up (Model Garden has none for CIFAR).

Loss under distribution: each replica adds the mean cross-entropy of its
per-replica batch to the weight decay. The `tf.compat.v1.train` optimizer
divides that by the number of replicas and the gradients are summed over
replicas, so a step equals one worker's step on the global batch, except
for batch norm: with `batch_norm=local` each replica normalises with the
statistics of its own batch (the classic recipe), with `batch_norm=sync`
with those of the global batch. One worker with `virtual_batch_size` set
to the per-replica batch normalises like N replicas with local batch norm
do (ghost batch norm).

Example:
  >>> import tensorflow as tf
  >>> estimator = tf.estimator.Estimator(
  ...     model_fn, params={"depth": 20, "batch_size": 128, "batch_norm": "sync"})
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Mapping, Optional, Sequence, Tuple, Union

import tensorflow as tf
from absl import logging

from estimator_dist.base.params import from_params
from model_fns.optimizers import with_gradient_accumulation

BATCH_NORM_MODES = ("local", "sync")
DTYPES = ("float32", "float64")
BATCH_NORM_DECAY = 0.997
BATCH_NORM_EPSILON = 1e-5
#: The batch size `base_learning_rate` is given for (the linear scaling rule).
REFERENCE_BATCH_SIZE = 128
#: Model Garden's CIFAR-10 learning rate decay epochs.
DEFAULT_DECAY_EPOCHS = (91, 136, 182)
STAGE_FILTERS = (16, 32, 64)

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


def count_parameters(depth: int, num_classes: int = 10) -> int:
    """Trainable parameters of the network, computed from its layout.

    Args:
      depth: 6n + 2.
      num_classes: Output classes.

    Returns:
      Convolution kernels, batch norm scales and offsets, dense kernel and bias.

    Example:
      >>> count_parameters(20)
      272762
    """
    blocks = (depth - 2) // 6
    total = 3 * 3 * 3 * STAGE_FILTERS[0] + 2 * STAGE_FILTERS[0]
    channels = STAGE_FILTERS[0]
    for filters in STAGE_FILTERS:
        # Projection shortcut of the first block: 1x1 conv + BN.
        total += channels * filters + 2 * filters
        for block in range(blocks):
            inputs = channels if block == 0 else filters
            total += 9 * inputs * filters + 9 * filters * filters + 4 * filters
        channels = filters
    return total + channels * num_classes + num_classes


class _Initializers:
    """Seeded initialisers, each with its own seed, so equal shapes get different weights."""

    def __init__(self, seed: Optional[int]) -> None:
        self._seed = seed
        self._count = 0

    def _next_seed(self) -> Optional[int]:
        self._count += 1
        return None if self._seed is None else self._seed + self._count - 1

    def conv(self) -> tf.keras.initializers.Initializer:
        return tf.keras.initializers.HeNormal(seed=self._next_seed())

    def dense(self) -> tf.keras.initializers.Initializer:
        return tf.keras.initializers.RandomNormal(stddev=0.01, seed=self._next_seed())


class ResnetCifar(tf.keras.Model):
    """The network: images in [0, 1] to logits.

    Example:
      >>> network = ResnetCifar(ResnetParams(depth=20))
      >>> logits = network(tf.zeros([2, 32, 32, 3]), training=False)
    """

    def __init__(self, params: ResnetParams) -> None:
        super().__init__(name="resnet_cifar")
        self._params = params
        initializers = _Initializers(params.seed)
        self.stem = self._conv(STAGE_FILTERS[0], 3, 1, initializers, "conv1")
        self.stem_bn = self._batch_norm("bn_conv1")
        self.blocks = []
        for stage, filters in enumerate(STAGE_FILTERS):
            for block in range(params.blocks_per_stage):
                name = f"stage{stage + 1}_block{block}"
                strides = 2 if stage > 0 and block == 0 else 1
                layers = {
                    "conv_a": self._conv(filters, 3, strides, initializers, f"{name}_conv_a"),
                    "bn_a": self._batch_norm(f"{name}_bn_a"),
                    "conv_b": self._conv(filters, 3, 1, initializers, f"{name}_conv_b"),
                    "bn_b": self._batch_norm(f"{name}_bn_b"),
                }
                if block == 0:
                    layers["conv_shortcut"] = self._conv(
                        filters, 1, strides, initializers, f"{name}_conv_shortcut"
                    )
                    layers["bn_shortcut"] = self._batch_norm(f"{name}_bn_shortcut")
                self.blocks.append(layers)
        self.dense = tf.keras.layers.Dense(
            params.num_classes,
            kernel_initializer=initializers.dense(),
            dtype=params.dtype,
            name="dense",
        )

    def _conv(
        self, filters: int, size: int, strides: int, initializers: _Initializers, name: str
    ) -> tf.keras.layers.Conv2D:
        return tf.keras.layers.Conv2D(
            filters,
            size,
            strides=strides,
            padding="same",
            use_bias=False,
            kernel_initializer=initializers.conv(),
            dtype=self._params.dtype,
            name=name,
        )

    def _batch_norm(self, name: str) -> tf.keras.layers.BatchNormalization:
        return tf.keras.layers.BatchNormalization(
            momentum=BATCH_NORM_DECAY,
            epsilon=BATCH_NORM_EPSILON,
            synchronized=self._params.batch_norm == "sync",
            virtual_batch_size=self._params.virtual_batch_size,
            dtype=self._params.dtype,
            name=name,
        )

    def call(self, images: tf.Tensor, training: bool = False) -> tf.Tensor:
        images = tf.cast(images, self._params.dtype)
        x = tf.nn.relu(self.stem_bn(self.stem(images), training=training))
        for layers in self.blocks:
            y = tf.nn.relu(layers["bn_a"](layers["conv_a"](x), training=training))
            y = layers["bn_b"](layers["conv_b"](y), training=training)
            if "conv_shortcut" in layers:
                x = layers["bn_shortcut"](layers["conv_shortcut"](x), training=training)
            x = tf.nn.relu(x + y)
        return self.dense(tf.reduce_mean(x, axis=[1, 2]))

    def weight_decay_variables(self) -> List[tf.Variable]:
        """Every convolution kernel, and the dense kernel and bias (not batch norm)."""
        convolutions = [self.stem] + [
            layer for block in self.blocks for key, layer in block.items() if key.startswith("conv")
        ]
        return [conv.kernel for conv in convolutions] + [self.dense.kernel, self.dense.bias]


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


_LOGGED_SCHEDULES: set = set()


def _log_schedule_once(hparams: ResnetParams, schedule: LearningRateSchedule) -> None:
    line = (
        f"resnet_cifar: ResNet-{hparams.depth}, global batch {hparams.batch_size}"
        + (
            f" x {hparams.gradient_accumulation_steps} accumulated micro-batches"
            if hparams.gradient_accumulation_steps > 1
            else ""
        )
        + f", batch norm {hparams.batch_norm}"
        + (f" (virtual batch {hparams.virtual_batch_size})" if hparams.virtual_batch_size else "")
        + f"; learning rate {schedule.describe()} (base_learning_rate "
        f"{hparams.base_learning_rate:g} x {hparams.update_batch_size}/{REFERENCE_BATCH_SIZE}); "
        f"momentum {hparams.momentum:g}, weight decay {hparams.weight_decay:g}. "
        "--learning_rate is not used."
    )
    if line not in _LOGGED_SCHEDULES:
        _LOGGED_SCHEDULES.add(line)
        logging.info("%s", line)


def model_fn(
    features: Any, labels: Optional[tf.Tensor], mode: str, params: Mapping[str, Any]
) -> tf.estimator.EstimatorSpec:
    """Estimator `model_fn` for TRAIN, EVAL (accuracy, top-5) and PREDICT.

    Args:
      features: `{"image": float32 [batch, 32, 32, 3] in [0, 1]}` or the
        image tensor itself. Other sizes work (global pooling), CIFAR's is
        what the recipe is for.
      labels: int [batch] class ids; None in PREDICT mode.
      mode: A `tf.estimator.ModeKeys` value.
      params: Hyper-parameters, see `ResnetParams`; `batch_size` is the
        global batch. The driver's `learning_rate` is not used: the rate is
        `base_learning_rate * batch_size / 128`.

    Returns:
      The `EstimatorSpec` for `mode`; PREDICT carries a `serving_default`
      signature with `class_ids`, `probabilities` and `logits`.

    Raises:
      UsageError: for unknown or invalid hyper-parameters.

    Example:
      >>> import tensorflow as tf
      >>> estimator = tf.estimator.Estimator(model_fn, params={"depth": 32, "batch_size": 256})
    """
    hparams = from_params(
        ResnetParams,
        {key: value for key, value in params.items() if key != "learning_rate"},
        "resnet_cifar",
    )
    images = features["image"] if isinstance(features, Mapping) else features
    training = mode == tf.estimator.ModeKeys.TRAIN
    network = ResnetCifar(hparams)
    logits = network(images, training=training)
    class_ids = tf.argmax(logits, axis=1)
    predictions = {
        "class_ids": class_ids,
        "probabilities": tf.cast(tf.nn.softmax(logits), tf.float32),
        "logits": tf.cast(logits, tf.float32),
    }
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(
            mode,
            predictions=predictions,
            export_outputs={"serving_default": tf.estimator.export.PredictOutput(predictions)},
        )
    labels = tf.cast(tf.reshape(labels, [-1]), tf.int32)
    cross_entropy = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    )
    decay = tf.add_n([tf.reduce_sum(tf.square(w)) for w in network.weight_decay_variables()])
    loss = cross_entropy + tf.cast(hparams.weight_decay, logits.dtype) * decay
    if mode == tf.estimator.ModeKeys.EVAL:
        metrics = {
            "accuracy": tf.compat.v1.metrics.accuracy(labels=labels, predictions=class_ids),
            "cross_entropy": tf.compat.v1.metrics.mean(cross_entropy),
        }
        if hparams.num_classes > 5:
            in_top_5 = tf.nn.in_top_k(predictions=predictions["logits"], targets=labels, k=5)
            metrics["accuracy_top_5"] = tf.compat.v1.metrics.mean(tf.cast(in_top_5, tf.float32))
        return tf.estimator.EstimatorSpec(
            mode, loss=tf.cast(loss, tf.float32), eval_metric_ops=metrics
        )

    schedule = hparams.schedule()
    _log_schedule_once(hparams, schedule)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    learning_rate = learning_rate_tensor(schedule, global_step)
    tf.compat.v1.summary.scalar("learning_rate", learning_rate)
    tf.compat.v1.summary.scalar("cross_entropy", cross_entropy)
    optimizer = with_gradient_accumulation(
        tf.compat.v1.train.MomentumOptimizer(learning_rate, momentum=hparams.momentum), params
    )
    minimize = optimizer.minimize(loss, global_step=global_step)
    # Keras layers in a graph-mode model_fn keep their moving-average updates
    # to themselves (not in UPDATE_OPS): run them with every step.
    train_op = tf.group(minimize, *network.updates)
    return tf.estimator.EstimatorSpec(mode, loss=tf.cast(loss, tf.float32), train_op=train_op)
