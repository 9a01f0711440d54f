"""A canned wide-and-deep classifier on feature columns, trained and evaluated in one call.

Generated customer records (age, weekly hours, city, device) with a label
that depends on a city-device combination, so the wide part needs the crossed
column and the deep part learns city embeddings:

  python tests/legacy/scripts/canned_wide_and_deep.py --model_dir=/tmp/wd --train_steps=300
"""

import argparse

import numpy as np
import tensorflow as tf

CITIES = ["paris", "tokyo", "lima", "oslo", "cairo", "quito"]
DEVICES = ["ios", "android", "web"]


def make_records(count, seed):
    rng = np.random.RandomState(seed)
    age = rng.uniform(18, 80, count).astype(np.float32)
    hours = rng.uniform(5, 60, count).astype(np.float32)
    city = rng.choice(CITIES, count)
    device = rng.choice(DEVICES, count)
    score = (
        0.05 * (age - 45)
        + 0.04 * (hours - 30)
        + 1.5 * ((city == "tokyo") & (device == "web"))
        - 1.5 * ((city == "lima") & (device == "ios"))
        + rng.normal(0, 0.3, count)
    )
    features = {"age": age, "hours": hours, "city": city, "device": device}
    return features, (score > 0).astype(np.int32)


def train_input_fn(batch_size):
    features, labels = make_records(4000, seed=1)
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    return dataset.shuffle(4000, seed=1).repeat().batch(batch_size)


def eval_input_fn(batch_size):
    features, labels = make_records(1000, seed=2)
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(batch_size)


def feature_columns():
    age = tf.feature_column.numeric_column("age")
    age_buckets = tf.feature_column.bucketized_column(age, boundaries=[25, 35, 45, 55, 65])
    city = tf.feature_column.categorical_column_with_vocabulary_list("city", CITIES)
    device = tf.feature_column.categorical_column_with_hash_bucket("device", 16)
    city_x_device = tf.feature_column.crossed_column(["city", "device"], hash_bucket_size=64)
    wide = [age_buckets, city, device, city_x_device]
    deep = [
        tf.feature_column.numeric_column("age", normalizer_fn=lambda x: (x - 45.0) / 20.0),
        tf.feature_column.numeric_column("hours", normalizer_fn=lambda x: (x - 30.0) / 15.0),
        tf.feature_column.embedding_column(city, dimension=4),
        tf.feature_column.indicator_column(device),
    ]
    return wide, deep


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--train_steps", type=int, default=2000)
    parser.add_argument("--batch_size", type=int, default=64)
    args = parser.parse_args()

    wide, deep = feature_columns()
    config = tf.estimator.RunConfig(model_dir=args.model_dir, save_checkpoints_steps=100)
    estimator = tf.estimator.DNNLinearCombinedClassifier(
        linear_feature_columns=wide,
        linear_optimizer=lambda: tf.keras.optimizers.legacy.Ftrl(learning_rate=0.5),
        dnn_feature_columns=deep,
        dnn_optimizer=lambda: tf.keras.optimizers.legacy.Adagrad(learning_rate=0.2),
        dnn_hidden_units=[32, 16],
        config=config,
    )
    train_spec = tf.estimator.TrainSpec(
        input_fn=lambda: train_input_fn(args.batch_size), max_steps=args.train_steps
    )
    eval_spec = tf.estimator.EvalSpec(input_fn=lambda: eval_input_fn(args.batch_size), steps=None)
    tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)


if __name__ == "__main__":
    main()
