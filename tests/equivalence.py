"""Does synchronous 2-worker training equal 1-worker training with the same global batch?

The harness trains a model in one process with global batch B and, as soon
as that run has written its step-0 checkpoint, at the same time through the
launcher with 2 workers (per-worker batch B/2) over each requested
collective implementation. The 2-worker runs warm-start from the 1-worker
run's step-0 checkpoint, so models whose
initialisers are not seeded (TF1 layers, canned estimators) start from the
same weights too. It returns the largest absolute difference between the
checkpoints' variables (weights, optimizer slots, batch-norm statistics;
not the global step), and how far training moved the weights, which must
be far above the tolerance for the comparison to mean anything.

Inputs must be deterministic and example-sharded (worker i reads examples
i, i+2, ... with no shuffling), so that the two workers' batches at each
step hold exactly the examples of the one-worker batch.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Callable, Dict, Mapping, Optional, Sequence

import numpy as np
import tensorflow as tf

from tests.procs import Run, run_modules

TOLERANCE = 1e-5
TIMEOUT = 300


def checkpoint_variables(model_dir: str, step: Optional[int] = None) -> Dict[str, np.ndarray]:
    """Returns the float variables of the latest (or step `step`) checkpoint."""
    path = tf.train.latest_checkpoint(model_dir)
    assert path, f"no checkpoint in {model_dir}"
    if step is not None:
        path = f"{path.rsplit('-', 1)[0]}-{step}"
    reader = tf.train.load_checkpoint(path)
    dtypes = reader.get_variable_to_dtype_map()
    return {
        name: reader.get_tensor(name)
        for name, dtype in dtypes.items()
        if dtype.is_floating and name != "global_step"
    }


def _initial_checkpoint(model_dir: str) -> Callable[[], bool]:
    """The condition for the 2-worker runs to start: the 1-worker step-0 checkpoint exists."""

    # The index is written last, once the checkpoint's data is in place.
    return lambda: os.path.exists(os.path.join(model_dir, "model.ckpt-0.index"))


def max_difference(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> float:
    """Largest absolute difference over the variables of two checkpoints (same names)."""
    assert a and a.keys() == b.keys(), (sorted(a), sorted(b))
    # Ghost batch norm stores beta and gamma as [1, 1, 1, 1, C] instead of [C].
    return max(
        float(np.max(np.abs(a[name].reshape(b[name].shape) - b[name]))) if a[name].size else 0.0
        for name in a
    )


@dataclasses.dataclass
class Comparison:
    """The outcome of `compare_with_one_worker`.

    Attributes:
      differences: Max |w(2 workers) - w(1 worker)| per collective implementation
        or variant.
      moved: Max |w(1 worker, end) - w(1 worker, step 0)|.
      reference: model_dir of the 1-worker run.
      runs: The launcher run per implementation or variant (its model_dir holds logs,
        run_record.json and, with the evaluator, metrics and exports).
    """

    differences: Dict[str, float]
    moved: float
    reference: str
    runs: Dict[str, Run]

    def describe(self) -> str:
        parts = ", ".join(f"{name} {value:.3g}" for name, value in self.differences.items())
        return (
            f"max |w(2 workers) - w(1 worker)|: {parts}; training moved weights by {self.moved:.3g}"
        )


def compare_with_one_worker(
    tmp_path,
    args: Sequence[str],
    *,
    global_batch: int,
    steps: int,
    reference_args: Sequence[str] = (),
    communications: Sequence[str] = ("RING", "AUTO"),
    variants: Optional[Mapping[str, Sequence[str]]] = None,
    evaluator: str = "RING",
    warm_start: bool = True,
) -> Comparison:
    """Trains 1 worker with batch B, then 2 workers with B/2 each per implementation.

    Args:
      tmp_path: A fresh directory.
      args: Training flags shared by every run (model, input, params...).
      global_batch: B.
      steps: Training steps of every run.
      reference_args: Extra flags for the 1-worker run only.
      communications: Collective implementations to run, at the same time.
      variants: More 2-worker runs over RING at the same time, by name, each
        with extra training flags (a flag given again overrides the shared
        one, such as `--batch_size`).
      evaluator: The run (implementation or variant) that also has an
        evaluator task.
      warm_start: Start the 2-worker runs from the 1-worker run's step-0
        checkpoint (not possible for `--keras_model`, which starts from the
        Keras model's own, seeded, weights).

    Returns:
      The differences and the runs.
    """
    common = [
        *args,
        f"--batch_size={global_batch}",
        f"--train_steps={steps}",
        f"--save_checkpoints_steps={steps}",
        "--eval_steps=2",
        "--eval_throttle_secs=0",
    ]
    reference = str(tmp_path / "one")
    commands = [
        (
            "estimator_dist.train",
            [f"--model_dir={reference}", "--export=", *common, *reference_args],
            reference,
        )
    ]
    start = [f"--warm_start_from={reference}/model.ckpt-0"] if warm_start else []
    flags = {name: [f"--communication={name}"] for name in communications}
    for name, extra in (variants or {}).items():
        flags[name] = ["--communication=RING", *extra]
    for name, extra in flags.items():
        model_dir = str(tmp_path / name.lower())
        launcher = [
            "--num_workers=2",
            "--evaluator" if name == evaluator else "--noevaluator",
            f"--timeout_secs={TIMEOUT - 30}",
            "--max_restarts=0",
        ]
        training = [f"--model_dir={model_dir}", *start, *common, *extra]
        commands.append(("estimator_dist.launch", [*launcher, "--", *training], model_dir))
    runs = run_modules(commands, TIMEOUT, start_after=_initial_checkpoint(reference))
    runs = runs[1:]
    one = checkpoint_variables(reference)
    differences = {
        name: max_difference(one, checkpoint_variables(run.model_dir))
        for name, run in zip(flags, runs)
    }
    moved = max_difference(one, checkpoint_variables(reference, step=0))
    return Comparison(differences, moved, reference, dict(zip(flags, runs)))
