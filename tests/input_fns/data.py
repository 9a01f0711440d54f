"""Small TFRecord and CSV files for the input_fn tests, written with plain TensorFlow.

Every example has an int64 `id` (unique across files), a `label` and a
4x4x1 uint8 `image` whose pixels all equal `id % 256`.
"""

import os

import numpy as np
import tensorflow as tf

SPEC = "image:uint8:4x4x1;label:int64;id:int64"
COLUMNS = "id:int64;label:int64;image:uint8:4x4x1"


def feature(values, kind):
    if kind == "bytes":
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
    if kind == "float":
        return tf.train.Feature(float_list=tf.train.FloatList(value=values))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def example_features(index):
    image = np.full((4, 4, 1), index % 256, np.uint8)
    return {
        "image": feature([image.tobytes()], "bytes"),
        "label": feature([index % 10], "int64"),
        "id": feature([index], "int64"),
    }


def serialize(features):
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def write_tfrecords(directory, num_files, num_examples, prefix="train", replace=None):
    """Writes examples 0..num_examples-1 round-robin over files; returns the glob.

    `replace` maps an id to the features dict written instead of the good one.
    """
    os.makedirs(directory, exist_ok=True)
    paths = [os.path.join(directory, f"{prefix}-{i:02d}.tfrecord") for i in range(num_files)]
    writers = [tf.io.TFRecordWriter(path) for path in paths]
    for index in range(num_examples):
        features = (replace or {}).get(index) or example_features(index)
        writers[index % num_files].write(serialize(features))
    for writer in writers:
        writer.close()
    return os.path.join(directory, f"{prefix}-*.tfrecord")


def tfrecord_params(pattern, **extra):
    return {"batch_size": 8, "files": pattern, "features": SPEC, **extra}


def csv_line(index):
    return ",".join([str(index), str(index % 10)] + [str(index % 256)] * 16)


def write_csv(directory, num_files, num_examples, prefix="train", replace=None, header=True):
    """Writes rows 0..num_examples-1 round-robin over CSV files; returns the glob."""
    os.makedirs(directory, exist_ok=True)
    rows = [[] for _ in range(num_files)]
    for index in range(num_examples):
        rows[index % num_files].append((replace or {}).get(index, csv_line(index)))
    for i, lines in enumerate(rows):
        head = ["id,label," + ",".join(f"p{k}" for k in range(16))] if header else []
        with open(os.path.join(directory, f"{prefix}-{i:02d}.csv"), "w") as stream:
            stream.write("\n".join(head + lines) + "\n")
    return os.path.join(directory, f"{prefix}-*.csv")


def csv_params(pattern, **extra):
    return {"batch_size": 8, "files": pattern, "columns": COLUMNS, **extra}


def context(pipelines, pipeline_id):
    return tf.distribute.InputContext(pipelines, pipeline_id, pipelines)


def read_all(dataset, key="id"):
    """Every value of feature `key` (or the label, key=None) of a finite dataset."""
    values = []
    for features, labels in dataset:
        values.extend((labels if key is None else features[key]).numpy().tolist())
    return values
