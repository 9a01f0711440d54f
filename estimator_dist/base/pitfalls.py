"""Known multi-worker pitfalls, found before training, each with its fix.

Every task and the launcher run these checks in `estimator_dist.task.preflight`; the
`estimator_dist.check` command also runs them on a job and scans a legacy
training script. A fatal pitfall stops the job with a usage error (exit 2)
before any task commits; a warning is logged and training goes on.

>>> [p.code for p in scan_source("est.train(input_fn=fn, max_steps=10)")]
['estimator-train']
>>> print(script_verdict("import tensorflow as tf; tf.estimator.train_and_evaluate(e, t, v)"))
will run with --script: yes (calls tf.estimator.train_and_evaluate at line 1)
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
from typing import Any, Callable, List, Optional, Tuple

from estimator_dist.base import program_scan
from estimator_dist.base.program_scan import _is_estimator_call

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
#: `save_checkpoints_secs` with collective strategies.
CHECKPOINT_SECS = (
    "{where}save_checkpoints_secs{value} cannot be used with {strategy}: workers reach a "
    "time boundary at different steps, and a checkpoint save that runs collective ops on "
    "some workers but not others can deadlock the job (TensorFlow warns 'Collective ops may "
    "deadlock' and silently switches to every 1000 steps). Fix: use save_checkpoints_steps "
    "(--save_checkpoints_steps) instead."
)
#: `save_checkpoints_secs` in a program's own RunConfig: what TensorFlow does with it on a cluster.
CHECKPOINT_SECS_PROGRAM = (
    "{where}save_checkpoints_secs: on a cluster TensorFlow checkpoints every 1000 steps instead "
    "(MonitoredSession's rule for collective strategies, whose workers must save at the same "
    "step; it logs 'Collective ops may deadlock with save_checkpoints_secs'); the last step is "
    "still checkpointed and evaluated. To choose the interval, give save_checkpoints_steps."
)
#: `estimator.train` and `estimator.evaluate` in a script's source: information, not an error.
ESTIMATOR_SEGMENT = (
    "{where}calls estimator.{method}(...): on a cluster each call runs as one synchronised "
    "segment on every worker, so every worker must make the same calls with the same steps. "
    "tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec) does both in one run, "
    "the evaluator evaluating each checkpoint while the workers train."
)
#: A TrainSpec without `max_steps`.
NO_MAX_STEPS = (
    "{where}TrainSpec(...) sets no max_steps, so training runs until the input ends. On a "
    "cluster every training task counts its input before training and all stop at the fewest "
    "batches any of them has (the rest of a longer shard is not trained); an input that never "
    "ends, or a cluster with parameter servers, needs TrainSpec(input_fn, max_steps=N)."
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


def _called_name(node: ast.Call) -> Optional[str]:
    function = node.func
    if isinstance(function, ast.Attribute):
        return function.attr
    return function.id if isinstance(function, ast.Name) else None


def scan_source(source: str, filename: str = "<script>") -> List[Pitfall]:
    """Finds multi-worker pitfalls in the source of a legacy Estimator script.

    Looks for `<estimator>.train(...)` calls (any call of a `train` attribute
    with arguments) and `<estimator>.evaluate(...)` calls (with Estimator's
    keywords or an input function), `save_checkpoints_secs=` in any call (a
    warning: TensorFlow checkpoints by steps instead on a cluster),
    `TrainSpec(...)` without `max_steps`, and training input_fns that take no
    `input_context`: the functions the source hands `TrainSpec` or `train()`
    (by name, or called in a lambda), else those whose name ends in
    `input_fn` and says neither eval, serving nor predict.

    Args:
      source: Python source code.
      filename: Shown in the messages.

    Returns:
      The pitfalls, in source order.

    Raises:
      SyntaxError: if `source` is not Python.
    """
    return [pitfall for _, pitfall in _scan(ast.parse(source, filename), filename)]


def _scan(tree: ast.AST, filename: str) -> List[Tuple[int, Pitfall]]:
    """`scan_source` with the line of each pitfall, in source order."""
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        where = f"{filename}:{line}: "
        if isinstance(node, ast.Call):
            keywords = {keyword.arg for keyword in node.keywords}
            method = _is_estimator_call(node)
            if method:
                message = ESTIMATOR_SEGMENT.format(where=where, method=method)
                found.append((line, Pitfall(f"estimator-{method}", message, False)))
            # A `**kwargs` or `*args` argument may hold max_steps.
            splat = None in keywords or any(isinstance(a, ast.Starred) for a in node.args)
            spec_without_steps = not splat and "max_steps" not in keywords and len(node.args) < 2
            if _called_name(node) == "TrainSpec" and spec_without_steps:
                message = NO_MAX_STEPS.format(where=where)
                found.append((line, Pitfall("no-max-steps", message, False)))
            if "save_checkpoints_secs" in keywords:
                message = CHECKPOINT_SECS_PROGRAM.format(where=where)
                found.append((line, Pitfall("checkpoint-secs", message, False)))
    training = _training_inputs(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            arguments = [a.arg for a in node.args.args + node.args.kwonlyargs]
            if _trains_on(node.name, training) and "input_context" not in arguments:
                where = f"{filename}:{node.lineno}: "
                message = NO_INPUT_CONTEXT.format(name=f"{where}{node.name}", workers="N")
                found.append((node.lineno, Pitfall("no-input-context", message, False)))
    return sorted(found, key=lambda item: item[0])


def _training_inputs(tree: ast.AST) -> set:
    """Names of the functions the source hands `TrainSpec(...)` or `<estimator>.train(...)`.

    The input argument itself when it is a name, or the functions a lambda
    passed there calls.
    """
    names = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if _called_name(node) != "TrainSpec" and _is_estimator_call(node) != "train":
            continue
        given = [k.value for k in node.keywords if k.arg == "input_fn"] + node.args[:1]
        for value in given:
            if isinstance(value, ast.Lambda):
                names |= {
                    name
                    for call in ast.walk(value.body)
                    if isinstance(call, ast.Call) and (name := _called_name(call))
                }
            elif isinstance(value, (ast.Name, ast.Attribute)):
                names.add(value.id if isinstance(value, ast.Name) else value.attr)
    return names


def _trains_on(name: str, training: set) -> bool:
    """Whether the function `name` is a training input: named so, or by its name's words."""
    if training:
        return name in training
    lowered = name.lower()
    others = ("eval", "serving", "serve", "predict", "test")
    return lowered.endswith("input_fn") and not any(word in lowered for word in others)


def script_verdict(source: str, filename: str = "<script>") -> program_scan.Verdict:
    """Reads one script's source and says whether `--script` can run it (`program_scan`).

    Raises:
      SyntaxError: if `source` is not Python.
    """
    return program_scan.verdict(program_scan.scan_sources({"__main__": (filename, source)}))


def format_report(pitfalls: List[Pitfall]) -> str:
    """Returns one line per pitfall, fatal ones first, or a line saying none were found."""
    if not pitfalls:
        return "pre-flight: no multi-worker pitfalls found."
    ordered = sorted(pitfalls, key=lambda pitfall: not pitfall.fatal)
    return "\n".join(
        f"pre-flight {'error' if p.fatal else 'warning'} [{p.code}]: {p.message}" for p in ordered
    )
