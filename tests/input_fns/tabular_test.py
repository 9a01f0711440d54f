"""The embedded tabular input: split, standardisation, sharding, order, errors."""

import numpy as np
import pytest
import tensorflow as tf

from estimator_dist.base.errors import UsageError
from input_fns import INPUT_FNS, prepare_input, tabular

TRAIN = tf.estimator.ModeKeys.TRAIN
EVAL = tf.estimator.ModeKeys.EVAL


def context(pipelines, pipeline_id):
    return tf.distribute.InputContext(pipelines, pipeline_id, pipelines)


def read(mode, params, input_context=None, batches=None):
    """Returns ([rows [b, features]], [labels [b]]) of the first batches."""
    dataset = tabular.input_fn(mode, input_context, params)
    if batches is not None:
        dataset = dataset.take(batches)
    rows, labels = [], []
    for features, label in dataset:
        rows.append(np.stack([value.numpy() for value in features.values()], axis=1))
        labels.append(label.numpy())
    return rows, labels


def test_is_registered_and_prepared():
    assert INPUT_FNS.get("tabular") is tabular.input_fn
    prepare_input("tabular", {"dataset": "iris"})
    with pytest.raises(UsageError, match="dataset 'wine' is not an embedded tabular dataset"):
        prepare_input("tabular", {"dataset": "wine"})


@pytest.mark.parametrize(
    "dataset, train, test, features, label_dtype",
    [
        ("breast_cancer", 455, 114, 30, tf.int32),
        ("diabetes", 354, 88, 10, tf.float32),
        ("iris", 120, 30, 4, tf.int32),
    ],
)
def test_split_names_and_dtypes(dataset, train, test, features, label_dtype):
    data = tabular.load(dataset)
    assert (len(data.train_x), len(data.test_x)) == (train, test)
    assert len(data.columns) == features
    assert all(name == tabular.safe_name(name) for name in data.columns)
    specs = tabular.input_fn(EVAL, None, {"dataset": dataset, "batch_size": 8}).element_spec
    assert list(specs[0]) == list(data.columns)
    assert all(
        spec.dtype == tf.float32 and spec.shape.as_list() == [None] for spec in specs[0].values()
    )
    assert specs[1].dtype == label_dtype
    assert tabular.feature_specs(dataset) == {
        name: tf.TensorSpec([None], tf.float32) for name in data.columns
    }


def test_safe_names():
    assert tabular.safe_name("mean radius") == "mean_radius"
    assert tabular.safe_name("sepal length (cm)") == "sepal_length_cm"
    assert "worst_concave_points" in tabular.load("breast_cancer").columns


def test_standardisation_uses_training_statistics_only():
    from sklearn.datasets import load_breast_cancer

    raw = load_breast_cancer().data
    train, test = tabular.split_indexes(len(raw))
    assert not set(train) & set(test) and len(train) + len(test) == len(raw)
    data = tabular.load("breast_cancer")
    np.testing.assert_allclose(data.mean, raw[train].mean(axis=0))
    np.testing.assert_allclose(data.std, raw[train].std(axis=0))
    np.testing.assert_allclose(
        data.test_x, (raw[test] - data.mean) / data.std, rtol=1e-5, atol=1e-5
    )
    np.testing.assert_allclose(data.train_x.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(data.train_x.std(axis=0), 1, atol=1e-5)
    # Statistics of all the data would differ: the test split is not in them.
    assert np.abs(raw.mean(axis=0) - data.mean).max() > 1e-3 * np.abs(data.mean).max()


def test_standardize_ignores_the_test_split_and_constant_columns():
    train = np.array([[1.0, 5.0], [3.0, 5.0]])
    scaled, test, mean, std = tabular.standardize(train, np.array([[100.0, 7.0]]))
    np.testing.assert_allclose(mean, [2.0, 5.0])
    np.testing.assert_allclose(std, [1.0, 1.0])
    np.testing.assert_allclose(scaled, [[-1.0, 0.0], [1.0, 0.0]])
    np.testing.assert_allclose(test, [[98.0, 2.0]])


def test_regression_target_is_standardised_with_training_statistics():
    from sklearn.datasets import load_diabetes

    target = load_diabetes().target
    train, test = tabular.split_indexes(len(target))
    data = tabular.load("diabetes")
    assert data.label_mean == pytest.approx(target[train].mean())
    assert data.label_std == pytest.approx(target[train].std())
    np.testing.assert_allclose(
        data.test_y, (target[test] - data.label_mean) / data.label_std, rtol=1e-5
    )


@pytest.mark.parametrize("shuffle_buffer", [0, 100])
def test_two_workers_batches_together_are_the_one_worker_batch(shuffle_buffer):
    # 9 steps of 64 cross the end of the 455 training examples, an odd number:
    # sharding each epoch (not the global stream) would misalign there.
    params = {"batch_size": 64, "shuffle_buffer": shuffle_buffer, "seed": 3}
    one_rows, one_labels = read(TRAIN, params, None, batches=9)
    shards = [read(TRAIN, params, context(2, index), batches=9) for index in range(2)]
    for step in range(9):
        assert [len(shard[0][step]) for shard in shards] == [32, 32]
        for index, (rows, labels) in enumerate(shards):
            np.testing.assert_array_equal(rows[step], one_rows[step][index::2])
            np.testing.assert_array_equal(labels[step], one_labels[step][index::2])


def test_no_shuffle_reads_the_training_split_in_order_and_repeats():
    data = tabular.load("iris")
    rows, labels = read(TRAIN, {"dataset": "iris", "batch_size": 40, "shuffle_buffer": 0}, None, 4)
    np.testing.assert_array_equal(np.concatenate(rows[:3]), data.train_x)
    np.testing.assert_array_equal(np.concatenate(labels[:3]), data.train_y)
    np.testing.assert_array_equal(rows[3], data.train_x[:40])


def test_shuffle_is_seeded_and_differs_between_epochs():
    params = {"dataset": "iris", "batch_size": 120, "shuffle_buffer": 1}
    first, _ = read(TRAIN, {**params, "seed": 1}, None, 2)
    again, _ = read(TRAIN, {**params, "seed": 1}, None, 2)
    other, _ = read(TRAIN, {**params, "seed": 2}, None, 1)
    np.testing.assert_array_equal(first[0], again[0])
    assert not np.array_equal(first[0], first[1])
    assert not np.array_equal(first[0], other[0])
    data = tabular.load("iris")
    for epoch in first:
        np.testing.assert_array_equal(np.sort(epoch, axis=0), np.sort(data.train_x, axis=0))


@pytest.mark.parametrize("mode, size", [(TRAIN, 120), (EVAL, 30)])
def test_worker_shards_are_disjoint_and_cover_one_epoch(mode, size):
    params = {"dataset": "iris", "batch_size": 6, "shuffle_buffer": 0}
    batches = size // 6
    shards = [
        np.concatenate(read(mode, params, context(2, index), batches)[0]) for index in range(2)
    ]
    assert [len(shard) for shard in shards] == [size // 2, size // 2]
    data = tabular.load("iris")
    expected = data.train_x if mode == TRAIN else data.test_x
    both = np.concatenate(shards)
    assert len(np.unique(both, axis=0)) == len(np.unique(expected, axis=0))
    np.testing.assert_array_equal(np.sort(both, axis=0), np.sort(expected, axis=0))


def test_eval_reads_the_test_split_once_with_a_last_partial_batch():
    rows, labels = read(EVAL, {"dataset": "breast_cancer", "batch_size": 50})
    assert [len(batch) for batch in rows] == [50, 50, 14]
    np.testing.assert_array_equal(np.concatenate(labels), tabular.load("breast_cancer").test_y)


def test_global_batch_is_divided_by_replicas():
    dataset = tabular.input_fn(TRAIN, tf.distribute.InputContext(2, 0, 4), {"batch_size": 32})
    features, _ = next(iter(dataset))
    assert features["mean_radius"].shape.as_list() == [8]


@pytest.mark.parametrize(
    "params, message",
    [
        ({"dataset": "wine"}, "dataset 'wine' is not an embedded tabular dataset; valid: "),
        ({"shuffle_buffer": -1}, "shuffle_buffer must be at least 0, received -1"),
        ({"record_read_ids": "/tmp/ids"}, "record_read_ids is not supported by the tabular"),
        ({"batch_size": 0}, "batch_size must be at least 1, received 0"),
    ],
)
def test_fail_with_invalid_params(params, message):
    with pytest.raises(UsageError, match="Invalid parameters for input_fn tabular") as raised:
        tabular.input_fn(TRAIN, None, params)
    assert message in str(raised.value)
