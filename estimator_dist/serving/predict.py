"""Predictions from an exported SavedModel: no Estimator, and a strategy only if asked.

`run_predictions` finds the SavedModel (an export, a directory of timestamped
exports, or a model_dir's newest `export/best` or `export/latest`), calls the
input_fn as `Estimator.predict` calls it (in a graph with a global step, mode
PREDICT, the arguments it declares), reads it with a `MonitoredSession` until it
ends or `max_examples`, and writes one JSON line per example with its position
and label. It never imports `tensorflow_estimator` (user code may): the model
runs from the SavedModel alone, without a strategy or in a MirroredStrategy.
`python -m estimator_dist.predict` is its command line.
"""

from __future__ import annotations

import contextlib
import json
import os
import traceback
from operator import itemgetter
from typing import IO, Any, Dict, Iterator, Mapping, Optional

STRATEGIES = ("none", "mirrored")
#: The message predict ends with (exit 5) when the user's input_fn raises.
INPUT_FN_RAISED = (
    "--input_fn={name} raised {error}: {message}. predict calls it as Estimator.predict "
    "does (in a graph with a global step, with mode PREDICT and the arguments it declares, "
    "params from --params, --batch_size and --data_dir) and reads it until it ends; its "
    "traceback is in the log above. Fix the input_fn, or pass the one the model was trained "
    "with, and run again."
)
#: The usage error (exit 2) for an input that never ends when --max_examples is not set.
ENDLESS_INPUT = (
    "--input_fn={name} never ends in mode PREDICT (numpy_input_fn(num_epochs=None), a Dataset "
    "that repeats, or tensors not read from a Dataset or a queue), so predict would run "
    "forever. Pass --max_examples=N to predict the first N examples, or make the input end "
    "when mode is PREDICT (num_epochs=1, no repeat())."
)


def find_saved_model(path: str) -> str:
    """Resolves a SavedModel, a directory of timestamped exports, or a model_dir.

    Raises:
      UsageError: if no SavedModel is found there.
    """
    import tensorflow as tf

    from estimator_dist.base.errors import UsageError

    def has_model(directory: str) -> bool:
        return tf.io.gfile.exists(os.path.join(directory, "saved_model.pb"))

    if has_model(path):
        return path
    for parent in (
        path,
        os.path.join(path, "export", "best"),
        os.path.join(path, "export", "latest"),
    ):
        if not tf.io.gfile.isdir(parent):
            continue
        exports = sorted(
            (name.rstrip("/") for name in tf.io.gfile.listdir(parent)),
            key=lambda name: (not name.isdigit(), name.zfill(20)),
        )
        found = [
            os.path.join(parent, name) for name in exports if has_model(os.path.join(parent, name))
        ]
        if found:
            return found[-1]
    raise UsageError(
        f"--export_dir={path} holds no SavedModel (saved_model.pb), no timestamped exports and "
        "no export/best or export/latest directory. Pass a model_dir trained with --export "
        "(the default) or the path of one export."
    )


def _to_json(value: Any) -> Any:
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, list):
        return [_to_json(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _to_json(item) for key, item in value.items()}
    return value


def predict(
    export_dir: str,
    batches: Iterator[tuple],
    signature: Optional[str] = None,
    strategy: str = "none",
) -> Iterator[Dict[str, Any]]:
    """Yields one dict of outputs (plus `label` when known) per example.

    Args:
      export_dir: A SavedModel directory.
      batches: `(features, labels)` or `features` batches; features is a dict
        of tensors named as the signature's inputs.
      signature: Name of the signature to call; None picks `serving_default`,
        else `predict`, else the only signature.
      strategy: `none`, or `mirrored` to load and run under MirroredStrategy.

    Yields:
      `{output_name: value, ..., "label": value}` per example, as numpy data.
    """
    import numpy as np
    import tensorflow as tf

    from estimator_dist.base.errors import UsageError

    scope = tf.distribute.MirroredStrategy() if strategy == "mirrored" else None
    if scope is not None:
        with scope.scope():
            loaded = tf.saved_model.load(export_dir)
    else:
        loaded = tf.saved_model.load(export_dir)
    available = sorted(loaded.signatures)
    if signature is None:
        preferred = [name for name in ("serving_default", "predict") if name in available]
        signature = (preferred or available)[0] if preferred or len(available) == 1 else None
    if signature not in available:
        raise UsageError(
            f"--signature={signature}: {export_dir} has signatures {', '.join(available)}; "
            "name one with --signature."
        )
    function = loaded.signatures[signature]
    names = sorted(function.structured_input_signature[1])
    for batch in batches:
        features, labels = batch if isinstance(batch, tuple) else (batch, None)
        if not isinstance(features, Mapping):
            features = {names[0]: features}
        missing = sorted(set(names) - set(features))
        if missing:
            raise UsageError(
                f"The input_fn gives features {', '.join(sorted(features))}, but signature "
                f"{signature} of {export_dir} takes {', '.join(names)}: missing "
                f"{', '.join(missing)}. Use the input_fn and --params the model was trained with."
            )
        inputs = {name: tf.convert_to_tensor(features[name]) for name in names}
        try:
            if scope is not None:
                replicas = scope.experimental_local_results(scope.run(function, kwargs=inputs))
                outputs = {
                    key: tf.concat([result[key] for result in replicas], axis=0)
                    for key in replicas[0]
                }
            else:
                outputs = function(**inputs)
        except (TypeError, ValueError, tf.errors.InvalidArgumentError) as error:
            raise UsageError(_refused(signature, export_dir, function, inputs, error)) from None
        arrays = {key: value.numpy() for key, value in outputs.items()}
        count = len(next(iter(arrays.values())))
        label_values = None if labels is None else tf.nest.map_structure(np.asarray, labels)
        for index in range(count):
            record = {key: value[index] for key, value in arrays.items()}
            if label_values is not None:
                record["label"] = tf.nest.map_structure(itemgetter(index), label_values)
            yield record


def _cause(error: Exception) -> str:
    """The line of an error that says what happened (a TensorFlow error's first is generic)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return next((line for line in lines if line != "Graph execution error:"), "")


def _refused(
    signature: str, export_dir: str, function: Any, inputs: Mapping, error: Exception
) -> str:
    """The message for features the signature refuses: what it takes, what it was given."""
    specs = sorted(function.structured_input_signature[1].items())
    takes, given = (
        ", ".join(f"{name} {value.dtype.name}{value.shape}" for name, value in pairs)
        for pairs in (specs, inputs.items())
    )
    return (
        f"Signature {signature} of {export_dir} takes {takes}, but the input_fn gives {given} "
        f"({type(error).__name__}: {_cause(error)}). Use the input_fn and --params the model "
        "was trained with."
    )


@contextlib.contextmanager
def _calling_input_fn(name: str) -> Iterator[None]:
    """Turns an exception of the user's input_fn into a `UserCodeError` (exit 5).

    The package's own errors pass through; the user's traceback is logged
    once, before the one-line message the program ends with.
    """
    from absl import logging

    from estimator_dist.base.errors import Error, UserCodeError

    try:
        yield
    except Error:
        raise
    except Exception as error:  # Any exception of user code is reported as one.
        logging.error("--input_fn=%s raised:\n%s", name, traceback.format_exc())
        raise UserCodeError(
            INPUT_FN_RAISED.format(name=name, error=type(error).__name__, message=_cause(error))
        ) from None


def _reads_input(graph: Any) -> bool:
    """Whether a graph reads from a Dataset iterator or a queue, and so can end."""
    import tensorflow as tf

    return bool(graph.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS)) or any(
        op.type.startswith("IteratorGetNext") for op in graph.get_operations()
    )


def _input_graph(input_fn_name: str, params: Mapping[str, Any], limit: Optional[int]) -> tuple:
    """Calls the input_fn as `Estimator.predict` does, in a graph of its own.

    Returns:
      (graph, fetches, iterator initializer or None, whether labels are fetched).

    Raises:
      UsageError: for a bad name, arguments Estimator cannot supply, a result
        that is not a Dataset or `(features, labels)`, or an endless input
        without `limit`.
      UserCodeError: when the input_fn raises.
    """
    import tensorflow as tf

    from estimator_dist.base.errors import UsageError
    from estimator_dist.task.user_code import (
        call_input_fn,
        check_input_fn_args,
        present_input_fn,
        repeats_forever,
    )
    from input_fns import INPUT_FNS, prepare_input
    from input_fns.pipeline import PREDICT

    input_fn = INPUT_FNS.get(input_fn_name)
    check_input_fn_args(input_fn, input_fn_name, "--input_fn")
    prepare_input(input_fn_name, params)
    bound = present_input_fn(input_fn, params)
    graph = tf.Graph()
    with graph.as_default(), _calling_input_fn(input_fn_name):
        tf.compat.v1.train.get_or_create_global_step()
        result = call_input_fn(bound, PREDICT)
        endless = repeats_forever(bound, result)
        initializer = None
        if isinstance(result, tf.data.Dataset):
            iterator = tf.compat.v1.data.make_initializable_iterator(result)
            initializer, result = iterator.initializer, iterator.get_next()
        elif endless is None:
            endless = not _reads_input(graph)
    if limit is None and endless:
        raise UsageError(ENDLESS_INPUT.format(name=input_fn_name))
    result = tuple(result) if isinstance(result, list) else result
    if isinstance(result, tuple) and len(result) != 2:
        raise UsageError(
            f"--input_fn={input_fn_name} returned {len(result)} items; Estimator takes a "
            "Dataset, features, or (features, labels). Return one of those."
        )
    features, labels = result if isinstance(result, tuple) else (result, None)
    fetches = features if labels is None else (features, labels)
    return graph, fetches, initializer, labels is not None


def _batches(input_fn_name: str, params: Mapping[str, Any], limit: Optional[int]) -> Iterator:
    """Yields `(features, labels)` numpy batches, `limit` examples at most.

    As `Estimator.predict` reads its input: a `MonitoredSession` (which
    starts the queue runners of `numpy_input_fn` and its kind) runs the
    input's tensors until the input ends (`OutOfRangeError`).
    """
    import tensorflow as tf

    graph, fetches, initializer, labeled = _input_graph(input_fn_name, params, limit)
    with graph.as_default(), _calling_input_fn(input_fn_name):
        session = tf.compat.v1.train.MonitoredSession()
        if initializer is not None:
            session.run(initializer)
    try:
        remaining = limit
        while remaining is None or remaining > 0:
            with _calling_input_fn(input_fn_name):
                try:
                    values = session.run(fetches)
                except tf.errors.OutOfRangeError:
                    return
            size = len(tf.nest.flatten(values)[0])
            if remaining is not None:
                values = tf.nest.map_structure(itemgetter(slice(remaining)), values)
                remaining -= size
            yield values if labeled else (values, None)
    finally:
        session.close()


def _is_one_number(value: Any) -> bool:
    return getattr(value, "size", None) == 1 and value.dtype.kind in "iu"


def run_predictions(
    export_dir: str,
    input_fn_name: str,
    params: Mapping[str, Any],
    output: IO[str],
    max_examples: Optional[int] = None,
    signature: Optional[str] = None,
    strategy: str = "none",
) -> Dict[str, Any]:
    """Predicts what `input_fn_name` gives in mode PREDICT and writes JSON lines.

    Returns:
      A summary: the SavedModel used, the number of examples, and the
      accuracy when the model outputs class ids and the data has labels.

    Raises:
      UsageError: for a bad name, export, signature or input (exit 2).
      UserCodeError: when the input_fn raises (exit 5).
    """
    path = find_saved_model(export_dir)
    count = scored = correct = 0
    for record in predict(path, _batches(input_fn_name, params, max_examples), signature, strategy):
        classes = record.get("class_ids", record.get("classes"))
        label = record.get("label")
        if classes is not None and _is_one_number(label) and classes.dtype.kind in "iu":
            scored += 1
            correct += int(int(classes.reshape(-1)[0]) == int(label.reshape(-1)[0]))
        line = {"index": count, **{key: _to_json(value) for key, value in record.items()}}
        output.write(json.dumps(line) + "\n")
        count += 1
    summary: Dict[str, Any] = {"saved_model": path, "examples": count, "strategy": strategy}
    if scored:
        summary["accuracy"] = correct / scored
    return summary
