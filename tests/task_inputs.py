"""Input functions that tests name with `--input_fn=tests.task_inputs:<name>`.

Most read the real embedded digits TFDS files, like `input_fns.digits`.
"""

import json
import os

import tensorflow as tf
import tensorflow_datasets as tfds

from input_fns import digits, tfrecord
from input_fns.pipeline import TRAIN


def _images(features):
    return {"image": tf.cast(features["image"], tf.float32) / 255.0}, tf.cast(
        features["label"], tf.int32
    )


def example_sharded(mode, input_context=None, params=None):
    """Deterministic order, sharded by example: worker i takes examples i, i+N, ...

    With per-worker batch B/N, the N workers' batches at every step together
    hold exactly the examples of a one-worker batch B, which is what makes
    N-worker training comparable to one worker to float tolerance.
    """
    builder = tfds.builder(digits.NAME, data_dir=params["data_dir"])
    dataset = builder.as_dataset(split="train", shuffle_files=False)
    batch = params["batch_size"]
    if input_context is not None:
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        batch = input_context.get_per_replica_batch_size(batch)
    dataset = dataset.map(_images)
    if mode == TRAIN:
        dataset = dataset.repeat()
    return dataset.batch(batch, drop_remainder=mode == TRAIN)


def fails_on_worker(mode, input_context=None, params=None):
    """Raises on the `worker` task only, to test that one failing task stops the job."""
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    if task.get("type") == "worker":
        raise RuntimeError("injected input failure on the worker task")
    return example_sharded(mode, input_context, params)


def finite_on_worker(mode, input_context=None, params=None):
    """Repeats on the chief but runs out on the worker, as a forgotten `repeat()` does."""
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    dataset = example_sharded(mode, input_context, params)
    if task.get("type") == "worker" and mode == TRAIN:
        return dataset.take(20)
    return dataset


def unsharded_tfrecord(mode, params=None):
    """The bug the sharding check must catch: no input_context, so no sharding.

    Each task records the ids it reads under `record_read_ids/<task>/`, since
    without an input_context every task is "pipeline 0 of 1".
    """
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {"type": "local", "index": 0})
    directory = os.path.join(params["record_read_ids"], f"{task['type']}-{task['index']}")
    return tfrecord.input_fn(mode, None, {**params, "record_read_ids": directory})
