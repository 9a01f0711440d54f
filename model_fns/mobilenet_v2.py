"""MobileNetV2 trained from scratch, as a compiled Keras model for the `model_to_estimator` bridge.

`build_mobilenet_v2(params)` returns `tf.keras.applications.MobileNetV2`
(`weights=None`: random initial weights, nothing downloaded) with its width
`alpha` and input size as parameters, an input named `image` (what
`--input_fn=tfds_images` gives, scaled to [-1, 1] as MobileNetV2 expects)
and a `classes`-way top layer that outputs logits. The number of classes is
`num_classes` when given, otherwise read from the TFDS metadata of the
input's `dataset` (its `label_key` feature), so that
`--params=dataset=tf_flowers` sizes both the input and the model.

It is compiled with a legacy Keras optimizer (`tf.keras.optimizers.legacy`),
the only kind `model_to_estimator` accepts in TensorFlow 2.15; the bridge
makes the optimizer's step counter the Estimator's global step, so the
learning rate schedule follows the global step on every worker. The rate
is `learning_rate` (`--learning_rate`), multiplied by `decay_per_epoch`
after every epoch of `num_train_examples` (the paper's recipe is RMSProp
with 0.98 per epoch); an epoch is `num_train_examples // batch_size` global
steps, and `num_train_examples` defaults to the size of the input's TFDS
`split`.

Example:
  >>> model = build_mobilenet_v2(
  ...     {"alpha": 0.35, "num_classes": 5, "feature_shapes": {"image": [96, 96, 3]}})
  >>> model.input_names, model.output_shape
  (['image'], (None, 5))
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Tuple, Union

import tensorflow as tf
import tensorflow_datasets as tfds

from estimator_dist.base.errors import UsageError
from estimator_dist.base.params import from_params

#: The optimizers the bridge can use, all `tf.keras.optimizers.legacy`.
OPTIMIZERS = ("adam", "rmsprop", "sgd", "momentum")
#: The smallest image side `tf.keras.applications.MobileNetV2` accepts.
MIN_IMAGE_SIZE = 32
#: The name of the model's input: the feature the input_fn must give.
FEATURE = "image"
#: Raised when the number of classes cannot be found.
NUM_CLASSES_UNKNOWN = (
    "mobilenet_v2 needs the number of classes: {why}. Pass --params=num_classes=<N>, or "
    "--params=dataset=<TFDS name> with a prepared dataset whose {label_key!r} feature is a "
    "ClassLabel."
)


@dataclasses.dataclass(frozen=True)
class MobileNetParams:
    """Hyper-parameters of `build_mobilenet_v2`.

    Attributes:
      alpha: Width multiplier: every layer has alpha times the paper's
        filters (0.35 to 1.4 in the paper; any positive value works).
      image_size: Height and width of the input. None takes the input_fn's
        image shape (`feature_shapes`), or 224 without one. When given with
        an input whose images differ in size, the build fails.
      num_classes: Output classes; None reads them from the TFDS metadata of
        `params["dataset"]`.
      learning_rate: Initial learning rate (`--learning_rate`).
      optimizer: `adam`, `rmsprop`, `sgd` or `momentum` (SGD with momentum).
      momentum: Momentum of `rmsprop` and `momentum`.
      decay_per_epoch: The learning rate is multiplied by this after every
        epoch; 1 keeps it constant.
      num_train_examples: Examples in an epoch, for `decay_per_epoch`; None
        reads the size of the input's TFDS `split`.
      batch_size: Global batch size (the driver passes `--batch_size`).
    """

    alpha: float = 1.0
    image_size: Optional[int] = None
    num_classes: Optional[int] = None
    learning_rate: float = 0.001
    optimizer: str = "adam"
    momentum: float = 0.9
    decay_per_epoch: float = 1.0
    num_train_examples: Optional[int] = None
    batch_size: int = 64

    def __post_init__(self) -> None:
        if self.alpha <= 0:
            raise ValueError(f"alpha must be positive, received {self.alpha}.")
        if self.image_size is not None and self.image_size < MIN_IMAGE_SIZE:
            raise ValueError(
                f"image_size must be at least {MIN_IMAGE_SIZE} (MobileNetV2's smallest input), "
                f"received {self.image_size}."
            )
        if self.num_classes is not None and self.num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, received {self.num_classes}.")
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be positive, received {self.learning_rate}.")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer {self.optimizer!r} is unknown; valid: {', '.join(OPTIMIZERS)}."
            )
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), received {self.momentum}.")
        if not 0 < self.decay_per_epoch <= 1:
            raise ValueError(f"decay_per_epoch must be in (0, 1], received {self.decay_per_epoch}.")
        for name in ("num_train_examples", "batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, received {value}.")


def input_shape(hparams: MobileNetParams, feature_shapes: Mapping[str, Any]) -> Tuple[int, ...]:
    """The model's input shape: the input_fn's images, checked against `image_size`.

    Raises:
      UsageError: if the input's images are not `image_size` square, or have
        an unknown size.
    """
    given = feature_shapes.get(FEATURE)
    if given is None:
        side = hparams.image_size or 224
        return (side, side, 3)
    shape = tuple(given)
    if len(shape) != 3 or any(dim is None for dim in shape):
        raise UsageError(
            f"mobilenet_v2 needs images of a known size, height x width x channels; the input "
            f"gives {FEATURE!r} of shape {list(shape)}. Resize them in the input_fn, as "
            "--input_fn=tfds_images does with --params=image_size=<N>."
        )
    if hparams.image_size is not None and shape[:2] != (hparams.image_size,) * 2:
        raise UsageError(
            f"image_size={hparams.image_size}, but the input gives {shape[0]}x{shape[1]} images. "
            "Give the input the same image_size (tfds_images reads it too), or leave image_size "
            "out to build the model for the input's size."
        )
    if min(shape[:2]) < MIN_IMAGE_SIZE:
        raise UsageError(
            f"mobilenet_v2 needs images of at least {MIN_IMAGE_SIZE}x{MIN_IMAGE_SIZE}; the input "
            f"gives {shape[0]}x{shape[1]}. Resize them, such as with --input_fn=tfds_images "
            f"--params=image_size={MIN_IMAGE_SIZE * 3}."
        )
    return shape


def _tfds_builder(params: Mapping[str, Any], label_key: str) -> tfds.core.DatasetBuilder:
    """The TFDS builder of the input's `dataset`, to read its metadata."""
    name = params.get("dataset")
    if not name:
        raise UsageError(
            NUM_CLASSES_UNKNOWN.format(why="no num_classes nor dataset given", label_key=label_key)
        )
    try:
        return tfds.builder(name, data_dir=params.get("data_dir"))
    except tfds.core.registered.DatasetNotFoundError:
        raise UsageError(
            NUM_CLASSES_UNKNOWN.format(why=f"TFDS has no dataset {name!r}", label_key=label_key)
        ) from None


def num_classes(hparams: MobileNetParams, params: Mapping[str, Any]) -> int:
    """`num_classes`, or the number of classes of the input's TFDS `dataset`.

    Raises:
      UsageError: if neither gives a number of classes.
    """
    if hparams.num_classes is not None:
        return hparams.num_classes
    label_key = params.get("label_key", "label")
    builder = _tfds_builder(params, label_key)
    features = builder.info.features
    feature = features[label_key] if features and label_key in features else None
    if not isinstance(feature, tfds.features.ClassLabel):
        raise UsageError(
            NUM_CLASSES_UNKNOWN.format(
                why=f"{builder.name!r} has no ClassLabel feature {label_key!r}",
                label_key=label_key,
            )
        )
    return feature.num_classes


def train_examples(hparams: MobileNetParams, params: Mapping[str, Any]) -> int:
    """`num_train_examples`, or the size of the input's TFDS `split`.

    Raises:
      UsageError: if neither gives a size.
    """
    if hparams.num_train_examples is not None:
        return hparams.num_train_examples
    split = params.get("split", "train")
    builder = _tfds_builder(params, params.get("label_key", "label"))
    try:
        return builder.info.splits[split].num_examples
    except (KeyError, ValueError):
        raise UsageError(
            f"decay_per_epoch={hparams.decay_per_epoch} needs the examples of an epoch, and "
            f"split {split!r} of {builder.name!r} has no known size under data_dir "
            f"{params.get('data_dir')!r} (is it prepared?). Pass "
            "--params=num_train_examples=<N>."
        ) from None


def learning_rate(
    hparams: MobileNetParams, params: Mapping[str, Any]
) -> Union[float, tf.keras.optimizers.schedules.LearningRateSchedule]:
    """The constant rate, or the rate decayed by `decay_per_epoch` after every epoch.

    >>> print(learning_rate(MobileNetParams(decay_per_epoch=0.5, num_train_examples=640,
    ...                                     batch_size=64), {})(25).numpy())
    0.00025
    """
    if hparams.decay_per_epoch == 1:
        return hparams.learning_rate
    steps_per_epoch = max(1, train_examples(hparams, params) // hparams.batch_size)
    return tf.keras.optimizers.schedules.ExponentialDecay(
        hparams.learning_rate, steps_per_epoch, hparams.decay_per_epoch, staircase=True
    )


def make_optimizer(hparams: MobileNetParams, rate: Any) -> tf.keras.optimizers.legacy.Optimizer:
    """The legacy Keras optimizer `hparams.optimizer` with learning rate `rate`."""
    legacy = tf.keras.optimizers.legacy
    if hparams.optimizer == "adam":
        return legacy.Adam(rate)
    if hparams.optimizer == "rmsprop":
        return legacy.RMSprop(rate, momentum=hparams.momentum)
    if hparams.optimizer == "momentum":
        return legacy.SGD(rate, momentum=hparams.momentum)
    return legacy.SGD(rate)


def build_mobilenet_v2(params: Mapping[str, Any]) -> tf.keras.Model:
    """Returns MobileNetV2, compiled, with random weights and an input named `image`.

    Args:
      params: The `MobileNetParams` fields, the input's keys (`dataset`,
        `data_dir`, `split`, `label_key`) and `feature_shapes` (the driver
        infers it from the input_fn).

    Returns:
      The compiled model: sparse categorical cross-entropy on logits,
      accuracy.

    Raises:
      UsageError: for invalid parameters, images of the wrong size, or an
        unknown number of classes.
    """
    model_params = {k: v for k, v in params.items() if k != "feature_shapes"}
    hparams = from_params(MobileNetParams, model_params, "keras mobilenet_v2")
    shape = input_shape(hparams, params.get("feature_shapes", {}))
    model = tf.keras.applications.MobileNetV2(
        input_tensor=tf.keras.Input(shape=shape, name=FEATURE),
        alpha=hparams.alpha,
        include_top=True,
        weights=None,
        classes=num_classes(hparams, params),
        classifier_activation=None,
    )
    model.compile(
        optimizer=make_optimizer(hparams, learning_rate(hparams, params)),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model
