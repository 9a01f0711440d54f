"""TensorFlow 1.x's "Building Input Functions" tutorial: pandas frames through pandas_input_fn.

The tutorial read CSV files into pandas DataFrames and made its input
functions with `tf.estimator.inputs.pandas_input_fn`: shuffled and
repeating for training, one ordered epoch for evaluation, a canned DNN on
numeric columns. Its Boston housing CSVs are gone from scikit-learn; the
iris frame (`as_frame=True`) is split 120/30 here with a fixed permutation.
"""

import numpy as np
import pandas as pd
import tensorflow as tf
from sklearn.datasets import load_iris

COLUMNS = ["sepal_length", "sepal_width", "petal_length", "petal_width", "species"]
FEATURES = COLUMNS[:-1]
LABEL = "species"

frame = load_iris(as_frame=True).frame
frame.columns = COLUMNS

order = np.random.RandomState(11).permutation(len(frame))
training_set = frame.iloc[order[:120]]
test_set = frame.iloc[order[120:]]


def get_input_fn(data_set, num_epochs=None, shuffle=True):
    return tf.compat.v1.estimator.inputs.pandas_input_fn(
        x=pd.DataFrame({k: data_set[k].values for k in FEATURES}),
        y=pd.Series(data_set[LABEL].values),
        batch_size=32,
        num_epochs=num_epochs,
        shuffle=shuffle,
    )


train_input_fn = get_input_fn(training_set)
eval_input_fn = get_input_fn(test_set, num_epochs=1, shuffle=False)

feature_cols = [tf.feature_column.numeric_column(k) for k in FEATURES]


def build(config):
    return tf.estimator.DNNClassifier(
        feature_columns=feature_cols,
        hidden_units=[10, 10],
        n_classes=3,
        optimizer=tf.keras.optimizers.legacy.Adam(learning_rate=0.01),
        config=config,
    )


if __name__ == "__main__":
    classifier = build(tf.estimator.RunConfig(model_dir="/tmp/iris_model"))
    classifier.train(input_fn=train_input_fn, steps=5000)
    ev = classifier.evaluate(input_fn=eval_input_fn)
    print("Accuracy: {:f}".format(ev["accuracy"]))
