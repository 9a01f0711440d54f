"""Two canned models in one program, each for N epochs of a pandas frame, in a course's shape.

Like the Estimator notebooks of Google's machine-learning courses, it starts
fresh with `shutil.rmtree(OUTDIR)`, trains a `LinearRegressor` with
`model.train(input_fn)` and no steps (the input's epochs end training),
evaluates it, predicts, then starts fresh again and does the same with a
`DNNRegressor`. Run as it is it trains in one process:

  python tests/legacy/scripts/two_models.py --outdir=/tmp/two

`python -m estimator_dist.launch --script=...` runs it unchanged on several
workers. It writes what each task's `evaluate()` calls returned to
`--results_dir/<task>.json`.
"""

import argparse
import json
import os
import shutil

import numpy as np
import pandas as pd
import tensorflow as tf

FEATURES = ["distance", "passengers", "hour"]


def _frame(count, seed):
    rng = np.random.RandomState(seed)
    frame = pd.DataFrame(
        {
            "distance": rng.uniform(0.5, 20.0, count).astype(np.float32),
            "passengers": rng.randint(1, 6, count).astype(np.float32),
            "hour": rng.randint(0, 24, count).astype(np.float32),
        }
    )
    frame["fare"] = 2.5 + 1.8 * frame["distance"] + rng.normal(0.0, 1.0, count).astype(np.float32)
    return frame


def make_input_fn(frame, num_epochs):
    return tf.compat.v1.estimator.inputs.pandas_input_fn(
        x=frame[FEATURES], y=frame["fare"], batch_size=64, num_epochs=num_epochs, shuffle=False
    )


def _columns():
    return [tf.feature_column.numeric_column(name) for name in FEATURES]


def _task_name():
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task")
    return f"{task['type']}-{task['index']}" if task else "local"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outdir", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--results_dir", default=None)
    args = parser.parse_args()
    train, valid = _frame(640, seed=1), _frame(128, seed=2)
    results = []

    shutil.rmtree(args.outdir, ignore_errors=True)  # start fresh each time
    model = tf.estimator.LinearRegressor(feature_columns=_columns(), model_dir=args.outdir)
    model.train(input_fn=make_input_fn(train, num_epochs=args.epochs))
    results.append(model.evaluate(input_fn=make_input_fn(valid, num_epochs=1)))
    predictions = list(model.predict(input_fn=make_input_fn(valid, num_epochs=1)))

    shutil.rmtree(args.outdir, ignore_errors=True)  # start fresh each time
    model = tf.estimator.DNNRegressor(
        hidden_units=[16, 4], feature_columns=_columns(), model_dir=args.outdir
    )
    model.train(input_fn=make_input_fn(train, num_epochs=args.epochs))
    results.append(model.evaluate(input_fn=make_input_fn(valid, num_epochs=1)))

    if args.results_dir:
        os.makedirs(args.results_dir, exist_ok=True)
        shown = [{k: float(v) for k, v in sorted(r.items())} for r in results]
        with open(os.path.join(args.results_dir, f"{_task_name()}.json"), "w") as stream:
            json.dump({"results": shown, "predictions": len(predictions)}, stream)


if __name__ == "__main__":
    main()
