"""ResNet for CIFAR-10 as an Estimator `model_fn`: the training recipe of TF Model Garden.

The network (`model_fns.resnet_cifar_network`, ResNet-20/32/56, depth
6n+2) and the hyper-parameters with their learning rate schedule
(`model_fns.resnet_cifar_params`) follow Model Garden's Keras ResNet for
CIFAR (`official/benchmark/models/resnet_cifar_model.py` and
`resnet_cifar_main.py`). This module puts them together:

* L2 weight decay 2e-4 * sum(w^2) over the convolution and dense weights
  (not batch norm), added to the loss;
* momentum SGD (0.9) with learning rate 0.1 per 128 examples of the global
  batch, divided by 10 at epochs 91, 136 and 182 (Model Garden's
  `LR_SCHEDULE`); no warm-up (Model Garden has none for CIFAR).

Loss under distribution: each replica adds the mean cross-entropy of its
per-replica batch to the weight decay. The `tf.compat.v1.train` optimizer
divides that by the number of replicas and the gradients are summed over
replicas, so a step equals one worker's step on the global batch, except
for batch norm: with `batch_norm=local` each replica normalises with the
statistics of its own batch (the classic recipe), with `batch_norm=sync`
with those of the global batch. One worker with `virtual_batch_size` set
to the per-replica batch normalises like N replicas with local batch norm
do (ghost batch norm).

Example:
  >>> import tensorflow as tf
  >>> estimator = tf.estimator.Estimator(
  ...     model_fn, params={"depth": 20, "batch_size": 128, "batch_norm": "sync"})
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import tensorflow as tf
from absl import logging

from estimator_dist.base.params import from_params
from model_fns import learning_rates
from model_fns.optimizers import with_gradient_accumulation
from model_fns.resnet_cifar_network import ResnetCifar
from model_fns.resnet_cifar_params import (
    REFERENCE_BATCH_SIZE,
    LearningRateSchedule,
    ResnetParams,
    learning_rate_tensor,
)

_LOGGED_SCHEDULES: set = set()


def _log_schedule_once(hparams: ResnetParams, schedule: LearningRateSchedule) -> None:
    line = (
        f"resnet_cifar: ResNet-{hparams.depth}, global batch {hparams.batch_size}"
        + (
            f" x {hparams.gradient_accumulation_steps} accumulated micro-batches"
            if hparams.gradient_accumulation_steps > 1
            else ""
        )
        + f", batch norm {hparams.batch_norm}"
        + (f" (virtual batch {hparams.virtual_batch_size})" if hparams.virtual_batch_size else "")
        + f"; learning rate {schedule.describe()} (base_learning_rate "
        f"{hparams.base_learning_rate:g} x {hparams.update_batch_size}/{REFERENCE_BATCH_SIZE}); "
        f"momentum {hparams.momentum:g}, weight decay {hparams.weight_decay:g}. "
        "--learning_rate is not used."
    )
    if line not in _LOGGED_SCHEDULES:
        _LOGGED_SCHEDULES.add(line)
        logging.info("%s", line)


def model_fn(
    features: Any, labels: Optional[tf.Tensor], mode: str, params: Mapping[str, Any]
) -> tf.estimator.EstimatorSpec:
    """Estimator `model_fn` for TRAIN, EVAL (accuracy, top-5) and PREDICT.

    Args:
      features: `{"image": float32 [batch, 32, 32, 3] in [0, 1]}` or the
        image tensor itself. Other sizes work (global pooling), CIFAR's is
        what the recipe is for.
      labels: int [batch] class ids; None in PREDICT mode.
      mode: A `tf.estimator.ModeKeys` value.
      params: Hyper-parameters, see `ResnetParams`; `batch_size` is the
        global batch. The driver's `learning_rate` is not used: the rate is
        `base_learning_rate * batch_size / 128`.

    Returns:
      The `EstimatorSpec` for `mode`; PREDICT carries a `serving_default`
      signature with `class_ids`, `probabilities` and `logits`.

    Raises:
      UsageError: for unknown or invalid hyper-parameters.

    Example:
      >>> import tensorflow as tf
      >>> estimator = tf.estimator.Estimator(model_fn, params={"depth": 32, "batch_size": 256})
    """
    hparams = from_params(
        ResnetParams,
        {key: value for key, value in params.items() if key != "learning_rate"},
        "resnet_cifar",
    )
    images = features["image"] if isinstance(features, Mapping) else features
    training = mode == tf.estimator.ModeKeys.TRAIN
    network = ResnetCifar(hparams)
    logits = network(images, training=training)
    class_ids = tf.argmax(logits, axis=1)
    predictions = {
        "class_ids": class_ids,
        "probabilities": tf.cast(tf.nn.softmax(logits), tf.float32),
        "logits": tf.cast(logits, tf.float32),
    }
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(
            mode,
            predictions=predictions,
            export_outputs={"serving_default": tf.estimator.export.PredictOutput(predictions)},
        )
    labels = tf.cast(tf.reshape(labels, [-1]), tf.int32)
    cross_entropy = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    )
    decay = tf.add_n([tf.reduce_sum(tf.square(w)) for w in network.weight_decay_variables()])
    loss = cross_entropy + tf.cast(hparams.weight_decay, logits.dtype) * decay
    if mode == tf.estimator.ModeKeys.EVAL:
        metrics = {
            "accuracy": tf.compat.v1.metrics.accuracy(labels=labels, predictions=class_ids),
            "cross_entropy": tf.compat.v1.metrics.mean(cross_entropy),
        }
        if hparams.num_classes > 5:
            in_top_5 = tf.nn.in_top_k(predictions=predictions["logits"], targets=labels, k=5)
            metrics["accuracy_top_5"] = tf.compat.v1.metrics.mean(tf.cast(in_top_5, tf.float32))
        return tf.estimator.EstimatorSpec(
            mode, loss=tf.cast(loss, tf.float32), eval_metric_ops=metrics
        )

    schedule = hparams.schedule()
    _log_schedule_once(hparams, schedule)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    learning_rate = learning_rates.track(learning_rate_tensor(schedule, global_step))
    tf.compat.v1.summary.scalar("cross_entropy", cross_entropy)
    optimizer = with_gradient_accumulation(
        tf.compat.v1.train.MomentumOptimizer(learning_rate, momentum=hparams.momentum), params
    )
    minimize = optimizer.minimize(loss, global_step=global_step)
    # Keras layers in a graph-mode model_fn keep their moving-average updates
    # to themselves (not in UPDATE_OPS): run them with every step.
    train_op = tf.group(minimize, *network.updates)
    return tf.estimator.EstimatorSpec(mode, loss=tf.cast(loss, tf.float32), train_op=train_op)
