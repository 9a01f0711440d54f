"""The tutorial CNN as a compiled Keras model, for the `model_to_estimator` bridge.

>>> model = build_mnist_cnn({"feature_shapes": {"image": [8, 8, 1]}})
>>> model.input_names
['image']
"""

from __future__ import annotations

from typing import Any, Mapping

import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.base.params import from_params
from model_fns.mnist_cnn import CnnParams, build_layers


def build_mnist_cnn(params: Mapping[str, Any]) -> tf.keras.Model:
    """Returns the compiled tutorial CNN with an input named `image`.

    Args:
      params: `feature_shapes` (the driver infers it from the input_fn; the
        `image` entry is used, default [28, 28, 1]) plus the `CnnParams`
        fields; `optimizer` must be `sgd` or `adam`: legacy Keras optimizers,
        which `model_to_estimator` needs.
    """
    shape = tuple(params.get("feature_shapes", {}).get("image", (28, 28, 1)))
    model_params = {k: v for k, v in params.items() if k != "feature_shapes"}
    hparams = from_params(CnnParams, model_params, "keras mnist_cnn")
    inputs = tf.keras.Input(shape=shape, name="image")
    outputs = build_layers(hparams)(inputs)
    model = tf.keras.Model(inputs, outputs, name="keras_mnist_cnn")
    optimizers = {"adam": tf.keras.optimizers.legacy.Adam, "sgd": tf.keras.optimizers.legacy.SGD}
    if hparams.optimizer not in optimizers:
        raise UsageError(
            f"optimizer {hparams.optimizer!r} is not available for the Keras model; use "
            f"{' or '.join(optimizers)}."
        )
    optimizer_class = optimizers[hparams.optimizer]
    model.compile(
        optimizer=optimizer_class(learning_rate=hparams.learning_rate),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    return model
