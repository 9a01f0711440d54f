"""Reusable `model_fn`s, Keras model builders and canned estimators, by name.

`MODEL_FNS.get(name)` returns a `model_fn(features, labels, mode, params)`;
`KERAS_MODELS.get(name)` a function `build(params) -> compiled tf.keras.Model`;
`ESTIMATORS.get(name)` a function `build(config, params) -> tf.estimator.Estimator`
(a canned estimator; `params["feature_specs"]` holds the input's feature specs).
All three also accept `package.module:function`.

Registered names:

* `MODEL_FNS`: `mnist_cnn`, `resnet_cifar`, `dnn_classifier`, `linear_classifier`,
  `wide_and_deep`
* `KERAS_MODELS`: `mnist_cnn`, `mobilenet_v2`
* `ESTIMATORS`: `canned_dnn`, `canned_linear`, `canned_wide_and_deep`
"""

from estimator_dist.base.registry import Registry
from model_fns import canned, keras_cnn, mnist_cnn, mobilenet_v2, resnet_cifar, tabular

MODEL_FNS = Registry(
    "model_fn",
    {
        "mnist_cnn": mnist_cnn.model_fn,
        "resnet_cifar": resnet_cifar.model_fn,
        "dnn_classifier": tabular.dnn_classifier,
        "linear_classifier": tabular.linear_classifier,
        "wide_and_deep": tabular.wide_and_deep,
    },
)
KERAS_MODELS = Registry(
    "keras_model",
    {"mnist_cnn": keras_cnn.build_mnist_cnn, "mobilenet_v2": mobilenet_v2.build_mobilenet_v2},
)
ESTIMATORS = Registry(
    "estimator",
    {
        "canned_dnn": canned.build_dnn,
        "canned_linear": canned.build_linear,
        "canned_wide_and_deep": canned.build_wide_and_deep,
    },
)

__all__ = ["ESTIMATORS", "KERAS_MODELS", "MODEL_FNS"]
