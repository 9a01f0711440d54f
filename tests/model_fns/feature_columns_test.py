"""Shared feature columns: parameters, deep and wide columns, crosses, specs."""

import numpy as np
import pytest
import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.base.params import from_params
from model_fns import feature_columns
from model_fns.feature_columns import ColumnParams, deep_columns, resolve_specs, wide_columns

FLOAT = tf.TensorSpec([None], tf.float32)
STRING = tf.TensorSpec([None], tf.string)
INT = tf.TensorSpec([None], tf.int32)


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("boundaries", "1;0", "boundaries must increase strictly, received '1;0'"),
        ("boundaries", "0;0", "boundaries must increase strictly, received '0;0'"),
        ("boundaries", "a;1", "boundaries must be numbers separated by ';', received 'a;1'"),
        ("boundaries", "", "boundaries must hold at least one number, received ''"),
        ("crosses", "a*b;c", "crosses item 'c' names fewer than two features"),
        ("hash_bucket_size", 0, "hash_bucket_size must be at least 1, received 0"),
        ("embedding_dimension", 0, "embedding_dimension must be at least 1, received 0"),
        ("cross_hash_bucket_size", -1, "cross_hash_bucket_size must be at least 1, received -1"),
    ],
)
def test_fail_with_invalid_column_params(field, value, message):
    with pytest.raises(UsageError) as raised:
        from_params(ColumnParams, {field: value}, "columns")
    assert message in str(raised.value)


def test_boundaries_from_string_or_list():
    assert ColumnParams().boundary_values() == (-1.0, -0.5, 0.0, 0.5, 1.0)
    assert ColumnParams(boundaries="0; 2.5").boundary_values() == (0.0, 2.5)
    assert ColumnParams(boundaries=[-1, 1]).boundary_values() == (-1.0, 1.0)
    assert ColumnParams(crosses="a*b; c*d*e").cross_groups() == (("a", "b"), ("c", "d", "e"))


def test_deep_columns_are_numeric_for_floats_and_embedded_otherwise():
    specs = {"z": FLOAT, "city": STRING, "count": INT, "v": tf.TensorSpec([None, 3], tf.float32)}
    columns = deep_columns(specs, ColumnParams(embedding_dimension=4))
    assert [column.name for column in columns] == [
        "city_embedding",
        "count_embedding",
        "v",
        "z",
    ]
    assert columns[0].dimension == 4
    assert columns[0].categorical_column.hash_bucket_size == 100
    assert columns[1].categorical_column.dtype == tf.int64
    assert columns[2].shape == (3,)
    assert columns[3].shape == (1,)


def test_wide_columns_bucketize_floats_and_cross_named_pairs():
    specs = {"a": FLOAT, "b": FLOAT, "city": STRING}
    params = ColumnParams(boundaries="-1;1", crosses="a*b;a*city", cross_hash_bucket_size=50)
    columns = wide_columns(specs, params)
    assert [column.name for column in columns] == [
        "a_bucketized",
        "b_bucketized",
        "city",
        "a_bucketized_X_b_bucketized",
        "a_bucketized_X_city",
    ]
    assert columns[0].boundaries == (-1.0, 1.0)
    assert columns[3].hash_bucket_size == 50


def test_wide_buckets_of_standardised_values():
    with tf.Graph().as_default():
        column = wide_columns({"a": FLOAT}, ColumnParams())[0]
        dense = tf.compat.v1.feature_column.input_layer(
            {"a": tf.constant([-3.0, -0.7, 0.2, 0.7, 5.0])},
            [tf.feature_column.indicator_column(column)],
        )
        with tf.compat.v1.Session() as session:
            one_hot = session.run(dense)
    np.testing.assert_array_equal(one_hot.argmax(axis=1), [0, 1, 3, 4, 5])


def test_crosses_of_integer_and_string_features_build_and_run():
    specs = {"a": FLOAT, "city": STRING, "n": INT}
    params = ColumnParams(crosses="a*city;n*city;a*n")
    with tf.Graph().as_default():
        features = {
            "a": tf.constant([0.1, -2.0]),
            "city": tf.constant(["x", "y"]),
            "n": tf.constant([1, 2], tf.int32),
        }
        logits = tf.compat.v1.feature_column.linear_model(features, wide_columns(specs, params))
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            assert session.run(logits).shape == (2, 1)


def test_fail_with_unknown_cross_feature():
    with pytest.raises(UsageError, match="crosses names c, which the data does not have"):
        wide_columns({"a": FLOAT, "b": FLOAT}, ColumnParams(crosses="a*c"))


def test_fail_with_unsupported_dtype():
    with pytest.raises(UsageError, match="Feature 'flag' has dtype bool"):
        deep_columns({"flag": tf.TensorSpec([None], tf.bool)}, ColumnParams())


def test_specs_inferred_from_features_or_taken_from_params():
    features = {"b": tf.zeros([4]), "a": tf.zeros([4, 2], tf.int64)}
    assert feature_columns.specs_from_features(features) == {
        "a": tf.TensorSpec([None, 2], tf.int64),
        "b": tf.TensorSpec([None], tf.float32),
    }
    assert resolve_specs({"b": FLOAT}, features) == {"b": FLOAT}
    assert resolve_specs(None, features)["b"] == FLOAT
    with pytest.raises(
        UsageError, match=r"feature_specs\['b'\] is a str; expected a tf.TensorSpec"
    ):
        resolve_specs({"b": "float32"})
    with pytest.raises(UsageError, match="No feature_specs and no features"):
        resolve_specs(None)


def test_embedding_initialiser_is_seeded():
    def initial_table(seed):
        with tf.Graph().as_default():
            columns = deep_columns({"city": STRING}, ColumnParams(), seed=seed)
            dense = tf.compat.v1.feature_column.input_layer(
                {"city": tf.constant(["x", "y", "z"])}, columns
            )
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                return session.run(dense)

    np.testing.assert_array_equal(initial_table(0), initial_table(0))
    assert not np.array_equal(initial_table(0), initial_table(1))
