"""Data for the programs of `differential_test`, in the layouts their public originals read.

>>> import tempfile
>>> directory = tempfile.mkdtemp()
>>> census_csv(os.path.join(directory, "train.csv"), 2, 0)
>>> len(open(os.path.join(directory, "train.csv")).readline().split(","))
15
"""

import os

import numpy as np

#: tpu_mnist.py's records: 16 floats and a label of 4 classes.
IMAGE_SIZE, CLASSES = 16, 4
CENSUS_LABELS = (" <=50K", " >50K")
CENSUS_CATEGORIES = {
    "workclass": (" Private", " Self-emp", " Government"),
    "education": (" Bachelors", " HS-grad", " Masters"),
    "marital_status": (" Married", " Never-married", " Divorced"),
    "relationship": (" Husband", " Wife", " Own-child"),
    "race": (" White", " Black", " Other"),
    "gender": (" Female", " Male"),
}
CENSUS_COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education_num", "marital_status",
    "occupation", "relationship", "race", "gender", "capital_gain", "capital_loss",
    "hours_per_week", "native_country", "income_bracket",
)  # fmt: skip


def mnist_records(data_dir: str, count: int = 128, seed: int = 0) -> None:
    """Writes `train.tfrecord` and `eval.tfrecord` of `image` (16 floats) and `label`."""
    import tensorflow as tf

    rng = np.random.RandomState(seed)
    weights = rng.normal(size=(IMAGE_SIZE, CLASSES))
    for name in ("train", "eval"):
        with tf.io.TFRecordWriter(os.path.join(data_dir, f"{name}.tfrecord")) as writer:
            for _ in range(count):
                image = rng.normal(size=IMAGE_SIZE).astype(np.float32)
                label = int(np.argmax(image @ weights))
                feature = {
                    "image": tf.train.Feature(float_list=tf.train.FloatList(value=image)),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
                }
                example = tf.train.Example(features=tf.train.Features(feature=feature))
                writer.write(example.SerializeToString())


def census_csv(path: str, count: int, seed: int) -> None:
    """Writes `count` rows of the census layout, no header; the label a rule of the rest."""
    rng = np.random.RandomState(seed)
    with open(path, "w") as stream:
        for _ in range(count):
            age, hours, education = rng.randint(18, 70), rng.randint(10, 60), rng.randint(1, 16)
            row = {
                "age": age,
                "fnlwgt": rng.randint(10000, 300000),
                "education_num": education,
                "capital_gain": rng.randint(0, 5000),
                "capital_loss": rng.randint(0, 500),
                "hours_per_week": hours,
                "occupation": f" occupation-{rng.randint(20)}",
                "native_country": f" country-{rng.randint(30)}",
                "income_bracket": CENSUS_LABELS[int(age + hours + 2 * education > 90)],
            }
            for name, values in CENSUS_CATEGORIES.items():
                row[name] = values[rng.randint(len(values))]
            stream.write(",".join(str(row[name]) for name in CENSUS_COLUMNS) + "\n")
