"""Builders of TensorFlow's canned estimators on the shared feature columns.

Each builder is `build(config, params) -> tf.estimator.Estimator`: it takes
the job's `RunConfig` and the params dict (`params["feature_specs"]`, the
`{name: tf.TensorSpec}` of the input_fn's features, is required), builds the
columns of `model_fns.feature_columns`, and returns the real canned
estimator: `tf.estimator.DNNClassifier`, `LinearClassifier` or
`DNNLinearCombinedClassifier`, or the `*Regressor` with `head=regression`.
`params["warm_start_from"]` (a checkpoint directory or
`tf.estimator.WarmStartSettings`) is passed on.

These are the TF 2 ("V2") canned estimators, which take Keras optimizers
(`tf.keras.optimizers.legacy.*`, built here from the same `optimizer` and
`learning_rate` parameters as the tabular model_fns). Their heads reduce
the loss with `SUM_OVER_BATCH_SIZE` (the mean over the per-replica batch)
and, under a strategy, multiply it by 1/num_replicas_in_sync before
`optimizer.get_updates`, whose gradients are summed over replicas
(tensorflow_estimator `head/base_head.py` `create_estimator_spec_train_op`;
`canned/dnn_linear_combined.py` `_train_op_fn` does the same for the two
optimizers of the combined model). So, unlike a Keras optimizer in a custom
model_fn, a canned estimator on N workers steps like one worker on the
global batch. The sparse gradients of their linear and embedding columns
are all-reduced as dense tensors by the MultiWorkerMirroredStrategy of
`run_config.get_strategy` (`estimator_dist.tf_runtime.patches`).

Example:
  >>> import tensorflow as tf
  >>> from input_fns import tabular
  >>> estimator = build_dnn(tf.estimator.RunConfig(model_dir="/tmp/dnn"),  # doctest: +SKIP
  ...                       {"feature_specs": tabular.feature_specs("iris"), "n_classes": 3})
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional, Union

import tensorflow as tf

from estimator_dist.base.params import from_params
from model_fns.feature_columns import deep_columns, resolve_specs, wide_columns
from model_fns.tabular import DnnParams, LinearParams, WideDeepParams

_KERAS_OPTIMIZERS = {
    "adagrad": tf.keras.optimizers.legacy.Adagrad,
    "adam": tf.keras.optimizers.legacy.Adam,
    "ftrl": tf.keras.optimizers.legacy.Ftrl,
    "sgd": tf.keras.optimizers.legacy.SGD,
}

WarmStart = Optional[Union[str, tf.estimator.WarmStartSettings]]


def _check_canned(params: Any) -> None:
    if params.feature_specs is None:
        raise ValueError(
            "feature_specs is required: the {name: tf.TensorSpec} of the input_fn's "
            "features, which the driver fills in from the input_fn's element_spec."
        )
    if params.warm_start_from == "":
        raise ValueError(
            "warm_start_from must be a checkpoint directory, received an empty string; "
            "omit it to start from fresh weights."
        )


@dataclasses.dataclass(frozen=True)
class _CannedParams:
    """What a canned builder needs besides its model's params: `warm_start_from`."""

    warm_start_from: WarmStart = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_canned(self)


@dataclasses.dataclass(frozen=True)
class CannedDnnParams(_CannedParams, DnnParams):
    """`DnnParams` plus `warm_start_from`; `feature_specs` is required."""


@dataclasses.dataclass(frozen=True)
class CannedLinearParams(_CannedParams, LinearParams):
    """`LinearParams` plus `warm_start_from`; `feature_specs` is required."""


@dataclasses.dataclass(frozen=True)
class CannedWideDeepParams(_CannedParams, WideDeepParams):
    """`WideDeepParams` plus `warm_start_from`; `feature_specs` is required."""


def keras_optimizer(name: str, learning_rate: float) -> Callable[[], Any]:
    """A factory of the legacy Keras optimizer `name`, as the V2 canned estimators take.

    A factory, not an instance: the estimator calls it in each graph it
    builds. Its sparse gradients are all-reduced as dense tensors by the
    MultiWorkerMirroredStrategy of `run_config.get_strategy` (see
    `estimator_dist.tf_runtime.patches`), which multi-worker training needs.

    Example:
      >>> type(keras_optimizer("ftrl", 0.1)()).__name__
      'Ftrl'
    """
    return functools.partial(_KERAS_OPTIMIZERS[name], learning_rate=learning_rate)


def _canned(
    classifier: type,
    regressor: type,
    config: tf.estimator.RunConfig,
    hparams: Any,
    **arguments: Any,
) -> tf.estimator.Estimator:
    """`classifier`, or `regressor` for `head=regression`, with the arguments all three share."""
    if hparams.head == "regression":
        estimator, head = regressor, {}
    else:
        estimator, head = classifier, {"n_classes": hparams.n_classes}
    return estimator(config=config, warm_start_from=hparams.warm_start_from, **head, **arguments)


def build_dnn(config: tf.estimator.RunConfig, params: Mapping[str, Any]) -> tf.estimator.Estimator:
    """`tf.estimator.DNNClassifier` (or `DNNRegressor`) on the deep columns.

    Args:
      config: The job's RunConfig (model_dir, strategy, seed).
      params: `feature_specs` and the `CannedDnnParams` (hidden_units,
        dropout, optimizer, learning_rate, head, n_classes, warm_start_from).

    Returns:
      The canned estimator.

    Raises:
      UsageError: for invalid parameters or unsupported features.

    Example:
      >>> import tensorflow as tf
      >>> from input_fns import tabular
      >>> build_dnn(tf.estimator.RunConfig(), {  # doctest: +SKIP
      ...     "feature_specs": tabular.feature_specs(), "hidden_units": "32x16"})
    """
    hparams = from_params(CannedDnnParams, params, "canned_dnn")
    specs = resolve_specs(hparams.feature_specs)
    return _canned(
        tf.estimator.DNNClassifier,
        tf.estimator.DNNRegressor,
        config,
        hparams,
        hidden_units=list(hparams.units),
        feature_columns=deep_columns(specs, hparams, hparams.seed),
        optimizer=keras_optimizer(hparams.optimizer, hparams.learning_rate),
        dropout=hparams.dropout or None,
    )


def build_linear(
    config: tf.estimator.RunConfig, params: Mapping[str, Any]
) -> tf.estimator.Estimator:
    """`tf.estimator.LinearClassifier` (or `LinearRegressor`) on the wide columns.

    Args:
      config: The job's RunConfig.
      params: `feature_specs` and the `CannedLinearParams` (optimizer,
        learning_rate, boundaries, crosses, head, n_classes, warm_start_from).

    Returns:
      The canned estimator.

    Raises:
      UsageError: for invalid parameters or unsupported features.

    Example:
      >>> import tensorflow as tf
      >>> from input_fns import tabular
      >>> build_linear(tf.estimator.RunConfig(), {  # doctest: +SKIP
      ...     "feature_specs": tabular.feature_specs(), "crosses": "mean_radius*mean_texture"})
    """
    hparams = from_params(CannedLinearParams, params, "canned_linear")
    specs = resolve_specs(hparams.feature_specs)
    return _canned(
        tf.estimator.LinearClassifier,
        tf.estimator.LinearRegressor,
        config,
        hparams,
        feature_columns=wide_columns(specs, hparams),
        optimizer=keras_optimizer(hparams.optimizer, hparams.learning_rate),
    )


def build_wide_and_deep(
    config: tf.estimator.RunConfig, params: Mapping[str, Any]
) -> tf.estimator.Estimator:
    """`tf.estimator.DNNLinearCombinedClassifier` (or `...Regressor`): wide and deep.

    Args:
      config: The job's RunConfig.
      params: `feature_specs` and the `CannedWideDeepParams` (hidden_units,
        dropout, optimizer and learning_rate of the DNN, linear_optimizer and
        linear_learning_rate, boundaries, crosses, head, n_classes,
        warm_start_from).

    Returns:
      The canned estimator.

    Raises:
      UsageError: for invalid parameters or unsupported features.

    Example:
      >>> import tensorflow as tf
      >>> from input_fns import tabular
      >>> build_wide_and_deep(tf.estimator.RunConfig(), {  # doctest: +SKIP
      ...     "feature_specs": tabular.feature_specs(), "hidden_units": "32x16"})
    """
    hparams = from_params(CannedWideDeepParams, params, "canned_wide_and_deep")
    specs = resolve_specs(hparams.feature_specs)
    linear_rate = hparams.linear_learning_rate or hparams.learning_rate
    return _canned(
        tf.estimator.DNNLinearCombinedClassifier,
        tf.estimator.DNNLinearCombinedRegressor,
        config,
        hparams,
        linear_feature_columns=wide_columns(specs, hparams),
        linear_optimizer=keras_optimizer(hparams.linear_optimizer, linear_rate),
        dnn_feature_columns=deep_columns(specs, hparams, hparams.seed),
        dnn_optimizer=keras_optimizer(hparams.optimizer, hparams.learning_rate),
        dnn_hidden_units=list(hparams.units),
        dnn_dropout=hparams.dropout or None,
    )
