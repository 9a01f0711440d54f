"""The census "wide and deep" model: a canned v1 DNNLinearCombinedClassifier.

The tutorial read the UCI adult census CSVs; this module generates rows of
the same kind (age, education, occupation, hours, gender) from a fixed
seed, with an income bracket that depends on them. The feature columns
are the tutorial's mix: a vocabulary list, a hashed column, crosses and
bucketized age for the wide part; numeric, one-hot and embedded columns
for the deep part. (Versions of the tutorial that gave the DNN a
ProximalAdagradOptimizer cannot run under any tf.distribute strategy:
its slots are made with `colocate_with(variable)`, which raises for a
distributed variable, in plain TensorFlow as in this package; Adagrad
stands in for it.)
"""

import numpy as np
import tensorflow as tf

EDUCATION = ["Bachelors", "HS-grad", "Some-college", "Masters", "Assoc", "Doctorate", "11th"]
OCCUPATIONS = [
    "Tech-support",
    "Craft-repair",
    "Other-service",
    "Sales",
    "Exec-managerial",
    "Prof-specialty",
    "Handlers-cleaners",
    "Machine-op-inspct",
    "Adm-clerical",
    "Farming-fishing",
    "Transport-moving",
    "Protective-serv",
]
GENDERS = ["Female", "Male"]
_EDUCATION_BONUS = {"Bachelors": 1.0, "Masters": 1.6, "Doctorate": 2.0, "Assoc": 0.4, "11th": -1.0}
_OCCUPATION_BONUS = {"Exec-managerial": 1.2, "Prof-specialty": 1.0, "Tech-support": 0.4}


def generate(num_rows, seed):
    """Rows of census-like columns and a 0/1 income bracket (>50K), always the same for a seed."""
    rng = np.random.RandomState(seed)
    age = rng.randint(17, 80, num_rows).astype(np.float32)
    hours = np.clip(rng.normal(40, 12, num_rows), 1, 99).astype(np.float32)
    education = rng.choice(EDUCATION, num_rows)
    occupation = rng.choice(OCCUPATIONS, num_rows)
    gender = rng.choice(GENDERS, num_rows)
    score = (
        -2.0
        + np.array([_EDUCATION_BONUS.get(e, 0.0) for e in education])
        + np.array([_OCCUPATION_BONUS.get(o, 0.0) for o in occupation])
        + 1.2 * ((age > 32) & (age < 62))
        + 0.05 * (hours - 40)
        + 0.3 * (gender == "Male")
        + rng.normal(0, 0.5, num_rows)
    )
    features = {
        "age": age,
        "hours_per_week": hours,
        "education": education,
        "occupation": occupation,
        "gender": gender,
    }
    return features, (score > 0).astype(np.int64)


TRAIN = generate(2000, seed=1)
TEST = generate(500, seed=2)


def build_model_columns():
    """Builds a set of wide and deep feature columns."""
    age = tf.feature_column.numeric_column("age")
    hours_per_week = tf.feature_column.numeric_column("hours_per_week")
    education = tf.feature_column.categorical_column_with_vocabulary_list("education", EDUCATION)
    gender = tf.feature_column.categorical_column_with_vocabulary_list("gender", GENDERS)
    # To show an example of hashing:
    occupation = tf.feature_column.categorical_column_with_hash_bucket(
        "occupation", hash_bucket_size=50
    )
    # Transformations.
    age_buckets = tf.feature_column.bucketized_column(
        age, boundaries=[18, 25, 30, 35, 40, 45, 50, 55, 60, 65]
    )

    # Wide columns and deep columns.
    base_columns = [education, gender, occupation, age_buckets]
    crossed_columns = [
        tf.feature_column.crossed_column(["education", "occupation"], hash_bucket_size=100),
        tf.feature_column.crossed_column([age_buckets, "education"], hash_bucket_size=100),
    ]
    wide_columns = base_columns + crossed_columns
    deep_columns = [
        age,
        hours_per_week,
        tf.feature_column.indicator_column(education),
        tf.feature_column.indicator_column(gender),
        # To show an example of embedding
        tf.feature_column.embedding_column(occupation, dimension=4),
    ]
    return wide_columns, deep_columns


def train_input_fn():
    features, labels = TRAIN
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    return dataset.shuffle(2000, seed=3).repeat().batch(64)


def eval_input_fn():
    features, labels = TEST
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(100)


def build(config):
    wide_columns, deep_columns = build_model_columns()
    return tf.compat.v1.estimator.DNNLinearCombinedClassifier(
        config=config,
        linear_feature_columns=wide_columns,
        dnn_feature_columns=deep_columns,
        dnn_hidden_units=[16, 8],
        linear_optimizer=tf.compat.v1.train.FtrlOptimizer(learning_rate=0.5),
        dnn_optimizer=tf.compat.v1.train.AdagradOptimizer(learning_rate=0.2),
    )
