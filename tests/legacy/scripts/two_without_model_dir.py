"""Two canned classifiers in one program, neither given a model_dir, in a tutorial's shape.

Like the linear-model tutorials, it trains a `LinearClassifier` on two columns,
evaluates it, then a second one with a crossed column added for twice the steps,
also without a model_dir: in plain TensorFlow each writes to a temporary
directory of its own.

  python tests/legacy/scripts/two_without_model_dir.py --steps=20
"""

import argparse

import numpy as np
import pandas as pd
import tensorflow as tf


def frame(count, seed):
    rng = np.random.RandomState(seed)
    data = pd.DataFrame({"age": rng.uniform(18, 80, count), "sex": rng.choice(["f", "m"], count)})
    return data, (data["age"] > 40).astype(np.int64)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    features, labels = frame(200, 0)
    train = tf.compat.v1.estimator.inputs.pandas_input_fn(
        features, labels, batch_size=20, num_epochs=None, shuffle=True
    )
    evaluate = tf.compat.v1.estimator.inputs.pandas_input_fn(
        features, labels, batch_size=20, num_epochs=1, shuffle=False
    )
    age = tf.feature_column.numeric_column("age")
    sex = tf.feature_column.categorical_column_with_vocabulary_list("sex", ["f", "m"])
    crossed = tf.feature_column.crossed_column([sex, "age"], hash_bucket_size=10)
    # The second trains twice as long: each model's steps are its own.
    for columns, steps in (([age, sex], args.steps), ([age, sex, crossed], 2 * args.steps)):
        classifier = tf.estimator.LinearClassifier(feature_columns=columns)
        classifier.train(train, steps=steps)
        print("accuracy", classifier.evaluate(evaluate)["accuracy"])


if __name__ == "__main__":
    main()
