"""Tabular `model_fn`s on feature columns: DNN, linear, and wide & deep.

Each reads a dict of features (float, integer or string tensors of shape
[batch] or [batch, k]), builds the shared columns of
`model_fns.feature_columns`, and ends in a classification or regression
`Head` (`head`, `n_classes`). Like the canned `DNNClassifier`,
`LinearClassifier` and `DNNLinearCombinedClassifier`, but:

- every optimizer is a `tf.compat.v1.train` optimizer, so that under a
  distribution strategy Estimator divides the per-replica mean loss by the
  number of replicas and N workers train as one worker on the global batch;
- every initialiser is seeded (`seed`), so every process builds the same
  initial weights whatever its graph seed.

Their hashed, bucketized, crossed and embedded columns have sparse
gradients; under MultiWorkerMirroredStrategy, `run_config.get_strategy`
makes the strategy all-reduce them as dense tensors (`estimator_dist.tf_runtime.patches`).

`wide_and_deep` sums the logits of a linear model on the wide columns and
of a DNN on the deep columns, and trains each part with its own optimizer,
as the canned `DNNLinearCombined*` estimators do (Ftrl for the linear part,
Adagrad for the DNN by default).

Example:
  >>> import tensorflow as tf
  >>> estimator = tf.estimator.Estimator(
  ...     wide_and_deep, params={"learning_rate": 0.05, "hidden_units": "16x8"})
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, List, Mapping, Optional, Tuple, Union

import tensorflow as tf

from estimator_dist.base.params import from_params
from model_fns.feature_columns import ColumnParams, deep_columns, resolve_specs, wide_columns
from model_fns.heads import Head, validate_head
from model_fns.optimizers import with_gradient_accumulation

OPTIMIZERS = ("adagrad", "adam", "ftrl", "sgd")
TRAIN = tf.estimator.ModeKeys.TRAIN


def _check_optimizer(field: str, name: str) -> None:
    if name not in OPTIMIZERS:
        raise ValueError(f"{field} {name!r} is unknown; valid: {', '.join(OPTIMIZERS)}.")


def parse_hidden_units(value: Union[str, int]) -> Tuple[int, ...]:
    """Parses `64x32` (or a single int) into layer sizes.

    Raises:
      ValueError: if an item is not a positive integer or there is none.

    Example:
      >>> parse_hidden_units("64x32")
      (64, 32)
    """
    items = [value] if isinstance(value, int) else str(value).split("x")
    try:
        units = tuple(int(item) for item in items)
    except ValueError:
        units = ()
    if not units or min(units) < 1:
        raise ValueError(
            f"hidden_units must be positive layer sizes joined by 'x', received {value!r}; "
            "expected such as 64x32."
        )
    return units


@dataclasses.dataclass(frozen=True)
class TabularModelParams(ColumnParams):
    """Hyper-parameters every tabular model_fn takes.

    Attributes:
      head: `classification` or `regression`.
      n_classes: Classes of a classification head (2: sigmoid, binary
        metrics; more: softmax, accuracy).
      learning_rate: Step size of the optimizer (of the DNN part in
        `wide_and_deep`).
      seed: Seed of the initialisers; None draws fresh weights per process.
      feature_specs: `{name: tf.TensorSpec}` of the features, as the driver
        passes them; None infers them from the features received.
    """

    head: str = "classification"
    n_classes: int = 2
    learning_rate: float = 0.05
    seed: Optional[int] = 0
    feature_specs: Optional[Mapping[str, Any]] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        validate_head(self.head, self.n_classes)
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be positive, received {self.learning_rate}.")


@dataclasses.dataclass(frozen=True)
class DnnParams(TabularModelParams):
    """Hyper-parameters of `dnn_classifier`.

    Attributes:
      hidden_units: Hidden layer sizes joined by `x`, such as `64x32`.
      dropout: Fraction of each hidden layer's outputs dropped in training.
      optimizer: `adagrad`, `adam`, `ftrl` or `sgd`.
    """

    hidden_units: Union[str, int] = "64x32"
    dropout: float = 0.0
    optimizer: str = "adagrad"

    def __post_init__(self) -> None:
        super().__post_init__()
        parse_hidden_units(self.hidden_units)
        if not 0 <= self.dropout < 1:
            raise ValueError(f"dropout must be in [0, 1), received {self.dropout}.")
        _check_optimizer("optimizer", self.optimizer)

    @property
    def units(self) -> Tuple[int, ...]:
        """The hidden layer sizes."""
        return parse_hidden_units(self.hidden_units)


@dataclasses.dataclass(frozen=True)
class LinearParams(TabularModelParams):
    """Hyper-parameters of `linear_classifier`.

    Attributes:
      optimizer: `ftrl`, `adagrad`, `adam` or `sgd`.
    """

    optimizer: str = "ftrl"

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_optimizer("optimizer", self.optimizer)


@dataclasses.dataclass(frozen=True)
class WideDeepParams(DnnParams):
    """Hyper-parameters of `wide_and_deep`.

    Attributes:
      linear_optimizer: Optimizer of the linear part: `ftrl` (default),
        `adagrad`, `adam` or `sgd`.
      linear_learning_rate: Its step size; None uses `learning_rate`.
    """

    linear_optimizer: str = "ftrl"
    linear_learning_rate: Optional[float] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_optimizer("linear_optimizer", self.linear_optimizer)
        if self.linear_learning_rate is not None and self.linear_learning_rate <= 0:
            raise ValueError(
                f"linear_learning_rate must be positive or None, received "
                f"{self.linear_learning_rate}."
            )


def make_optimizer(name: str, learning_rate: float) -> tf.compat.v1.train.Optimizer:
    """Returns a `tf.compat.v1.train` optimizer, which Estimator scales by 1/replicas.

    Example:
      >>> type(make_optimizer("ftrl", 0.1)).__name__
      'FtrlOptimizer'
    """
    _check_optimizer("optimizer", name)
    if name == "adagrad":
        return tf.compat.v1.train.AdagradOptimizer(learning_rate)
    if name == "adam":
        return tf.compat.v1.train.AdamOptimizer(learning_rate)
    if name == "ftrl":
        return tf.compat.v1.train.FtrlOptimizer(learning_rate)
    return tf.compat.v1.train.GradientDescentOptimizer(learning_rate)


def _initializer(seed: Optional[int], offset: int) -> tf.keras.initializers.Initializer:
    return tf.keras.initializers.GlorotUniform(seed=None if seed is None else seed + offset)


def _new_variables(build: Callable[[], tf.Tensor]) -> Tuple[tf.Tensor, List[tf.Variable]]:
    """Runs `build` and returns its result and the trainable variables it created."""
    before = {variable.name for variable in tf.compat.v1.trainable_variables()}
    result = build()
    created = [v for v in tf.compat.v1.trainable_variables() if v.name not in before]
    return result, created


def dnn_logits(
    features: Mapping[str, tf.Tensor], params: DnnParams, logits_dimension: int, training: bool
) -> tf.Tensor:
    """The DNN on the deep columns: ReLU hidden layers, then linear logits."""
    specs = resolve_specs(params.feature_specs, features)
    with tf.compat.v1.variable_scope("dnn"):
        net = tf.compat.v1.feature_column.input_layer(
            features, deep_columns(specs, params, params.seed)
        )
        for index, units in enumerate(params.units):
            layer = tf.keras.layers.Dense(
                units,
                activation="relu",
                kernel_initializer=_initializer(params.seed, index),
                name=f"hiddenlayer_{index}",
            )
            net = layer(net)
            if params.dropout:
                seed = None if params.seed is None else params.seed + 50 + index
                net = tf.keras.layers.Dropout(params.dropout, seed=seed)(net, training=training)
        logits = tf.keras.layers.Dense(
            logits_dimension,
            kernel_initializer=_initializer(params.seed, len(params.units)),
            name="logits",
        )
        return logits(net)


def linear_logits(
    features: Mapping[str, tf.Tensor], params: TabularModelParams, logits_dimension: int
) -> tf.Tensor:
    """The linear model on the wide columns; weights and bias start at zero."""
    specs = resolve_specs(params.feature_specs, features)
    with tf.compat.v1.variable_scope("linear"):
        return tf.compat.v1.feature_column.linear_model(
            features, wide_columns(specs, params), units=logits_dimension
        )


def _optimizer(
    name: str, learning_rate: float, params: Mapping[str, Any]
) -> tf.compat.v1.train.Optimizer:
    """`make_optimizer`, accumulating gradients when `params` asks for it."""
    return with_gradient_accumulation(make_optimizer(name, learning_rate), params)


def _single_optimizer_spec(
    head: Head,
    mode: str,
    logits: tf.Tensor,
    labels: Optional[tf.Tensor],
    hparams: Union[DnnParams, LinearParams],
    params: Mapping[str, Any],
) -> tf.estimator.EstimatorSpec:
    """The spec of a model whose weights all train with `optimizer` and `learning_rate`."""
    optimizer = _optimizer(hparams.optimizer, hparams.learning_rate, params)

    def train_op_fn(loss: tf.Tensor) -> tf.Operation:
        return optimizer.minimize(loss, global_step=tf.compat.v1.train.get_or_create_global_step())

    return head.create_estimator_spec(mode, logits, labels, train_op_fn)


def _as_dict(features: Any) -> Mapping[str, tf.Tensor]:
    return features if isinstance(features, Mapping) else {"x": features}


def dnn_classifier(
    features: Any, labels: Optional[tf.Tensor], mode: str, params: Mapping[str, Any]
) -> tf.estimator.EstimatorSpec:
    """A feed-forward network on the deep columns (`DNNClassifier`'s model).

    Args:
      features: `{name: tensor [batch] or [batch, k]}`; float features are
        numeric, string and integer features are embedded.
      labels: int class ids, or float targets for `head=regression`; None
        in PREDICT mode.
      mode: A `tf.estimator.ModeKeys` value.
      params: Hyper-parameters, see `DnnParams`.

    Returns:
      The `EstimatorSpec` for `mode`.

    Raises:
      UsageError: for invalid parameters or unsupported features.

    Example:
      >>> import tensorflow as tf
      >>> estimator = tf.estimator.Estimator(
      ...     dnn_classifier, params={"hidden_units": "64x32", "learning_rate": 0.05})
    """
    hparams = from_params(DnnParams, params, "dnn_classifier")
    head = Head(hparams.head, hparams.n_classes)
    logits = dnn_logits(_as_dict(features), hparams, head.logits_dimension, mode == TRAIN)
    return _single_optimizer_spec(head, mode, logits, labels, hparams, params)


def linear_classifier(
    features: Any, labels: Optional[tf.Tensor], mode: str, params: Mapping[str, Any]
) -> tf.estimator.EstimatorSpec:
    """A linear model on the wide columns (`LinearClassifier`'s model).

    Args:
      features: `{name: tensor [batch] or [batch, k]}`; float features are
        bucketized, string and integer features hashed, `crosses` crossed.
      labels: int class ids, or float targets for `head=regression`; None
        in PREDICT mode.
      mode: A `tf.estimator.ModeKeys` value.
      params: Hyper-parameters, see `LinearParams`.

    Returns:
      The `EstimatorSpec` for `mode`.

    Raises:
      UsageError: for invalid parameters or unsupported features.

    Example:
      >>> import tensorflow as tf
      >>> estimator = tf.estimator.Estimator(
      ...     linear_classifier, params={"optimizer": "ftrl", "learning_rate": 0.1})
    """
    hparams = from_params(LinearParams, params, "linear_classifier")
    head = Head(hparams.head, hparams.n_classes)
    logits = linear_logits(_as_dict(features), hparams, head.logits_dimension)
    return _single_optimizer_spec(head, mode, logits, labels, hparams, params)


def wide_and_deep(
    features: Any, labels: Optional[tf.Tensor], mode: str, params: Mapping[str, Any]
) -> tf.estimator.EstimatorSpec:
    """Linear model on the wide columns plus DNN on the deep columns, logits summed.

    Args:
      features: `{name: tensor [batch] or [batch, k]}`.
      labels: int class ids, or float targets for `head=regression`; None
        in PREDICT mode.
      mode: A `tf.estimator.ModeKeys` value.
      params: Hyper-parameters, see `WideDeepParams`.

    Returns:
      The `EstimatorSpec` for `mode`; the training op applies
      `linear_optimizer` to the linear weights and `optimizer` to the DNN
      weights, and advances the global step once.

    Raises:
      UsageError: for invalid parameters or unsupported features.

    Example:
      >>> import tensorflow as tf
      >>> estimator = tf.estimator.Estimator(
      ...     wide_and_deep, params={"hidden_units": "32x16", "crosses": "a*b"})
    """
    hparams = from_params(WideDeepParams, params, "wide_and_deep")
    head = Head(hparams.head, hparams.n_classes)
    features = _as_dict(features)
    linear, linear_variables = _new_variables(
        lambda: linear_logits(features, hparams, head.logits_dimension)
    )
    dnn, dnn_variables = _new_variables(
        lambda: dnn_logits(features, hparams, head.logits_dimension, mode == TRAIN)
    )
    dnn_optimizer = _optimizer(hparams.optimizer, hparams.learning_rate, params)
    linear_optimizer = _optimizer(
        hparams.linear_optimizer, hparams.linear_learning_rate or hparams.learning_rate, params
    )

    def train_op_fn(loss: tf.Tensor) -> tf.Operation:
        global_step = tf.compat.v1.train.get_or_create_global_step()
        return tf.group(
            dnn_optimizer.minimize(loss, global_step=global_step, var_list=dnn_variables),
            linear_optimizer.minimize(loss, var_list=linear_variables),
        )

    return head.create_estimator_spec(mode, linear + dnn, labels, train_op_fn)
