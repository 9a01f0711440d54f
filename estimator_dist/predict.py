"""Predict with an exported SavedModel: no Estimator, and a strategy only if asked.

  python -m estimator_dist.predict --export_dir=/shared/run1 --input_fn=digits \\
      --data_dir=.data/tfds --max_examples=100 --output=/tmp/predictions.jsonl

`--export_dir` is a SavedModel, a directory of timestamped exports (the
newest is used), or a model_dir (its newest `export/best` or `export/latest`
export). `--input_fn` is called as `Estimator.predict` calls it (in a graph
with a global step, mode PREDICT, the arguments it declares) and may return
a Dataset or `(features, labels)` tensors (`numpy_input_fn`); a
`MonitoredSession` running queue runners reads it until it ends or
`--max_examples`. Each prediction is one JSON line with the example's position
and label. This module never imports `tensorflow_estimator` (user code may):
the model runs from the SavedModel alone, as in TensorFlow's multi-worker
tutorial, without a strategy or (`--strategy=mirrored`) in a MirroredStrategy.
"""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any, Dict, Sequence

from absl import flags

from estimator_dist.report.cli import run_program, usage_exit
from estimator_dist.serving.predict import STRATEGIES

PROGRAM = "estimator_dist.predict"

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


def main(argv: Sequence[str]) -> int:
    """Entry point: predicts, then prints a one-line summary to standard error."""
    if len(argv) > 1:
        usage_exit(PROGRAM, f"unexpected positional arguments {list(argv[1:])}.")
    from estimator_dist.base.errors import Error, UsageError
    from estimator_dist.base.params import parse_params_flag
    from estimator_dist.serving.predict import run_predictions

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
    except Error as error:
        sys.stderr.write(f"{PROGRAM}: error: {error}\n")
        sys.exit(error.exit_code)
    sys.stderr.write(f"{PROGRAM}: {json.dumps(summary, sort_keys=True)}\n")
    return 0


def run() -> None:
    """Console-script entry point."""
    run_program(main, PROGRAM)


if __name__ == "__main__":
    run()
