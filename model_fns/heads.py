"""Classification and regression heads: from logits to an `EstimatorSpec`.

A head turns the logits of a tabular model into predictions, the loss, the
evaluation metrics and the export signatures, like the canned estimators'
heads, but with a plain `tf.compat.v1.train` training op supplied by the
model, so that Estimator divides the loss by the number of replicas.

| head | labels | logits | loss (per-replica batch mean) | metrics |
|---|---|---|---|---|
| classification, 2 classes | int 0/1 | 1 | sigmoid x-entropy | accuracy, auc, precision, recall |
| classification, n > 2 | int 0..n-1 | n | softmax x-entropy | accuracy |
| regression | float | 1 | squared error | rmse, mae |

Example:
  >>> head = Head("classification", n_classes=2)
  >>> head.logits_dimension
  1
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import tensorflow as tf

HEADS = ("classification", "regression")
PREDICT = "infer"
EVAL = "eval"


def validate_head(head: str, n_classes: int) -> None:
    """Raises ValueError for an unknown head or a bad number of classes."""
    if head not in HEADS:
        raise ValueError(f"head {head!r} is unknown; valid: {', '.join(HEADS)}.")
    if head == "classification" and n_classes < 2:
        raise ValueError(
            f"n_classes must be at least 2 for head=classification, received {n_classes}."
        )


@dataclasses.dataclass(frozen=True)
class Head:
    """A classification or regression head.

    Attributes:
      kind: `classification` or `regression`.
      n_classes: Classes of a classification head (ignored for regression).
    """

    kind: str = "classification"
    n_classes: int = 2

    def __post_init__(self) -> None:
        validate_head(self.kind, self.n_classes)

    @property
    def logits_dimension(self) -> int:
        """Logits per example: 1 for binary and regression, n_classes otherwise."""
        return self.n_classes if self.kind == "classification" and self.n_classes > 2 else 1

    def create_estimator_spec(
        self,
        mode: str,
        logits: tf.Tensor,
        labels: Optional[tf.Tensor],
        train_op_fn: Callable[[tf.Tensor], tf.Operation],
    ) -> tf.estimator.EstimatorSpec:
        """Builds the `EstimatorSpec` of `mode` from logits.

        Args:
          mode: A `tf.estimator.ModeKeys` value.
          logits: float32 [batch, logits_dimension].
          labels: [batch] or [batch, 1] labels; None in PREDICT mode.
          train_op_fn: Returns the training op for a scalar loss; called in
            TRAIN mode only.

        Returns:
          The spec; PREDICT carries `serving_default` and `predict` (every
          prediction, from any receiver) and `classification` or `regression`
          (Classify/Regress APIs, with a tf.Example parsing receiver only).
        """
        head = _Regression() if self.kind == "regression" else _Classification(self.n_classes)
        predictions = head.predictions(logits)
        if mode == PREDICT:
            everything = tf.estimator.export.PredictOutput(predictions)
            outputs = {
                "serving_default": everything,
                self.kind: head.export_output(predictions),
                "predict": everything,
            }
            return tf.estimator.EstimatorSpec(mode, predictions=predictions, export_outputs=outputs)
        labels, loss = head.loss(logits, labels)
        if mode == EVAL:
            metrics = head.metrics(labels, predictions)
            return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
        return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op_fn(loss))


@dataclasses.dataclass(frozen=True)
class _Classification:
    """Predictions, loss and metrics of a classification head."""

    n_classes: int

    def predictions(self, logits: tf.Tensor) -> dict:
        if self.n_classes > 2:
            return {
                "logits": logits,
                "probabilities": tf.nn.softmax(logits),
                "class_ids": tf.argmax(logits, axis=1),
            }
        logistic = tf.sigmoid(logits)
        return {
            "logits": logits,
            "probabilities": tf.concat([1.0 - logistic, logistic], axis=1),
            "class_ids": tf.cast(tf.reshape(logistic, [-1]) > 0.5, tf.int64),
            "logistic": logistic,
        }

    def export_output(self, predictions: dict) -> tf.estimator.export.ExportOutput:
        """The Classify API's output: every class's score, classes named "0", "1", ..."""
        probabilities = predictions["probabilities"]
        names = tf.constant([str(index) for index in range(self.n_classes)])
        classes = tf.tile(tf.expand_dims(names, 0), [tf.shape(probabilities)[0], 1])
        return tf.estimator.export.ClassificationOutput(scores=probabilities, classes=classes)

    def loss(self, logits: tf.Tensor, labels: tf.Tensor) -> tuple:
        """Returns (int32 labels [batch], the mean cross-entropy)."""
        labels = tf.cast(tf.reshape(labels, [-1]), tf.int32)
        if self.n_classes > 2:
            losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        else:
            losses = tf.nn.sigmoid_cross_entropy_with_logits(
                labels=tf.cast(labels, tf.float32), logits=tf.reshape(logits, [-1])
            )
        return labels, tf.reduce_mean(losses)

    def metrics(self, labels: tf.Tensor, predictions: dict) -> dict:
        class_ids = predictions["class_ids"]
        metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels, class_ids)}
        if self.n_classes == 2:
            logistic = tf.reshape(predictions["logistic"], [-1])
            metrics["auc"] = tf.compat.v1.metrics.auc(labels, logistic)
            metrics["precision"] = tf.compat.v1.metrics.precision(labels, class_ids)
            metrics["recall"] = tf.compat.v1.metrics.recall(labels, class_ids)
        return metrics


class _Regression:
    """Predictions, loss and metrics of a regression head."""

    def predictions(self, logits: tf.Tensor) -> dict:
        return {"predictions": tf.reshape(logits, [-1])}

    def export_output(self, predictions: dict) -> tf.estimator.export.ExportOutput:
        """The Regress API's output: the predicted value."""
        return tf.estimator.export.RegressionOutput(value=predictions["predictions"])

    def loss(self, logits: tf.Tensor, labels: tf.Tensor) -> tuple:
        """Returns (float32 labels [batch], the mean squared error)."""
        labels = tf.cast(tf.reshape(labels, [-1]), tf.float32)
        return labels, tf.reduce_mean(tf.math.squared_difference(tf.reshape(logits, [-1]), labels))

    def metrics(self, labels: tf.Tensor, predictions: dict) -> dict:
        values = predictions["predictions"]
        return {
            "rmse": tf.compat.v1.metrics.root_mean_squared_error(labels, values),
            "mae": tf.compat.v1.metrics.mean_absolute_error(labels, values),
        }
