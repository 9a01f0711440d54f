"""The legacy script of `before.py`, ready for multi-worker training (the "after").

The model_fn is `before.model_fn`, unchanged: TF1 layers, a
`tf.compat.v1.train` optimizer, `tf.compat.v1.losses` and `tf.compat.v1.metrics`.
Only the input_fn changed: one function for both modes that takes
`input_context` and shards the data by it, with the global batch divided
over the replicas. The training loop, RunConfig and strategy are now
estimator-dist's:

  python -m estimator_dist.launch --num_workers=2 --evaluator -- \\
      --model_fn=examples.legacy_estimator.model:model_fn \\
      --input_fn=examples.legacy_estimator.model:input_fn \\
      --model_dir=/tmp/legacy_after --batch_size=64 --learning_rate=0.05 --train_steps=300

Example:
  >>> dataset = input_fn("train", None, {"batch_size": 64, "seed": 0})  # doctest: +SKIP
"""

from typing import Any, Mapping, Optional

import numpy as np
import tensorflow as tf
from sklearn.datasets import load_digits

from examples.legacy_estimator.before import model_fn

TRAIN_EXAMPLES = 1500

__all__ = ["input_fn", "model_fn"]


def input_fn(
    mode: str,
    input_context: Optional[tf.distribute.InputContext] = None,
    params: Optional[Mapping[str, Any]] = None,
) -> tf.data.Dataset:
    """The 8x8 digits: the first 1500 for training, the rest for evaluation.

    Args:
      mode: TRAIN repeats (and shuffles unless params `shuffle` is false);
        EVAL reads the evaluation examples once.
      input_context: This worker's pipeline id and count; worker i reads
        examples i, i+N, ...
      params: `batch_size` (global), `seed`, optional `shuffle`.

    Returns:
      Batches of `({"image": float32 [b, 8, 8]}, int64 label)`.
    """
    params = params or {}
    digits = load_digits()
    part = slice(None, TRAIN_EXAMPLES) if mode == "train" else slice(TRAIN_EXAMPLES, None)
    images = (digits.images[part] / 16.0).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(({"image": images}, digits.target[part]))
    batch = params.get("batch_size", 64)
    if input_context is not None:
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
        batch = input_context.get_per_replica_batch_size(batch)
    if mode == "train":
        if params.get("shuffle", True):
            dataset = dataset.shuffle(TRAIN_EXAMPLES, seed=params.get("seed"))
        dataset = dataset.repeat()
    return dataset.batch(batch, drop_remainder=mode == "train").prefetch(tf.data.AUTOTUNE)
