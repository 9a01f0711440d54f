"""A legacy program's `train()` / `evaluate()` / `export_saved_model()` loop on a cluster.

Programs that train in cycles (`estimator.train(fn, steps=1000)`, then
`results = estimator.evaluate(eval_fn)`, a branch on `results`, an export)
are refused by TensorFlow on a task of a cluster ("Only STANDALONE_CLIENT mode
is supported"). Every task runs the same program, so each makes the same calls
in the same order; `LoopTask` gives each call a meaning every task agrees on:

* `train()` on the chief and the workers: one synchronised segment, TensorFlow's
  `train_and_evaluate` (through `ScriptTask`) to a target every task computes
  alike: `max_steps`, the previous segment's end plus `steps`, or where the
  input that yields the fewest batches ends (`exchange_counts`).
  A `train()` inside an estimator's constructor (a helper it trains, as
  TensorFlow Lattice's crystals ensembles do on the chief alone) runs on the
  task that calls it, outside the cluster, as in one process.
* `evaluate()`: computed once, by the chief, on its segment's last checkpoint;
  every task returns the chief's dict, with its numpy types.
* `export_saved_model()`: written once, by the chief; the others get its path.
* `predict()`: each task predicts on its own, outside the cluster.
* `shutil.rmtree(model_dir)`: the chief clears it, keeping the launcher's logs.
* The evaluator task has no part: it ends (exit 0) at the program's first call.

Results travel through `model_dir/loop/<attempt>/`; a task waiting for one fails
when its writer is gone (exit 150) or late past the start-up timeout (151). In
one process the calls run as plain Estimator runs them. docs/scripts.md says more.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Protocol, Tuple

import tensorflow as tf
from absl import logging

from estimator_dist.base import files
from estimator_dist.base.errors import ClusterTimeoutError, PeerFailureError, UsageError
from estimator_dist.cluster.tf_config import CHIEF, EVALUATOR, WORKER, ClusterConfig
from estimator_dist.config.guards import GuardConfig
from estimator_dist.programs.results import clear, decode_metrics, encode_metrics, placed
from estimator_dist.report.console import LOG_DIR
from estimator_dist.tf_runtime.estimators import local_copy
from estimator_dist.tf_runtime.intercept import estimators_being_built

if TYPE_CHECKING:
    from estimator_dist.programs.config import ScriptConfig
    from estimator_dist.task.run import TaskRun


class Program(Protocol):
    """What a loop needs of its program's task (`estimator_dist.programs.task.ScriptTask`)."""

    config: ScriptConfig
    run: TaskRun

    @property
    def attempt(self) -> Optional[str]: ...

    def model_dir_of(self, estimator: Any) -> str: ...

    def join(self, model_dir: str) -> None: ...

    def where_in_program(self) -> str: ...

    def leave(self) -> None: ...

    def train_segment(
        self, estimator: Any, train_spec: Any, eval_spec: Any, batches: Optional[int]
    ) -> Optional[int]: ...

    def wait_for_evaluation(self) -> None: ...


#: Directory of `model_dir` where the chief leaves each call's result for the other tasks.
LOOP_DIR = files.EXCHANGE_DIR
#: Seconds between two looks for the chief's result.
_POLL_SECS = 0.2

#: `train()` until the input ends, over an input that never ends.
NO_STEPS = (
    "{where}estimator.train() is called without steps or max_steps, and the training input "
    "of task {role} never ends (or could not be counted in time): on a cluster every worker "
    "must know the step it stops at. Pass steps=N (or max_steps=N) to train(), or make the "
    "input end (dataset.repeat(EPOCHS), numpy_input_fn(num_epochs=EPOCHS))."
)

#: `train()` until the input ends, with parameter servers.
NO_STEPS_PS = (
    "{where}estimator.train() without steps or max_steps: with parameter servers each worker "
    "steps alone and no task knows the last step. Pass steps=N to train()."
)
#: What the evaluator says when it leaves a train()/evaluate() program.
EVALUATOR_LEAVES = (
    "estimator_dist: the program calls estimator.{method}() outside train_and_evaluate: on a "
    "cluster the chief and the workers run it, and the chief shares each evaluate() result "
    "with them, so the evaluator task has no part in it and ends here (exit 0)."
)


class LoopTask:
    """What `Estimator.train`/`evaluate`/`export_saved_model` do on one task of a cluster.

    Args:
      program: The program's task, which runs each training segment and
        holds the attempt id of the rendezvous.
      cluster: This task's normalised cluster configuration.
      guards: The task's bounds: a waiting task lets the chief's port stay
        silent for the stall timeout, and waits for a result at most the
        start-up timeout before the first segment.
    """

    def __init__(self, program: Program, cluster: ClusterConfig, guards: GuardConfig) -> None:
        self._program = program
        self._cluster = cluster
        self._guards = guards
        self._calls = {"train": 0, "evaluate": 0, "export": 0, "rmtree": 0}
        # The global step the current estimator's last segment ended at; None before the
        # first call.
        self._step: Optional[int] = None
        # The program's directory (its first estimator's): the calls' results, the job's
        # metrics. Each estimator of its own directory has its own step (`_steps`).
        self._model_dir: Optional[str] = None
        self._current: Optional[str] = None
        self._steps: Dict[str, int] = {}
        self.evaluated = False
        # Whether this task's TensorFlow server runs (from the first training segment on).
        self._serving = False

    def _enter(self, estimator: Any, method: str) -> str:
        """Joins the cluster at the program's first call; returns the results directory.

        The start step is read after the rendezvous, which follows any clearing by the chief.
        """
        if self._cluster.task_type == EVALUATOR:
            self._program.leave()
            print(EVALUATOR_LEAVES.format(method=method), flush=True)
            raise SystemExit(0)
        model_dir = self._program.model_dir_of(estimator)
        if self._model_dir is None:
            self._model_dir = model_dir
        self._program.join(self._model_dir)
        if self._current is not None and self._step is not None:
            self._steps[self._current] = self._step
        if self._step is None or model_dir != self._current:
            self._step = self._steps.get(model_dir)
            if self._step is None:
                self._step = files.checkpoint_step(model_dir)
        self._current = model_dir
        return self._results_dir()

    def _results_dir(self) -> str:
        tf.io.gfile.makedirs(os.path.join(self._model_dir, LOOP_DIR, str(self._program.attempt)))
        return os.path.join(self._model_dir, LOOP_DIR, str(self._program.attempt))

    def train(
        self,
        original: Callable,
        estimator: Any,
        input_fn: Callable,
        hooks: Any = None,
        steps: Optional[int] = None,
        max_steps: Optional[int] = None,
        saving_listeners: Any = None,
    ) -> Any:
        """One synchronised training segment on every training task.

        It ends where Estimator's `train()` would: at `max_steps`, after `steps`
        more steps, or where the input ends, on the task whose input ends first:
        after that input's batches, counted in steps of each task's own loop, so
        a train_op that never steps the global step ends there too.

        Args:
          original: `Estimator.train`, which refuses a cluster: called on a local copy
            only for an estimator's own helper, trained inside its constructor.
          estimator: The program's estimator.
          input_fn, hooks, steps, max_steps, saving_listeners: As `Estimator.train` takes them.

        Returns:
          `estimator`, as `Estimator.train` does. Estimator's own argument errors
          raise ValueError with its messages.
        """
        building = estimators_being_built()
        if building:
            # An estimator's constructor trains a helper estimator of its own (TensorFlow
            # Lattice's crystals prefitting, on the chief alone): as one process would, here.
            logging.info(
                "estimator_dist: train() inside the constructor of %s runs on this task alone, "
                "outside the cluster, as in one process.",
                type(building[0]).__name__,
            )
            original(local_copy(estimator), input_fn, hooks, steps, max_steps, saving_listeners)
            return estimator
        self._enter(estimator, "train")
        # Estimator's own checks, with its messages.
        if steps is not None and max_steps is not None:
            raise ValueError("Can not provide both steps and max_steps.")
        if steps is not None and steps <= 0:
            raise ValueError(f"Must specify steps > 0, given: {steps}")
        if max_steps is not None and max_steps <= 0:
            raise ValueError(f"Must specify max_steps > 0, given: {max_steps}")
        self._calls["train"] += 1
        wanted = max_steps
        if steps is not None:
            wanted = self._step + steps
        if wanted is not None and wanted <= self._step:
            logging.info(
                "estimator_dist: skipping training: max_steps=%d, the model is at step %d.",
                wanted,
                self._step,
            )
            return estimator
        if self._cluster.num_ps and wanted is None:  # Each worker steps alone: nothing to agree.
            raise UsageError(NO_STEPS_PS.format(where=self._program.where_in_program()))
        fewest = None if self._cluster.num_ps else self._agreed_batches(estimator, input_fn, wanted)
        target = wanted if fewest is None else self._step + fewest
        if wanted is not None:
            target = min(target, wanted)
        logging.info(
            "estimator_dist: training segment from global step %d to %d on every task.",
            self._step,
            target,
        )
        train_spec = tf.estimator.TrainSpec(
            input_fn, max_steps=target, hooks=hooks or (), saving_listeners=saving_listeners or ()
        )
        # No evaluation runs on a training task of a cluster: the spec is never read.
        eval_spec = tf.estimator.EvalSpec(input_fn, steps=1, start_delay_secs=0, throttle_secs=0)
        del original  # Estimator.train refuses a cluster: TensorFlow's train_and_evaluate runs.
        stopped_at = self._program.train_segment(estimator, train_spec, eval_spec, fewest)
        self._serving = True
        self._step = target if stopped_at is None else stopped_at
        return estimator

    def _agreed_batches(
        self, estimator: Any, input_fn: Callable, wanted: Optional[int]
    ) -> Optional[int]:
        """The fewest batches any training task's input yields, or None if none ends.

        Raises:
          UsageError: `train()` until the input ends, over an input that never ends.
        """
        counts = self._program.run.exchange_counts(estimator, input_fn, wanted)
        finite = {other: c["batches"] for other, c in counts.items() if c["batches"] is not None}
        if not finite:
            if wanted is None:
                raise UsageError(
                    NO_STEPS.format(where=self._program.where_in_program(), role=sorted(counts)[0])
                )
            return None
        fewest = min(finite.values())
        logging.info(
            "estimator_dist: the training inputs yield %s step(s) from step %d; the fewest, %d, "
            "bound this segment.",
            ", ".join(f"{other} {batches}" for other, batches in sorted(finite.items())),
            self._step,
            fewest,
        )
        return fewest

    def evaluate(
        self,
        original: Callable,
        estimator: Any,
        input_fn: Callable,
        steps: Optional[int] = None,
        hooks: Any = None,
        checkpoint_path: Optional[str] = None,
        name: Optional[str] = None,
    ) -> Dict[str, Any]:
        """The chief evaluates; every task returns the chief's result.

        Args:
          original: `Estimator.evaluate`, called by the chief on a local copy.
          estimator: The program's estimator.
          input_fn, steps, hooks, checkpoint_path, name: As `Estimator.evaluate` takes them.

        Returns:
          The evaluation's dict, the same keys, values and numpy types on every task.
        """
        results = self._enter(estimator, "evaluate")
        self._calls["evaluate"] += 1
        path = os.path.join(results, f"evaluate-{self._calls['evaluate']}.json")
        if self._cluster.task_type == CHIEF:
            local = local_copy(estimator)
            checkpoint = checkpoint_path or tf.train.latest_checkpoint(self._current)
            metrics = original(local, input_fn, steps, hooks, checkpoint, name)
            encoded = encode_metrics(metrics)
            files.write_json(path, {"metrics": encoded, "checkpoint": checkpoint})
            files.write_json(
                os.path.join(self._model_dir, files.METRICS_FILE),
                {
                    "metrics": files.json_numbers(metrics),
                    "checkpoint": checkpoint,
                    "final": False,
                },
            )
            self.evaluated = True
            return decode_metrics(encoded)
        return decode_metrics(self._wait_for(path, "evaluation")["metrics"])

    def predict(self, original: Callable, estimator: Any, *args: Any, **kwargs: Any) -> Any:
        """Every task predicts on its own, outside the cluster, as one process would.

        Estimator's predict session connects to the task's own server, which
        runs only once the task trained: before that it would wait forever. A
        prediction changes nothing, so each task computes the program's own.

        Args:
          original: `Estimator.predict`, called on a local copy.
          estimator: The program's estimator.
          *args, **kwargs: As `Estimator.predict` takes them.

        Returns:
          What `Estimator.predict` returns: a generator of predictions.
        """
        return original(local_copy(estimator), *args, **kwargs)

    def export(self, original: Callable, estimator: Any, *args: Any, **kwargs: Any) -> Any:
        """The chief exports; every task returns the path of the chief's export.

        Args:
          original: `Estimator.export_saved_model`, called by the chief.
          estimator: The program's estimator.
          *args, **kwargs: As `Estimator.export_saved_model` takes them.

        Returns:
          The export's directory, as bytes, as Estimator returns it.
        """
        results = self._enter(estimator, "export_saved_model")
        self._calls["export"] += 1
        path = os.path.join(results, f"export-{self._calls['export']}.json")
        if self._cluster.task_type == CHIEF:
            exported = original(estimator, *args, **kwargs)
            shown = exported.decode() if isinstance(exported, bytes) else str(exported)
            files.write_json(path, {"path": shown})
            return exported
        shown = self._wait_for(path, "export")["path"]
        return shown.encode()

    def _wait_for(
        self,
        path: str,
        what: str,
        peer: Optional[Tuple[str, str]] = None,
        deadline: Optional[float] = None,
    ) -> dict:
        """Reads the result at `path` once written; fails if its writer is gone or too late.

        Args:
          path: The file the writer leaves.
          what: What the file holds, for the message.
          peer: The writer's (role, address); the chief by default. Once the
            tasks' servers run (after the first training segment), a writer
            whose port stays silent for the stall timeout is gone (exit 150).
          deadline: `time.monotonic()` by which the file must exist (exit 151
            after it); by default the start-up timeout while no server runs.

        Returns:
          The file's JSON object.
        """
        from estimator_dist.guards.watchdog import unreachable

        role, address = peer or (f"{CHIEF}-0", self._cluster.jobs[CHIEF][0])
        if deadline is None and not self._serving:
            deadline = time.monotonic() + self._guards.startup_timeout
        silent_since: Optional[float] = None
        last_probe = time.monotonic()
        while True:
            found = files.read_json(path)
            if found is not None:
                return found
            now = time.monotonic()
            if deadline is not None and now > deadline:
                raise ClusterTimeoutError(
                    f"task {self._cluster.role} waited for {role}'s {what} ({path}) until the "
                    f"--startup_timeout of {self._guards.startup_timeout:g} s ran out: "
                    f"{role} is stuck or gone. The job restarts from the latest checkpoint."
                )
            if deadline is None and now - last_probe >= 1.0:
                last_probe = now
                if not unreachable({role: address}):
                    silent_since = None
                elif silent_since is None:
                    silent_since = now
                elif now - silent_since > self._guards.stall_timeout:
                    raise PeerFailureError(
                        f"task {self._cluster.role} waited for {role}'s {what} ({path}), and "
                        f"{role} ({address}) has not answered for "
                        f"{self._guards.stall_timeout:g} s: it is gone. The job restarts from the "
                        "latest checkpoint."
                    )
            time.sleep(_POLL_SECS)

    def rmtree(self, original: Callable, path: Any, *args: Any, **kwargs: Any) -> Any:
        """`shutil.rmtree` (or TensorFlow's) of model_dir, a directory above or one below it.

        Every task would delete what the others write, the launcher's logs too:
        the chief alone deletes, keeping `logs/` and `loop/`; once met, the tasks
        wait for each other around it, so each starts its next training alike.
        """
        model_dir = self._program.config.model_dir
        target = os.path.abspath(os.fspath(path)) if "://" not in str(path) else str(path)
        where = None if model_dir is None else placed(target, model_dir)
        if where is None:
            return original(path, *args, **kwargs)
        if where == "below":
            # Below model_dir (an export directory): the chief's alone, or a task would
            # delete what the chief has just written there.
            if self._cluster.is_chief:
                return original(path, *args, **kwargs)
            logging.info("estimator_dist: %s is deleted by the chief, not here.", target)
            return None
        if self._cluster.is_chief:
            # The evaluator may still be evaluating the model of the program's last
            # train_and_evaluate call, from the checkpoints this clears.
            self._program.wait_for_evaluation()
        if self._step is None:  # Not met yet: the rendezvous comes after the chief's clearing.
            if self._cluster.is_chief:
                clear(target, model_dir, keep=(LOG_DIR, LOOP_DIR))
            else:
                logging.info("estimator_dist: %s is cleared by the chief, not here.", target)
            return None
        # Every task arrives before the chief clears (another may still read a checkpoint,
        # predicting), and waits until it is done.
        self._calls["rmtree"] += 1
        results, call = self._results_dir(), self._calls["rmtree"]
        done = os.path.join(results, f"rmtree-{call}.json")
        if self._cluster.task_type == CHIEF:
            workers = enumerate(self._cluster.jobs.get(WORKER, []))
            for role, address in ((f"{WORKER}-{i}", address) for i, address in workers):
                arrived = os.path.join(results, f"rmtree-{call}-{role}.json")
                self._wait_for(arrived, "arrival at the same rmtree()", (role, address))
            clear(target, model_dir, keep=(LOG_DIR, LOOP_DIR))
            files.write_json(done, {"cleared": target})
        else:
            arrived = os.path.join(results, f"rmtree-{call}-{self._cluster.role}.json")
            files.write_json(arrived, {"role": self._cluster.role})
            self._wait_for(done, "clearing of the model_dir")
        self._steps.clear()  # Whichever estimator's directory it cleared.
        self._step = files.checkpoint_step(self._current)
        return None

    def finish(self) -> None:
        """Marks the chief's last evaluation as the job's final one."""
        if self._cluster.task_type != CHIEF or not self.evaluated:
            return
        metrics = files.mark_final_metrics(self._model_dir)
        if metrics is None:  # The program cleared model_dir after its last evaluation.
            return
        print(f"estimator_dist: final evaluation: {files.format_metrics(metrics)}", flush=True)
