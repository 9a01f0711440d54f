"""SavedModel exports wired into `EvalSpec`: the latest one and the best one.

The evaluator (or a single process) exports after each evaluation into
`model_dir/export/latest/<timestamp>/` and, when the chosen metric improves,
`model_dir/export/best/<timestamp>/`. The serving signature takes the same
features as the job's input_fn produces, one tensor per feature with a
free batch dimension, so `python -m estimator_dist.predict` can feed it
records read by that input_fn.

>>> name, higher = best_metric("accuracy")
>>> name, higher
('accuracy', True)
"""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Sequence

import tensorflow as tf
from absl import logging

from estimator_dist.base.errors import UsageError
from estimator_dist.config.job import best_metric


def serving_input_receiver_fn(feature_specs: Any) -> Callable[[], Any]:
    """Returns a receiver fn taking one tensor per feature, batch dimension free.

    Args:
      feature_specs: Spec of the input_fn's features: `{name: tf.TensorSpec}`,
        or one `tf.TensorSpec` when the input_fn gives features as a bare
        tensor, which the model_fn then receives bare too (the serving
        signature names it `features`).

    Returns:
      A function for `LatestExporter`/`BestExporter`/`export_saved_model`.
    """

    def placeholder(spec: tf.TensorSpec, name: str) -> tf.Tensor:
        return tf.compat.v1.placeholder(spec.dtype, [None, *spec.shape[1:]], name=name)

    def receiver() -> Any:
        if isinstance(feature_specs, tf.TensorSpec):
            tensor = placeholder(feature_specs, "features")
            return tf.estimator.export.TensorServingInputReceiver(tensor, {"features": tensor})
        tensors = {name: placeholder(spec, name) for name, spec in feature_specs.items()}
        return tf.estimator.export.ServingInputReceiver(tensors, tensors)

    return receiver


def _compare(name: str, higher_is_better: bool) -> Callable[[Mapping, Mapping], bool]:
    def is_better(
        best_eval_result: Mapping[str, Any], current_eval_result: Mapping[str, Any]
    ) -> bool:
        best, current = best_eval_result, current_eval_result
        for result in (best, current):
            if name not in result:
                raise UsageError(
                    f"--export_best_by={name}: the evaluation has no metric {name!r}; it has "
                    f"{', '.join(sorted(key for key in result if key != 'global_step'))}."
                )
        if higher_is_better:
            return current[name] > best[name]
        return current[name] < best[name]

    return is_better


class _SkipVanishedCheckpoint(tf.estimator.Exporter):
    """An exporter that skips a checkpoint deleted since its evaluation, instead of failing.

    The evaluator evaluates a checkpoint, then exports it; meanwhile the chief
    may have deleted it (`--keep_checkpoint_max` keeps only the newest), which
    would fail the evaluator with "not a valid checkpoint". The next
    evaluation exports a newer one, and the final checkpoint is never deleted.
    """

    def __init__(self, exporter: tf.estimator.Exporter) -> None:
        self._exporter = exporter

    @property
    def name(self) -> str:
        return self._exporter.name

    def export(
        self,
        estimator: tf.estimator.Estimator,
        export_path: str,
        checkpoint_path: str,
        eval_result: Mapping[str, Any],
        is_the_final_export: bool,
    ) -> Any:
        try:
            return self._exporter.export(
                estimator, export_path, checkpoint_path, eval_result, is_the_final_export
            )
        except (ValueError, tf.errors.OpError):
            if tf.io.gfile.exists(f"{checkpoint_path}.index"):
                raise
            logging.warning(
                "Not exporting %s: the chief deleted it after it was evaluated (it keeps the "
                "newest --keep_checkpoint_max); a later evaluation exports a newer one.",
                checkpoint_path,
            )
            return None


def make_exporters(
    feature_specs: Any,
    exports: Sequence[str],
    best_by: str,
    exports_to_keep: int,
) -> List[tf.estimator.Exporter]:
    """Returns the `latest` and/or `best` exporters for `EvalSpec(exporters=...)`.

    Args:
      feature_specs: Spec of the features, see `serving_input_receiver_fn`.
      exports: Any of `latest`, `best`.
      best_by: `metric`, `metric:min` or `metric:max`, see `best_metric`.
      exports_to_keep: Exports kept of each kind.

    Returns:
      The exporters, in the order of `exports`, each skipping a checkpoint
      deleted since its evaluation (`_SkipVanishedCheckpoint`).
    """
    receiver = serving_input_receiver_fn(feature_specs)
    exporters: List[tf.estimator.Exporter] = []
    for kind in exports:
        if kind == "latest":
            exporters.append(
                tf.estimator.LatestExporter("latest", receiver, exports_to_keep=exports_to_keep)
            )
        else:
            name, higher = best_metric(best_by)
            logging.info(
                "Exporting the best model by %s (%s is better).",
                name,
                "higher" if higher else "lower",
            )
            exporters.append(
                tf.estimator.BestExporter(
                    "best",
                    receiver,
                    compare_fn=_compare(name, higher),
                    exports_to_keep=exports_to_keep,
                )
            )
    return [_SkipVanishedCheckpoint(exporter) for exporter in exporters]
