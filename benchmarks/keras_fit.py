"""Keras `model.fit` on MultiWorkerMirroredStrategy: the TF2 way to train the same model.

  TF_CONFIG=... python -m benchmarks.keras_fit --steps=600 --result=/tmp/keras.json

The script a user writes from TensorFlow's Keras multi-worker tutorial: eager
mode, MultiWorkerMirroredStrategy from TF_CONFIG (one process per task), the
network of `model_fns` built and compiled inside `strategy.scope()`, and
`model.fit` on the same in-memory random images as `benchmarks.handwritten`.
The dataset is batched by the global batch (`--per_worker_batch` x workers)
and the strategy auto-shards it by DATA (set explicitly; its default AUTO
policy falls back to DATA for in-memory data): each worker runs the whole
pipeline and keeps its part of every global batch. `mnist_cnn` trains
with Keras Adam (or SGD) at the package's default rate, `resnet_cifar` with
its own recipe (momentum SGD at 0.1 per 128 examples, weight decay on the same
variables as its `model_fn`). The chief times the steps after
`--warmup_steps` and writes `{"examples_per_second", "steps", "seconds"}`
(global examples) as JSON to `--result`, with whether TensorFlow ran oneDNN
kernels. `--mixed_precision=bfloat16` builds the model under the
`mixed_bfloat16` policy.
"""

from __future__ import annotations

import json
import time
from typing import Dict, Optional, Sequence

import tensorflow as tf
from absl import app, flags

from estimator_dist.hardware.cpus import onednn_enabled
from model_fns.mnist_cnn import CnnParams, build_layers
from model_fns.resnet_cifar_network import ResnetCifar
from model_fns.resnet_cifar_params import ResnetParams

_MODEL = flags.DEFINE_enum("model", "mnist_cnn", ["mnist_cnn", "resnet_cifar"], "Model.")
_OPTIMIZER = flags.DEFINE_enum("optimizer", "adam", ["adam", "sgd"], "mnist_cnn's optimizer.")
_BATCH = flags.DEFINE_integer("per_worker_batch", 64, "Examples per worker per step.")
_STEPS = flags.DEFINE_integer("steps", 600, "Training steps.")
_WARMUP = flags.DEFINE_integer("warmup_steps", 100, "Steps left out of the timing, 1 or more.")
_COMMUNICATION = flags.DEFINE_enum("communication", "RING", ["RING", "AUTO"], "Collectives.")
_STEPS_PER_EXECUTION = flags.DEFINE_integer("steps_per_execution", 1, "Steps per tf.function.")
_PRECISION = flags.DEFINE_enum(
    "mixed_precision",
    "off",
    ["off", "bfloat16"],
    "bfloat16: the model is built under Keras' mixed_bfloat16 policy (layers compute in "
    "bfloat16, variables stay float32), the Keras way to what the package's "
    "--mixed_precision=bfloat16 does by graph rewrite.",
)
_RESULT = flags.DEFINE_string("result", None, "JSON file the chief writes.", required=True)

SHAPES = {"mnist_cnn": (28, 28, 1), "resnet_cifar": (32, 32, 3)}


class StepTimer(tf.keras.callbacks.Callback):
    """Times the steps that end after the first `warmup_steps`."""

    def __init__(self, warmup_steps: int) -> None:
        super().__init__()
        # Leaves the logs as tensors, so that timing adds no wait to other steps.
        self._supports_tf_logs = True
        self._warmup_steps = warmup_steps
        self._start: Optional[float] = None
        self._start_step = 0
        self.steps = 0
        self.seconds = 0.0

    def on_train_batch_end(self, batch: int, logs: Optional[Dict[str, tf.Tensor]] = None) -> None:
        """Reads the clock after the warm-up and after the last step, once they finished."""
        done = batch + 1
        if (self._start is None and done >= self._warmup_steps) or done == self.params["steps"]:
            float(logs["loss"])  # Waits for the step to finish.
            now = time.perf_counter()
            if self._start is None:
                self._start, self._start_step = now, done
            else:
                self.steps, self.seconds = done - self._start_step, now - self._start


def dataset(global_batch: int) -> tf.data.Dataset:
    """1024 random images and labels, cached, shuffled, repeated, in global batches."""
    images = tf.random.stateless_uniform((1024, *SHAPES[_MODEL.value]), seed=(0, 0))
    labels = tf.range(1024) % 10
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return (
        tf.data.Dataset.from_tensor_slices((images, labels))
        .cache()
        .shuffle(1024, seed=0)
        .repeat()
        .batch(global_batch, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
        .with_options(options)
    )


def build_model(global_batch: int) -> tf.keras.Model:
    """The package's network and optimizer for `--model`, compiled; call inside the scope."""
    if _MODEL.value == "mnist_cnn":
        params = CnnParams(optimizer=_OPTIMIZER.value)
        model = build_layers(params)
        optimizer_class = {"adam": tf.keras.optimizers.Adam, "sgd": tf.keras.optimizers.SGD}
        optimizer = optimizer_class[params.optimizer](params.learning_rate)
    else:
        params = ResnetParams(batch_size=global_batch)
        model = ResnetCifar(params)
        model.add_loss(
            lambda: (
                params.weight_decay
                * tf.add_n([tf.reduce_sum(tf.square(w)) for w in model.weight_decay_variables()])
            )
        )
        schedule = params.schedule()
        rate = tf.keras.optimizers.schedules.PiecewiseConstantDecay(
            list(schedule.boundaries), list(schedule.values)
        )
        optimizer = tf.keras.optimizers.SGD(rate, momentum=params.momentum)
    # Built by a call, as in `model_fn`, so that the variables get the names that
    # `weight_decay_variables` selects by.
    model(tf.zeros((1, *SHAPES[_MODEL.value])))
    model.compile(
        optimizer=optimizer,
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        steps_per_execution=_STEPS_PER_EXECUTION.value,
    )
    return model


def main(argv: Sequence[str]) -> None:
    """Trains `--steps` steps on the cluster that TF_CONFIG describes and times them."""
    del argv
    if not 0 < _WARMUP.value < _STEPS.value:
        raise app.UsageError(f"--warmup_steps must be in [1, --steps), received {_WARMUP.value}.")
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=getattr(
            tf.distribute.experimental.CommunicationImplementation, _COMMUNICATION.value
        )
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    global_batch = _BATCH.value * strategy.num_replicas_in_sync
    if _PRECISION.value == "bfloat16":
        tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
    with strategy.scope():
        model = build_model(global_batch)
    timer = StepTimer(_WARMUP.value)
    model.fit(
        dataset(global_batch),
        epochs=1,
        steps_per_epoch=_STEPS.value,
        verbose=0,
        callbacks=[timer],
    )
    if strategy.extended.should_checkpoint:
        with open(_RESULT.value, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "examples_per_second": timer.steps * global_batch / timer.seconds,
                    "steps": timer.steps,
                    "seconds": timer.seconds,
                    "onednn": onednn_enabled(),
                },
                f,
            )


if __name__ == "__main__":
    app.run(main)
