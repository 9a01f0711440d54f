"""Embedded tabular datasets from scikit-learn's wheel, as feature-column input.

The data ship inside scikit-learn, so they are there offline:

| dataset | task | examples (train/test) | features | label |
|---|---|---|---|---|
| `breast_cancer` (default) | binary classification | 455 / 114 | 30 float | int32 0/1 |
| `diabetes` | regression | 354 / 88 | 10 float | float32, standardised |
| `iris` | 3-class classification | 120 / 30 | 4 float | int32 0..2 |

The split is fixed (seeded permutation, the first 20% is the test split).
Every feature is standardised with the mean and standard deviation of the
training split only, so nothing of the test split leaks into training; the
diabetes target is standardised the same way (an rmse of 1.0 is one
training-set standard deviation, `TabularData.label_std` units). Column
names are made safe for TensorFlow: `mean radius` becomes `mean_radius`.

Sharding: all of the data is one in-memory array, so there are no files to
split. Every worker builds the same global stream of example indexes (the
training split in order, or shuffled each epoch with a stateless shuffle
seeded by `seed`, repeated forever) and worker i keeps the positions i,
i+N, i+2N, ... of that stream. So the N workers' per-worker batches of one
step together are exactly the batch one worker reads with the whole global
batch, at every step and across epoch boundaries, shuffled or not; this is
what the 2-workers-versus-1-worker equivalence tests rely on. With
`shuffle_buffer=0` the order is the training split's fixed order; any
positive `shuffle_buffer` shuffles the whole training split each epoch (the
data is in memory: the buffer is always the whole split). The evaluation
split is read once, sharded the same way.

Example:
  >>> import tensorflow as tf
  >>> features, label = next(iter(input_fn(  # doctest: +SKIP
  ...     tf.estimator.ModeKeys.TRAIN, None, {"batch_size": 8, "shuffle_buffer": 0})))
  >>> features["mean_radius"].shape, label.dtype  # doctest: +SKIP
  (TensorShape([8]), tf.int32)
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Callable, ClassVar, Dict, Mapping, Optional, Tuple

import numpy as np
import tensorflow as tf

from estimator_dist.base.params import from_params
from input_fns.pipeline import (
    TRAIN,
    PipelineParams,
    Sharding,
    batch_sizes,
    log_input,
    make_options,
)

#: Fraction of the examples held out as the test split.
TEST_FRACTION = 0.2
#: Seed of the fixed train/test split; independent of `seed` so that every
#: run, whatever its seed, trains and evaluates on the same examples.
SPLIT_SEED = 0


def _loader(name: str) -> Callable[[], Tuple[np.ndarray, np.ndarray, list]]:
    def load() -> Tuple[np.ndarray, np.ndarray, list]:
        from sklearn import datasets

        if name == "diabetes":
            # The raw measurements: the default copy is already scaled with
            # statistics of all 442 examples, test split included.
            bunch = datasets.load_diabetes(scaled=False)
        else:
            bunch = getattr(datasets, f"load_{name}")()
        return bunch.data, bunch.target, list(bunch.feature_names)

    return load


#: Dataset name: (task, number of classes or 0 for regression, loader).
DATASETS: Mapping[str, Tuple[str, int, Callable]] = {
    "breast_cancer": ("classification", 2, _loader("breast_cancer")),
    "diabetes": ("regression", 0, _loader("diabetes")),
    "iris": ("classification", 3, _loader("iris")),
}


@dataclasses.dataclass(frozen=True)
class TabularParams(PipelineParams):
    """Settings of the `tabular` input_fn.

    Attributes:
      dataset: `breast_cancer`, `diabetes` or `iris`.
    """

    dataset: str = "breast_cancer"

    #: 0 reads the training split in its fixed order.
    MIN_SHUFFLE_BUFFER: ClassVar[int] = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dataset not in DATASETS:
            raise ValueError(
                f"dataset {self.dataset!r} is not an embedded tabular dataset; valid: "
                f"{', '.join(DATASETS)}."
            )
        if self.record_read_ids is not None:
            raise ValueError(
                "record_read_ids is not supported by the tabular input_fn: its shards are "
                "positions in one in-memory stream, not examples of files; "
                f"received {self.record_read_ids!r}. Omit it."
            )


@dataclasses.dataclass(frozen=True)
class TabularData:
    """One dataset, split and standardised with training statistics.

    Attributes:
      task: `classification` or `regression`.
      num_classes: Classes of a classification task; 0 for regression.
      columns: Safe feature names, in column order.
      train_x: float32 [train, features], standardised.
      train_y: Training labels (int32, or standardised float32).
      test_x: float32 [test, features], standardised with training statistics.
      test_y: Test labels, like `train_y`.
      mean: Training mean of each raw feature.
      std: Training standard deviation of each raw feature.
      label_mean: Training mean of a regression target (0 for classification).
      label_std: Training standard deviation of a regression target (1 for
        classification).
    """

    task: str
    num_classes: int
    columns: Tuple[str, ...]
    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    label_mean: float
    label_std: float


def safe_name(name: str) -> str:
    """Turns a column title into a name TensorFlow accepts in scopes and signatures.

    Example:
      >>> safe_name("sepal length (cm)")
      'sepal_length_cm'
    """
    return re.sub(r"[^0-9a-zA-Z]+", "_", name).strip("_").lower()


def split_indexes(num_examples: int) -> Tuple[np.ndarray, np.ndarray]:
    """Returns (train, test) example indexes of the fixed seeded split."""
    order = np.random.RandomState(SPLIT_SEED).permutation(num_examples)
    num_test = int(round(num_examples * TEST_FRACTION))
    return order[num_test:], order[:num_test]


def standardize(
    train: np.ndarray, test: np.ndarray
) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Standardises both splits with the mean and standard deviation of `train` only.

    Returns:
      (train, test, mean, std); a constant column gets std 1.
    """
    mean = train.mean(axis=0)
    std = train.std(axis=0)
    std = np.where(std > 0, std, 1.0)
    return (train - mean) / std, (test - mean) / std, mean, std


@functools.cache
def load(dataset: str) -> TabularData:
    """Loads, splits and standardises one embedded dataset (cached per process).

    Args:
      dataset: A key of `DATASETS`.

    Returns:
      The `TabularData`.

    Raises:
      ValueError: if `dataset` is unknown.

    Example:
      >>> load("iris").train_x.shape  # doctest: +SKIP
      (120, 4)
    """
    if dataset not in DATASETS:
        raise ValueError(f"Unknown tabular dataset {dataset!r}; valid: {', '.join(DATASETS)}.")
    task, num_classes, loader = DATASETS[dataset]
    x, y, names = loader()
    train, test = split_indexes(len(x))
    train_x, test_x, mean, std = standardize(x[train], x[test])
    if task == "regression":
        label_mean, label_std = float(y[train].mean()), float(y[train].std())
        train_y = ((y[train] - label_mean) / label_std).astype(np.float32)
        test_y = ((y[test] - label_mean) / label_std).astype(np.float32)
    else:
        label_mean, label_std = 0.0, 1.0
        train_y, test_y = y[train].astype(np.int32), y[test].astype(np.int32)
    return TabularData(
        task=task,
        num_classes=num_classes,
        columns=tuple(safe_name(name) for name in names),
        train_x=train_x.astype(np.float32),
        train_y=train_y,
        test_x=test_x.astype(np.float32),
        test_y=test_y,
        mean=mean,
        std=std,
        label_mean=label_mean,
        label_std=label_std,
    )


def feature_specs(dataset: str = "breast_cancer") -> Dict[str, tf.TensorSpec]:
    """The `{name: tf.TensorSpec}` of one batch of a dataset's features.

    Example:
      >>> feature_specs("iris")["petal_width_cm"]  # doctest: +SKIP
      TensorSpec(shape=(None,), dtype=tf.float32, name=None)
    """
    return {name: tf.TensorSpec([None], tf.float32) for name in load(dataset).columns}


def prepare(params: Mapping[str, Any]) -> TabularData:
    """Checks the parameters and loads the dataset, before any worker starts.

    Raises:
      UsageError: for invalid parameters.
    """
    settings = from_params(TabularParams, params, "input_fn tabular", strict=False)
    return load(settings.dataset)


def _index_stream(num_examples: int, mode: str, settings: TabularParams) -> tf.data.Dataset:
    """The global order of example indexes that every pipeline builds alike."""
    if mode != TRAIN:
        return tf.data.Dataset.range(num_examples)
    if settings.shuffle_buffer == 0:
        return tf.data.Dataset.range(num_examples).repeat()
    # Stateless, so the order depends only on (seed, epoch): every worker and
    # a one-worker run draw the same permutations whatever their graph seed.
    seed = tf.constant(0 if settings.seed is None else settings.seed, tf.int64)

    def epoch(index: tf.Tensor) -> tf.data.Dataset:
        order = tf.random.experimental.stateless_shuffle(
            tf.range(num_examples, dtype=tf.int64), seed=tf.stack([seed, index])
        )
        return tf.data.Dataset.from_tensor_slices(order)

    return tf.data.Dataset.range(2**62).flat_map(epoch)


def input_fn(
    mode: str,
    input_context: Optional[tf.distribute.InputContext] = None,
    params: Optional[Mapping[str, Any]] = None,
) -> tf.data.Dataset:
    """`input_fn` of an embedded scikit-learn table, one float32 feature per column.

    Args:
      mode: TRAIN reads the training split forever; EVAL and PREDICT read the
        test split once.
      input_context: This worker's pipeline id and count, or None.
      params: `dataset` (`breast_cancer`), `batch_size` (global),
        `shuffle_buffer` (0: fixed order), `seed` (shuffle order).

    Returns:
      Batches of `({column: float32 [b]}, label [b])`, the label int32 for
      classification and float32 for regression.

    Raises:
      UsageError: for invalid parameters.
      ValueError: if the global batch does not divide evenly over the replicas.

    Example:
      >>> import tensorflow as tf
      >>> input_fn(tf.estimator.ModeKeys.TRAIN, None,  # doctest: +SKIP
      ...          {"dataset": "diabetes", "batch_size": 32, "shuffle_buffer": 0})
    """
    settings = from_params(TabularParams, params or {}, "input_fn tabular", strict=False)
    data = load(settings.dataset)
    pipelines = input_context.num_input_pipelines if input_context else 1
    pipeline_id = input_context.input_pipeline_id if input_context else 0
    sharding = Sharding(pipelines, pipeline_id, False, 0)
    _, per_replica = batch_sizes(settings.batch_size, input_context)
    training = mode == TRAIN
    x, y = (data.train_x, data.train_y) if training else (data.test_x, data.test_y)
    split = f"{settings.dataset} {'train' if training else 'test'} ({len(x)} examples)"
    log_input("tabular", mode, split, settings, input_context, sharding)
    columns = data.columns
    x_table = tf.constant(x)
    y_table = tf.constant(y)

    def gather(indexes: tf.Tensor) -> tuple:
        rows = tf.gather(x_table, indexes)
        features = {name: rows[:, column] for column, name in enumerate(columns)}
        return features, tf.gather(y_table, indexes)

    stream = _index_stream(len(x), mode, settings)
    if pipelines > 1:
        stream = stream.shard(pipelines, pipeline_id)
    batches = stream.batch(per_replica, drop_remainder=training).map(gather)
    return batches.prefetch(tf.data.AUTOTUNE).with_options(make_options(0))
