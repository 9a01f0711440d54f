"""Reusable `model_fn`s and Keras model builders, by name.

`MODEL_FNS.get(name)` returns a `model_fn(features, labels, mode, params)`;
`KERAS_MODELS.get(name)` a function `build(params) -> compiled tf.keras.Model`.
Both also accept `package.module:function`.
"""

from estimator_dist.registry import Registry
from model_fns import keras_cnn, mnist_cnn, resnet_cifar

MODEL_FNS = Registry(
    "model_fn", {"mnist_cnn": mnist_cnn.model_fn, "resnet_cifar": resnet_cifar.model_fn}
)
KERAS_MODELS = Registry("keras_model", {"mnist_cnn": keras_cnn.build_mnist_cnn})

__all__ = ["KERAS_MODELS", "MODEL_FNS"]
