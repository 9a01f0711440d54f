"""Feature columns shared by the tabular model_fns and the canned estimators.

From feature specs (`{name: tf.TensorSpec}` of one batch; the driver passes
them as `params["feature_specs"]`, and a model_fn without them infers them
from the `features` it receives) this module builds two column sets:

- **deep** columns: a `numeric_column` per float feature (of the feature's
  per-example shape), and an `embedding_column` of a hash-bucket
  categorical column per string or integer feature;
- **wide** columns: a `bucketized_column` per scalar float feature (bucket
  `boundaries`, by default suited to standardised data), the hash-bucket
  categorical column of each string or integer feature, and the crosses
  named by `crosses`.

Columns are the TF 2 `tf.feature_column` kind, which both the
`tf.compat.v1.feature_column` layers and the canned V2 estimators accept.
Embedding tables get a seeded initialiser so that every worker starts alike.

Example:
  >>> import tensorflow as tf
  >>> specs = {"age": tf.TensorSpec([None], tf.float32)}
  >>> [column.name for column in wide_columns(specs, ColumnParams())]
  ['age_bucketized']
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import tensorflow as tf

from estimator_dist.base.errors import UsageError

#: Default bucket boundaries: quarter-to-one standard deviations of
#: standardised data.
DEFAULT_BOUNDARIES = "-1;-0.5;0;0.5;1"


def _split(text: str, separator: str) -> List[str]:
    return [item.strip() for item in text.split(separator) if item.strip()]


@dataclasses.dataclass(frozen=True)
class ColumnParams:
    """Settings of the feature columns, shared by every tabular model.

    Attributes:
      boundaries: Bucket boundaries of the wide (bucketized) float columns,
        increasing, separated by `;` (commas separate `--params` items), or
        a list in a params file.
      crosses: Crossed wide columns: groups of feature names joined by `*`,
        groups separated by `;`, such as `mean_radius*mean_texture`. Float
        features are crossed as their buckets.
      hash_bucket_size: Hash buckets of a string or integer feature.
      embedding_dimension: Size of the deep embedding of such a feature.
      cross_hash_bucket_size: Hash buckets of a crossed column.
    """

    boundaries: Union[str, list] = DEFAULT_BOUNDARIES
    crosses: str = ""
    hash_bucket_size: int = 100
    embedding_dimension: int = 8
    cross_hash_bucket_size: int = 1000

    def __post_init__(self) -> None:
        values = self.boundary_values()
        if any(later <= earlier for earlier, later in zip(values, values[1:])):
            raise ValueError(
                f"boundaries must increase strictly, received {self.boundaries!r}; expected "
                "such as -1;-0.5;0;0.5;1."
            )
        for group in _split(self.crosses, ";"):
            if len(_split(group, "*")) < 2:
                raise ValueError(
                    f"crosses item {group!r} names fewer than two features; received "
                    f"crosses={self.crosses!r}, expected name*name[;name*name...]."
                )
        for name in ("hash_bucket_size", "embedding_dimension", "cross_hash_bucket_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, received {getattr(self, name)}.")

    def boundary_values(self) -> Tuple[float, ...]:
        """The bucket boundaries as floats.

        Raises:
          ValueError: if a boundary is not a number or there is none.
        """
        items = (
            _split(self.boundaries, ";") if isinstance(self.boundaries, str) else self.boundaries
        )
        try:
            values = tuple(float(item) for item in items)
        except (TypeError, ValueError):
            raise ValueError(
                f"boundaries must be numbers separated by ';', received {self.boundaries!r}."
            ) from None
        if not values:
            raise ValueError(
                f"boundaries must hold at least one number, received {self.boundaries!r}."
            )
        return values

    def cross_groups(self) -> Tuple[Tuple[str, ...], ...]:
        """The `crosses` as tuples of feature names."""
        return tuple(tuple(_split(group, "*")) for group in _split(self.crosses, ";"))


def specs_from_features(features: Any) -> Dict[str, tf.TensorSpec]:
    """Infers the feature specs from the features a model_fn receives.

    Args:
      features: A dict of tensors (or one tensor, named `x`).

    Returns:
      `{name: tf.TensorSpec}` with the batch dimension left unknown.

    Example:
      >>> import tensorflow as tf
      >>> specs_from_features({"age": tf.zeros([4])})
      {'age': TensorSpec(shape=(None,), dtype=tf.float32, name=None)}
    """
    if not isinstance(features, Mapping):
        features = {"x": features}
    return {
        name: tf.TensorSpec([None, *value.shape[1:]], value.dtype)
        for name, value in sorted(features.items())
    }


def resolve_specs(
    feature_specs: Optional[Mapping[str, Any]], features: Any = None
) -> Dict[str, tf.TensorSpec]:
    """Returns the specs from params when given, else inferred from `features`.

    Raises:
      UsageError: if a spec is not a `tf.TensorSpec`, or there are no features.
    """
    if feature_specs is None:
        if features is None:
            raise UsageError(
                "No feature_specs and no features to infer them from; pass "
                "params['feature_specs'] = {name: tf.TensorSpec(...)}."
            )
        return specs_from_features(features)
    specs = dict(sorted(feature_specs.items()))
    for name, spec in specs.items():
        if not isinstance(spec, tf.TensorSpec):
            raise UsageError(
                f"feature_specs[{name!r}] is a {type(spec).__name__}; expected a tf.TensorSpec."
            )
    if not specs:
        raise UsageError("feature_specs is empty; the model needs at least one feature.")
    return specs


def _is_float(spec: tf.TensorSpec) -> bool:
    return spec.dtype.is_floating


def _is_scalar(spec: tf.TensorSpec) -> bool:
    return spec.shape.rank is not None and spec.shape.rank <= 1


def _check_dtype(name: str, spec: tf.TensorSpec) -> None:
    if not (spec.dtype.is_floating or spec.dtype.is_integer or spec.dtype == tf.string):
        raise UsageError(
            f"Feature {name!r} has dtype {spec.dtype.name}; the tabular feature columns "
            "take float, integer or string features."
        )


def _numeric(name: str, spec: tf.TensorSpec) -> Any:
    shape = tuple(spec.shape.as_list()[1:]) or (1,)
    if None in shape:
        raise UsageError(
            f"Feature {name!r} has shape {spec.shape}; a numeric column needs a known "
            "shape per example."
        )
    return tf.feature_column.numeric_column(name, shape=shape)


def _categorical(name: str, spec: tf.TensorSpec, params: ColumnParams) -> Any:
    dtype = tf.string if spec.dtype == tf.string else tf.int64
    return tf.feature_column.categorical_column_with_hash_bucket(
        name, params.hash_bucket_size, dtype=dtype
    )


def deep_columns(
    specs: Mapping[str, tf.TensorSpec], params: ColumnParams, seed: Optional[int] = 0
) -> list:
    """Dense columns for a DNN: numeric floats, embedded strings and integers.

    Args:
      specs: `{name: tf.TensorSpec}` of the features.
      params: Column settings.
      seed: Seed of the embedding initialisers; None draws fresh ones.

    Returns:
      A list of dense feature columns, sorted by feature name.

    Raises:
      UsageError: for a feature of another dtype or of unknown shape.

    Example:
      >>> import tensorflow as tf
      >>> [c.name for c in deep_columns({"city": tf.TensorSpec([None], tf.string)},
      ...                               ColumnParams())]
      ['city_embedding']
    """
    columns = []
    for offset, (name, spec) in enumerate(sorted(specs.items())):
        _check_dtype(name, spec)
        if _is_float(spec):
            columns.append(_numeric(name, spec))
            continue
        dimension = params.embedding_dimension
        initializer = tf.compat.v1.truncated_normal_initializer(
            stddev=1 / math.sqrt(dimension), seed=None if seed is None else seed + 100 + offset
        )
        columns.append(
            tf.feature_column.embedding_column(
                _categorical(name, spec, params), dimension, initializer=initializer
            )
        )
    return columns


def wide_columns(specs: Mapping[str, tf.TensorSpec], params: ColumnParams) -> list:
    """Sparse columns for a linear model: buckets, categories and crosses.

    Args:
      specs: `{name: tf.TensorSpec}` of the features.
      params: Column settings (`boundaries`, `crosses`, hash bucket sizes).

    Returns:
      A list of categorical feature columns: one per feature in name order,
      then the crosses in the order given.

    Raises:
      UsageError: if a cross names a feature that is not in `specs`, or a
        feature has another dtype or an unknown shape.

    Example:
      >>> import tensorflow as tf
      >>> specs = {"a": tf.TensorSpec([None], tf.float32),
      ...          "b": tf.TensorSpec([None], tf.string)}
      >>> [c.name for c in wide_columns(specs, ColumnParams(crosses="a*b"))]
      ['a_bucketized', 'b', 'a_bucketized_X_b']
    """
    by_name = {}
    for name, spec in sorted(specs.items()):
        _check_dtype(name, spec)
        if _is_float(spec):
            by_name[name] = tf.feature_column.bucketized_column(
                _numeric(name, spec), list(params.boundary_values())
            )
        else:
            by_name[name] = _categorical(name, spec, params)
    columns = list(by_name.values())
    for group in params.cross_groups():
        missing = [name for name in group if name not in by_name]
        if missing:
            raise UsageError(
                f"crosses names {', '.join(missing)}, which the data does not have; "
                f"features: {', '.join(sorted(by_name))}. Check --params=crosses=..."
            )
        keys = []
        for name in group:
            spec = specs[name]
            if _is_float(spec) and not _is_scalar(spec):
                raise UsageError(
                    f"crosses names {name!r}, a float feature of shape {spec.shape}; only "
                    "scalar float features can be crossed (as their buckets)."
                )
            # crossed_column takes bucketized columns, and string or integer
            # features by name (it cannot take a hashed categorical column).
            keys.append(by_name[name] if _is_float(spec) else name)
        columns.append(tf.feature_column.crossed_column(keys, params.cross_hash_bucket_size))
    return columns
