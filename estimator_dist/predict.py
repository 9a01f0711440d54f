"""Predict with an exported SavedModel: no Estimator, and a strategy only if asked.

  python -m estimator_dist.predict --export_dir=/shared/run1 --input_fn=digits \\
      --data_dir=.data/tfds --max_examples=100 --output=/tmp/predictions.jsonl

`--export_dir` is a SavedModel, a directory of timestamped exports (the
newest is used), or a model_dir (its newest `export/best` or `export/latest`
export). The input records are the evaluation data of `--input_fn` with its
`--params`, as in training; each prediction is written as one JSON line with
the example's position and label. This module never imports
`tensorflow_estimator`: the model runs from the SavedModel alone, as in
TensorFlow's multi-worker tutorial, which reloads the model without a
strategy or (`--strategy=mirrored`) inside a `MirroredStrategy` scope.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import IO, Any, Dict, Iterator, Mapping, Optional, Sequence

from absl import flags

from estimator_dist.base.cli import run_program, usage_exit

PROGRAM = "estimator_dist.predict"
STRATEGIES = ("none", "mirrored")

_EXPORT_DIR = flags.DEFINE_string(
    "export_dir", None, "SavedModel, directory of exports, or model_dir.", required=True
)
_INPUT_FN = flags.DEFINE_string(
    "input_fn", "digits", "input_fn whose evaluation data is predicted (name or module:function)."
)
_PARAMS = flags.DEFINE_string("params", "", "input_fn parameters: key=value,... or a file.")
_DATA_DIR = flags.DEFINE_string("data_dir", None, "Dataset directory, as in training.")
_BATCH_SIZE = flags.DEFINE_integer("batch_size", 64, "Examples per call.", lower_bound=1)
_MAX_EXAMPLES = flags.DEFINE_integer(
    "max_examples", None, "Predict at most this many examples; default all.", lower_bound=1
)
_OUTPUT = flags.DEFINE_string("output", None, "JSON-lines file; default standard output.")
_SIGNATURE = flags.DEFINE_string(
    "signature",
    None,
    "Signature to call; default serving_default, else predict (canned estimators export only "
    "predict for raw feature tensors), else the only one.",
)
_STRATEGY = flags.DEFINE_enum(
    "strategy", "none", STRATEGIES, "Load and run under this distribution strategy."
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
        inputs = {name: features[name] for name in names}
        if scope is not None:
            replicas = scope.experimental_local_results(scope.run(function, kwargs=inputs))
            outputs = {
                key: tf.concat([result[key] for result in replicas], axis=0) for key in replicas[0]
            }
        else:
            outputs = function(**inputs)
        arrays = {key: value.numpy() for key, value in outputs.items()}
        count = len(next(iter(arrays.values())))
        label_values = None if labels is None else labels.numpy()
        for index in range(count):
            record = {key: value[index] for key, value in arrays.items()}
            if label_values is not None:
                record["label"] = label_values[index]
            yield record


def _batches(input_fn_name: str, params: Mapping[str, Any], limit: Optional[int]) -> Iterator:
    import tensorflow as tf

    from estimator_dist.base.errors import UsageError
    from estimator_dist.user_code import bind_input_fn, check_input_fn_args
    from input_fns import INPUT_FNS, prepare_input
    from input_fns.pipeline import EVAL

    input_fn = INPUT_FNS.get(input_fn_name)
    check_input_fn_args(input_fn, input_fn_name, "--input_fn")
    prepare_input(input_fn_name, params)
    dataset = bind_input_fn(input_fn, params)(EVAL)
    if not isinstance(dataset, tf.data.Dataset):
        raise UsageError(
            f"--input_fn={input_fn_name} returned {type(dataset).__name__}; predict reads "
            "batches from an input_fn that returns a tf.data.Dataset (graph tensors such as "
            "numpy_input_fn's cannot be read here). Pass an input_fn that returns a Dataset."
        )
    if limit is not None:
        dataset = dataset.unbatch().take(limit).batch(params["batch_size"])
    return iter(dataset)


def run_predictions(
    export_dir: str,
    input_fn_name: str,
    params: Mapping[str, Any],
    output: IO[str],
    max_examples: Optional[int] = None,
    signature: Optional[str] = None,
    strategy: str = "none",
) -> Dict[str, Any]:
    """Predicts the evaluation data of `input_fn_name` and writes JSON lines.

    Returns:
      A summary: the SavedModel used, the number of examples, and the
      accuracy when the model outputs class ids and the data has labels.
    """
    path = find_saved_model(export_dir)
    count = scored = correct = 0
    for record in predict(path, _batches(input_fn_name, params, max_examples), signature, strategy):
        classes = record.get("class_ids", record.get("classes"))
        if classes is not None and "label" in record and classes.dtype.kind in "iu":
            scored += 1
            correct += int(int(classes.reshape(-1)[0]) == int(record["label"]))
        line = {"index": count, **{key: _to_json(value) for key, value in record.items()}}
        output.write(json.dumps(line) + "\n")
        count += 1
    summary: Dict[str, Any] = {"saved_model": path, "examples": count, "strategy": strategy}
    if scored:
        summary["accuracy"] = correct / scored
    return summary


def main(argv: Sequence[str]) -> int:
    """Entry point: predicts, then prints a one-line summary to standard error."""
    if len(argv) > 1:
        usage_exit(PROGRAM, f"unexpected positional arguments {list(argv[1:])}.")
    from estimator_dist.base.errors import UsageError
    from estimator_dist.base.params import parse_params_flag

    try:
        params: Dict[str, Any] = {
            **parse_params_flag(_PARAMS.value),
            "batch_size": _BATCH_SIZE.value,
            "data_dir": _DATA_DIR.value,
            "seed": 0,
        }
        with contextlib.ExitStack() as stack:
            output = stack.enter_context(open(_OUTPUT.value, "w")) if _OUTPUT.value else sys.stdout
            summary = run_predictions(
                _EXPORT_DIR.value,
                _INPUT_FN.value,
                params,
                output,
                _MAX_EXAMPLES.value,
                _SIGNATURE.value,
                _STRATEGY.value,
            )
    except UsageError as error:
        usage_exit(PROGRAM, str(error))
    sys.stderr.write(f"{PROGRAM}: {json.dumps(summary, sort_keys=True)}\n")
    return 0


def run() -> None:
    """Console-script entry point."""
    run_program(main, PROGRAM)


if __name__ == "__main__":
    run()
