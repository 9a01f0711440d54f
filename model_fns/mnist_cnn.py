"""The CNN of TensorFlow's multi-worker Estimator tutorial, for any image size.

Conv(32, 3x3, ReLU) - MaxPool(2x2) - Flatten - Dense(64, ReLU) - Dense(classes).
It reads `features["image"]` (float32, NHWC) and integer labels, so it trains
on MNIST (28x28x1) and on the embedded 8x8 digits alike.

Loss under distribution: each replica computes the mean cross-entropy of its
own per-replica batch; the `tf.compat.v1.train` optimizer divides it by the
number of replicas and the gradients are summed across replicas, so the
update equals that of one worker on the whole global batch.

Example:
  >>> import tensorflow as tf
  >>> estimator = tf.estimator.Estimator(model_fn, params={"learning_rate": 0.01})
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import tensorflow as tf

from estimator_dist.base.params import from_params
from model_fns.optimizers import (
    micro_batches,
    minimize_in_micro_batches,
    with_gradient_accumulation,
)

OPTIMIZERS = ("adam", "sgd", "momentum")


@dataclasses.dataclass(frozen=True)
class CnnParams:
    """Hyper-parameters of `model_fn`.

    Attributes:
      learning_rate: Optimizer step size.
      optimizer: `adam`, `sgd`, or `momentum` (0.9).
      filters: Convolution filters.
      dense_units: Units of the hidden dense layer.
      num_classes: Output classes.
      seed: Seed of the weight initialisers, so that every run (and every
        worker) starts from the same weights; None draws fresh ones.
    """

    learning_rate: float = 0.001
    optimizer: str = "adam"
    filters: int = 32
    dense_units: int = 64
    num_classes: int = 10
    seed: Optional[int] = 0

    def __post_init__(self) -> None:
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be positive, received {self.learning_rate}.")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(
                f"optimizer {self.optimizer!r} is unknown; valid: {', '.join(OPTIMIZERS)}."
            )
        for name in ("filters", "dense_units", "num_classes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, received {getattr(self, name)}.")


def _initializer(seed: Optional[int], offset: int) -> tf.keras.initializers.Initializer:
    return tf.keras.initializers.GlorotUniform(seed=None if seed is None else seed + offset)


def build_layers(params: CnnParams) -> tf.keras.Sequential:
    """Returns the network as Keras layers (without input shape)."""
    return tf.keras.Sequential(
        [
            tf.keras.layers.Conv2D(
                params.filters,
                3,
                activation="relu",
                kernel_initializer=_initializer(params.seed, 0),
            ),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(
                params.dense_units,
                activation="relu",
                kernel_initializer=_initializer(params.seed, 1),
            ),
            tf.keras.layers.Dense(
                params.num_classes, kernel_initializer=_initializer(params.seed, 2)
            ),
        ],
        name="mnist_cnn",
    )


def make_optimizer(name: str, learning_rate: float) -> tf.compat.v1.train.Optimizer:
    """Returns a `tf.compat.v1.train` optimizer, which Estimator scales by 1/replicas."""
    if name == "adam":
        return tf.compat.v1.train.AdamOptimizer(learning_rate)
    if name == "momentum":
        return tf.compat.v1.train.MomentumOptimizer(learning_rate, momentum=0.9)
    return tf.compat.v1.train.GradientDescentOptimizer(learning_rate)


def model_fn(
    features: Any, labels: Optional[tf.Tensor], mode: str, params: Mapping[str, Any]
) -> tf.estimator.EstimatorSpec:
    """Estimator `model_fn` for TRAIN, EVAL (accuracy) and PREDICT.

    Args:
      features: `{"image": float32 [batch, height, width, channels]}` or the
        image tensor itself.
      labels: int [batch] class ids; None in PREDICT mode.
      mode: A `tf.estimator.ModeKeys` value.
      params: Hyper-parameters, see `CnnParams`; the driver's
        `gradient_accumulation_steps` and `micro_batches` are honoured
        (`model_fns.optimizers`).

    Returns:
      The `EstimatorSpec` for `mode`; PREDICT carries a `serving_default`
      signature with `class_ids`, `probabilities` and `logits`.
    """
    hparams = from_params(CnnParams, params, "mnist_cnn")
    images = features["image"] if isinstance(features, Mapping) else features
    network = build_layers(hparams)
    if mode == tf.estimator.ModeKeys.TRAIN:
        optimizer = with_gradient_accumulation(
            make_optimizer(hparams.optimizer, hparams.learning_rate), params
        )
        loss, train_op = minimize_in_micro_batches(
            optimizer,
            lambda images, labels: _mean_loss(network(images, training=True), labels),
            images,
            _class_ids(labels),
            micro_batches(params),
            tf.compat.v1.train.get_or_create_global_step(),
        )
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)
    logits = network(images, training=False)
    class_ids = tf.argmax(logits, axis=1)
    predictions = {
        "class_ids": class_ids,
        "probabilities": tf.nn.softmax(logits),
        "logits": logits,
    }
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(
            mode,
            predictions=predictions,
            export_outputs={"serving_default": tf.estimator.export.PredictOutput(predictions)},
        )
    labels = _class_ids(labels)
    accuracy = tf.compat.v1.metrics.accuracy(labels=labels, predictions=class_ids)
    return tf.estimator.EstimatorSpec(
        mode, loss=_mean_loss(logits, labels), eval_metric_ops={"accuracy": accuracy}
    )


def _class_ids(labels: tf.Tensor) -> tf.Tensor:
    return tf.cast(tf.reshape(labels, [-1]), tf.int32)


def _mean_loss(logits: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    return tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    )
