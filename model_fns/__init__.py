"""Reusable `model_fn`s and Keras model builders, by name.

`MODEL_FNS.get(name)` returns a `model_fn(features, labels, mode, params)`;
`KERAS_MODELS.get(name)` a function `build(params) -> compiled tf.keras.Model`;
`ESTIMATORS.get(name)` a function `build(config, params) -> tf.estimator.Estimator`.
Both also accept `package.module:function`.
"""

from estimator_dist.registry import Registry
from model_fns import keras_cnn, mnist_cnn

MODEL_FNS = Registry("model_fn", {"mnist_cnn": mnist_cnn.model_fn})
KERAS_MODELS = Registry("keras_model", {"mnist_cnn": keras_cnn.build_mnist_cnn})
ESTIMATORS = Registry("estimator", {})

__all__ = ["ESTIMATORS", "KERAS_MODELS", "MODEL_FNS"]
