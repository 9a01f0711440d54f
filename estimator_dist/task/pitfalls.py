"""Known multi-worker pitfalls of a job, found before training, each with its fix.

Every task and the launcher run these checks in `estimator_dist.task.preflight`;
the `estimator_dist.check` command also runs them on a job, and reads a whole
program's source for its own (`estimator_dist.programs.scan`). A fatal
pitfall stops the job with a usage error (exit 2) before any task commits; a
warning is logged and training goes on.

>>> print(format_report([Pitfall("no-input-context", "every worker reads the same data", False)]))
pre-flight warning [no-input-context]: every worker reads the same data
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, List, Optional

#: An input_fn that cannot shard: every worker reads the same examples.
NO_INPUT_CONTEXT = (
    "input_fn {name} takes no `input_context`, so it cannot shard its data over the "
    "{workers} workers: Estimator calls it unchanged on every worker and does not shard "
    "what it returns, so unless it shards by other means every worker reads the same "
    "examples and each epoch is read {workers} times. Fix: declare "
    "`input_fn(mode, input_context=None, params=None)` and shard by "
    "input_context.input_pipeline_id; check it with --params=record_read_ids=DIR and "
    "`python -m input_fns.verify`."
)
#: A Keras model handed to the bridge without `compile`.
KERAS_NOT_COMPILED = (
    "--keras_model={name} returned a model that is not compiled; model_to_estimator "
    "needs its optimizer and loss. Fix: call model.compile(optimizer="
    "tf.keras.optimizers.legacy.SGD(...), loss=...) before returning it."
)
#: A subclassed Keras model handed to the bridge.
KERAS_SUBCLASSED = (
    "--keras_model={name} returned a subclassed model ({cls}); model_to_estimator converts "
    "only Functional and Sequential models, whose graph it can clone on every worker. Fix: "
    "build the same layers with tf.keras.Input(...) and tf.keras.Model(inputs, outputs), or "
    "write a model_fn that calls the subclassed model and uses a tf.compat.v1.train "
    "optimizer."
)
#: A Keras optimizer that the bridge cannot use.
KERAS_OPTIMIZER = (
    "--keras_model={name} is compiled with {optimizer}, a non-legacy Keras optimizer; "
    "model_to_estimator in TensorFlow 2.15 supports only tf.keras.optimizers.legacy "
    "optimizers. Fix: compile with tf.keras.optimizers.legacy.{short}(...)."
)


@dataclasses.dataclass(frozen=True)
class Pitfall:
    """One problem found before training.

    Attributes:
      code: Short stable name, such as `no-input-context`.
      message: What is wrong, why it matters under multi-worker training,
        and the fix.
      fatal: Whether the job must not start.
    """

    code: str
    message: str
    fatal: bool


def check_input_fn(input_fn: Callable, name: str, num_workers: int) -> Optional[Pitfall]:
    """Returns a warning when a multi-worker job's input_fn has no `input_context`."""
    if num_workers < 2 or "input_context" in inspect.signature(input_fn).parameters:
        return None
    return Pitfall(
        "no-input-context", NO_INPUT_CONTEXT.format(name=name, workers=num_workers), False
    )


def check_keras_model(model: Any, name: str) -> List[Pitfall]:
    """Returns what keeps `model` from training under `model_to_estimator` on many workers."""
    import tensorflow as tf

    found = []
    if not getattr(model, "_is_graph_network", False) and not isinstance(
        model, tf.keras.Sequential
    ):
        found.append(
            Pitfall(
                "keras-subclassed",
                KERAS_SUBCLASSED.format(name=name, cls=type(model).__name__),
                True,
            )
        )
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        found.append(Pitfall("keras-not-compiled", KERAS_NOT_COMPILED.format(name=name), True))
    elif not isinstance(optimizer, tf.keras.optimizers.legacy.Optimizer):
        short = type(optimizer).__name__
        found.append(
            Pitfall(
                "keras-optimizer",
                KERAS_OPTIMIZER.format(
                    name=name, optimizer=f"{type(optimizer).__module__}.{short}", short=short
                ),
                True,
            )
        )
    return found


def format_report(pitfalls: List[Pitfall]) -> str:
    """Returns one line per pitfall, fatal ones first, or a line saying none were found."""
    if not pitfalls:
        return "pre-flight: no multi-worker pitfalls found."
    ordered = sorted(pitfalls, key=lambda pitfall: not pitfall.fatal)
    return "\n".join(
        f"pre-flight {'error' if p.fatal else 'warning'} [{p.code}]: {p.message}" for p in ordered
    )
