"""Plain synchronous SGD with Horovod + Gloo: one `tf.estimator.Estimator` per rank.

  /work/hvd-venv/bin/horovodrun --gloo -np 2 -H localhost:2 \
      /work/hvd-venv/bin/python -m benchmarks.horovod_estimator --model_dir=/tmp/m --steps=600 \
      --result=/tmp/horovod.json

Run from the repository root, in a Python with Horovod built with Gloo. No
tf.distribute strategy: every rank runs its own Estimator in graph mode on its
shard of the same in-memory random images as `benchmarks.handwritten`, with
the same network and `tf.compat.v1.train` optimizer as the package's
`model_fn`, wrapped in `hvd.DistributedOptimizer`, which averages the
gradients over the ranks. The loss is the mean over the rank's own batch, so a
step equals one step on the global batch; the learning rate is used as given,
not scaled by the number of ranks (`resnet_cifar` scales its own by the global
batch, as with the strategy). Rank 0's variables are broadcast at the start;
only rank 0 writes to `--model_dir` (if given), the others to a temporary
directory. Each rank pins all its threads to one core, `--cores[rank]` or
`rank % cpu count`. A hook in rank 0 times the steps after `--warmup_steps`
and writes `{"examples_per_second", "steps", "seconds"}` (global examples) as
JSON to `--result`, with whether TensorFlow ran oneDNN kernels. Horovod is
imported where it is used; `benchmarks.contenders.horovod_command` builds the
launch command.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from typing import Any, Dict, Sequence

import tensorflow as tf
from absl import app, flags

from benchmarks import NEVER_STEPS
from estimator_dist.hardware.cpus import onednn_enabled
from model_fns.mnist_cnn import CnnParams, build_layers, make_optimizer
from model_fns.resnet_cifar_network import ResnetCifar
from model_fns.resnet_cifar_params import ResnetParams, learning_rate_tensor

_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Rank 0's events; default: a temp dir.")
_MODEL = flags.DEFINE_enum("model", "mnist_cnn", ["mnist_cnn", "resnet_cifar"], "Model.")
_OPTIMIZER = flags.DEFINE_enum("optimizer", "adam", ["adam", "sgd"], "mnist_cnn's optimizer.")
_BATCH = flags.DEFINE_integer("per_worker_batch", 64, "Examples per rank per step.")
_STEPS = flags.DEFINE_integer("steps", 600, "Training steps.")
_WARMUP = flags.DEFINE_integer("warmup_steps", 100, "Steps left out of the timing, 1 or more.")
_LOG_STEPS = flags.DEFINE_integer("log_step_count_steps", 50, "Steps per global_step/sec.")
_CORES = flags.DEFINE_list("cores", None, "Core of each rank; default: rank % cpu count.")
_RESULT = flags.DEFINE_string("result", None, "JSON file rank 0 writes.", required=True)

SHAPES = {"mnist_cnn": (28, 28, 1), "resnet_cifar": (32, 32, 3)}


class StepTimer(tf.estimator.SessionRunHook):
    """Times the steps that end after the first `warmup_steps`."""

    def __init__(self, warmup_steps: int) -> None:
        self._warmup_steps = warmup_steps
        self._done = 0
        self._start = 0.0
        self.steps = 0
        self.seconds = 0.0

    def after_run(self, run_context: tf.estimator.SessionRunContext, run_values: Any) -> None:
        """Reads the clock after each step once the warm-up is over."""
        del run_context, run_values
        self._done += 1
        now = time.perf_counter()
        if self._done == self._warmup_steps:
            self._start = now
        elif self._done > self._warmup_steps:
            self.steps, self.seconds = self._done - self._warmup_steps, now - self._start


def input_fn() -> tf.data.Dataset:
    """This rank's shard of 1024 random images and labels, cached, shuffled and repeated."""
    import horovod.tensorflow as hvd

    images = tf.random.stateless_uniform((1024, *SHAPES[_MODEL.value]), seed=(0, 0))
    labels = tf.range(1024) % 10
    return (
        tf.data.Dataset.from_tensor_slices(({"image": images}, labels))
        .shard(hvd.size(), hvd.rank())
        .cache()
        .shuffle(1024, seed=0)
        .repeat()
        .batch(_BATCH.value, drop_remainder=True)
        .prefetch(tf.data.AUTOTUNE)
    )


def model_fn(
    features: Dict[str, tf.Tensor], labels: tf.Tensor, mode: str, params: Dict[str, Any]
) -> tf.estimator.EstimatorSpec:
    """The package's network and optimizer for `--model`, with Horovod's all-reduce (TRAIN)."""
    import horovod.tensorflow as hvd

    global_step = tf.compat.v1.train.get_or_create_global_step()
    if _MODEL.value == "mnist_cnn":
        hparams = CnnParams(optimizer=_OPTIMIZER.value)
        logits = build_layers(hparams)(features["image"], training=True)
        penalty, updates = 0.0, []
        optimizer = make_optimizer(hparams.optimizer, hparams.learning_rate)
    else:
        hparams = ResnetParams(batch_size=params["batch_size"])
        network = ResnetCifar(hparams)
        logits = network(features["image"], training=True)
        squares = [tf.reduce_sum(tf.square(w)) for w in network.weight_decay_variables()]
        penalty, updates = hparams.weight_decay * tf.add_n(squares), network.updates
        rate = learning_rate_tensor(hparams.schedule(), global_step)
        optimizer = tf.compat.v1.train.MomentumOptimizer(rate, momentum=hparams.momentum)
    loss = penalty + tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    )
    minimize = hvd.DistributedOptimizer(optimizer).minimize(loss, global_step=global_step)
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=tf.group(minimize, *updates))


def main(argv: Sequence[str]) -> None:
    """Trains `--steps` steps on this rank, in step with the other ranks."""
    del argv
    import horovod.tensorflow as hvd

    if not 0 < _WARMUP.value < _STEPS.value:
        raise app.UsageError(f"--warmup_steps must be in [1, --steps), received {_WARMUP.value}.")
    hvd.init()
    cores = [int(core) for core in _CORES.value or range(os.cpu_count())]
    for thread in os.listdir("/proc/self/task"):
        os.sched_setaffinity(int(thread), {cores[hvd.rank() % len(cores)]})
    tf.compat.v1.disable_eager_execution()
    timer = StepTimer(_WARMUP.value)
    with tempfile.TemporaryDirectory() as scratch:
        config = tf.estimator.RunConfig(
            model_dir=(hvd.rank() == 0 and _MODEL_DIR.value) or scratch,
            session_config=tf.compat.v1.ConfigProto(
                intra_op_parallelism_threads=1, inter_op_parallelism_threads=1
            ),
            save_checkpoints_steps=NEVER_STEPS,
            save_summary_steps=NEVER_STEPS,
            log_step_count_steps=_LOG_STEPS.value,
            tf_random_seed=0,
        )
        params = {"batch_size": _BATCH.value * hvd.size()}
        estimator = tf.estimator.Estimator(model_fn, config=config, params=params)
        estimator.train(
            input_fn, hooks=[hvd.BroadcastGlobalVariablesHook(0), timer], max_steps=_STEPS.value
        )
    if hvd.rank() == 0:
        with open(_RESULT.value, "w", encoding="utf-8") as f:
            json.dump(
                {
                    "examples_per_second": timer.steps * params["batch_size"] / timer.seconds,
                    "steps": timer.steps,
                    "seconds": timer.seconds,
                    "onednn": onednn_enabled(),
                },
                f,
            )


if __name__ == "__main__":
    app.run(main)
