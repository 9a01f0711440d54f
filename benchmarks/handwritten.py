"""Hand-written multi-worker `tf.estimator` code: what the package is compared with.

  TF_CONFIG=... python -m benchmarks.handwritten --model_dir=/tmp/m --steps=600

The script a user writes from TensorFlow's multi-worker Estimator tutorial:
MultiWorkerMirroredStrategy, a RunConfig, `train_and_evaluate`, a tf.data
pipeline of random images held in memory, and the same `model_fn` as the
package's contender, so that the two differ only in what the package adds
(flag and TF_CONFIG validation, rendezvous, watchdog hook, run records,
session defaults). `--session_config` takes a text-format `ConfigProto`, so
the package's session defaults can be given to it as well.
"""

from __future__ import annotations

from typing import Sequence

import tensorflow as tf
from absl import app, flags
from google.protobuf import text_format

from benchmarks import NEVER_STEPS

_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Checkpoints and events.", required=True)
_MODEL = flags.DEFINE_enum("model", "mnist_cnn", ["mnist_cnn", "resnet_cifar"], "Model.")
_BATCH = flags.DEFINE_integer("per_worker_batch", 64, "Examples per worker per step.")
_STEPS = flags.DEFINE_integer("steps", 600, "Training steps.")
_LOG_STEPS = flags.DEFINE_integer("log_step_count_steps", 50, "Steps per global_step/sec.")
_COMMUNICATION = flags.DEFINE_enum("communication", "RING", ["RING", "AUTO"], "Collectives.")
_BYTES_PER_PACK = flags.DEFINE_integer("bytes_per_pack", 0, "Gradient pack size; 0: one pack.")
_SESSION = flags.DEFINE_string("session_config", "", "Text-format tf.compat.v1.ConfigProto.")

SHAPES = {"mnist_cnn": (28, 28, 1), "resnet_cifar": (32, 32, 3)}


def input_fn(mode: str, input_context: tf.distribute.InputContext = None) -> tf.data.Dataset:
    """1024 random images and labels, cached, shuffled and repeated."""
    shape = SHAPES[_MODEL.value]
    images = tf.random.stateless_uniform((1024, *shape), seed=(0, 0))
    labels = tf.range(1024) % 10
    dataset = tf.data.Dataset.from_tensor_slices(({"image": images}, labels))
    if input_context:
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return (
        dataset.cache()
        .shuffle(1024, seed=0)
        .repeat()
        .batch(_BATCH.value, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def main(argv: Sequence[str]) -> None:
    """Trains `--steps` steps on the cluster that TF_CONFIG describes."""
    del argv
    tf.compat.v1.disable_eager_execution()
    if _MODEL.value == "mnist_cnn":
        from model_fns.mnist_cnn import model_fn
    else:
        from model_fns.resnet_cifar import model_fn
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=getattr(
            tf.distribute.experimental.CommunicationImplementation, _COMMUNICATION.value
        ),
        bytes_per_pack=_BYTES_PER_PACK.value,
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    config = tf.estimator.RunConfig(
        model_dir=_MODEL_DIR.value,
        train_distribute=strategy,
        session_config=text_format.Parse(_SESSION.value, tf.compat.v1.ConfigProto()),
        save_checkpoints_steps=NEVER_STEPS,
        save_summary_steps=NEVER_STEPS,
        log_step_count_steps=_LOG_STEPS.value,
        tf_random_seed=0,
    )
    # resnet_cifar scales its learning rate by the global batch; mnist_cnn takes no batch size.
    global_batch = _BATCH.value * strategy.num_replicas_in_sync
    params = {"batch_size": global_batch} if _MODEL.value == "resnet_cifar" else {}
    estimator = tf.estimator.Estimator(model_fn, config=config, params=params)
    tf.estimator.train_and_evaluate(
        estimator,
        tf.estimator.TrainSpec(input_fn, max_steps=_STEPS.value),
        tf.estimator.EvalSpec(input_fn, steps=1),
    )


if __name__ == "__main__":
    app.run(main)
