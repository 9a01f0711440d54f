"""The step a script's training ends at, when its input decides it: epochs and finite input.

Legacy programs often train "for N epochs": a `TrainSpec` with no
`max_steps` over `numpy_input_fn(num_epochs=N)`, `dataset.repeat(N)` or an
input that does not repeat. One process trains until the input ends. On a
cluster a worker whose input ends first leaves the others waiting in their
collectives forever, and the evaluator waits for a last step nobody names.
So, once, before training, each training task finds how many batches its own
input yields (`count_input`): the dataset's cardinality where TensorFlow
knows it, else by reading the input to its end in a throwaway graph, within
a time bound. The tasks exchange their counts at the rendezvous, and every
one of them computes the same `decide`: the start step plus the fewest
batches any task has (the surplus of a longer shard is not trained), capped
by `max_steps`. The chief writes the decision to `model_dir/last_step.json`,
which the evaluator waits for (`wait_for_decision`); every task then trains
with `TrainSpec(max_steps=<decided>)`.

>>> decide({"chief-0": {"batches": 12, "how": CARDINALITY},
...         "worker-0": {"batches": 11, "how": CARDINALITY}}, 0, None)["last_step"]
11
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from absl import logging

from estimator_dist.base import files
from estimator_dist.base.errors import ClusterTimeoutError, UsageError
from estimator_dist.report import status

#: Written by the chief before training: the last step and how it was found.
DECISION_FILE = files.LAST_STEP_FILE
#: Below an estimator's model_dir: the chief waits for the evaluator to finish with the model
#: there (`estimator_dist.programs.task`), so its decision there is the current one.
CHIEF_WAITS_FILE = os.path.join(files.EXCHANGE_DIR, "evaluated", "chief-waits.json")
#: Beside it: the evaluator's mark for each train_and_evaluate call it is done with.
EVALUATIONS_DIR = os.path.dirname(CHIEF_WAITS_FILE)
#: How the last step was found.
MAX_STEPS, CARDINALITY, COUNTED, INPUT_ENDED = (
    "max_steps",
    "input cardinality",
    "input counted",
    "input ended",
)
#: How the last step was found, as the launcher's status channel names it.
_STOP_HOWS = {
    MAX_STEPS: status.MAX_STEPS,
    CARDINALITY: status.INPUTS_COUNTED,
    COUNTED: status.INPUTS_COUNTED,
    INPUT_ENDED: status.INPUT_ENDED,
}
#: How a count found an input that never ends.
REPEATS = "repeats forever"
#: Seconds a count may take when TrainSpec has max_steps (training goes on to it if not counted).
COUNT_SECS_WITH_MAX_STEPS = 30.0

INFINITE_INPUT = (
    "the script's TrainSpec has no max_steps and the training input of task {role} repeats "
    "forever ({how}), so nothing says where training ends: on a cluster the evaluator would "
    "wait forever. Give TrainSpec(input_fn, max_steps=N), or make the input end "
    "(dataset.repeat(EPOCHS), numpy_input_fn(num_epochs=EPOCHS))."
)
COUNT_TIMEOUT = (
    "the script's TrainSpec has no max_steps, and counting the batches of task {role}'s "
    "training input did not end within {seconds:g} s (half the start-up timeout; it read "
    "{what}). On a cluster every task must know the last step before training. Give "
    "TrainSpec(input_fn, max_steps=N), or raise --startup_timeout."
)
NO_DECISION = (
    "the chief wrote no {file} in {model_dir} within the start-up timeout of {timeout:g} s, "
    "and the script's TrainSpec has no max_steps: the evaluator cannot know the last step. "
    "Start the chief and the workers, or raise --startup_timeout."
)


def _batches_of_dataset(dataset: Any, limit: Optional[int], timeout: float) -> Dict[str, Any]:
    import numpy as np
    import tensorflow as tf

    with tf.compat.v1.Session() as session:
        cardinality = int(session.run(tf.data.experimental.cardinality(dataset)))
        if cardinality == tf.data.experimental.INFINITE_CARDINALITY:
            return {"batches": None, "how": REPEATS}
        if cardinality >= 0:
            return {"batches": cardinality, "how": CARDINALITY}
        if limit is not None:
            dataset = dataset.take(limit)
        count = dataset.reduce(np.int64(0), lambda n, *_: n + 1)
        options = tf.compat.v1.RunOptions(timeout_in_ms=max(1, int(timeout * 1000)))
        try:
            return {"batches": int(session.run(count, options=options)), "how": COUNTED}
        except tf.errors.DeadlineExceededError:
            return {"batches": None, "how": COUNTED, "timed_out": True}


def _batches_of_tensors(tensors: Any, limit: Optional[int], timeout: float) -> Dict[str, Any]:
    """Runs tensors fed by queue runners (numpy_input_fn, pandas_input_fn) until they end."""
    import tensorflow as tf

    deadline = time.monotonic() + timeout
    batches = 0
    creator = tf.compat.v1.train.ChiefSessionCreator()
    with tf.compat.v1.train.MonitoredSession(session_creator=creator) as session:
        while not session.should_stop() and (limit is None or batches < limit):
            if time.monotonic() > deadline:
                return {"batches": None, "how": COUNTED, "timed_out": True, "read": batches}
            try:
                session.run(tensors)
            except tf.errors.OutOfRangeError:
                break
            batches += 1
    return {"batches": batches, "how": COUNTED}


def count_input(
    input_fn: Callable,
    params: Any,
    config: Any,
    input_context: Any,
    limit: Optional[int],
    timeout: float,
) -> Dict[str, Any]:
    """How many batches one task's training input yields, found in a throwaway graph.

    Args:
      input_fn: The input function as Estimator gets it (`user_code.present_input_fn`),
        called as Estimator calls it (`user_code.call_input_fn`).
      params: The estimator's params.
      config: The estimator's RunConfig.
      input_context: The `tf.distribute.InputContext` this task's input gets.
      limit: Stop counting here (the batches `max_steps` needs), or None.
      timeout: Seconds the count may take.

    Returns:
      `{"batches": N or None (never ends, or not counted in time), "how": ...,
      "seconds": ...}`, with `"timed_out": True` when the time ran out.
    """
    import tensorflow as tf

    from estimator_dist.task.user_code import call_input_fn, numpy_input_epochs

    started = time.monotonic()
    with tf.Graph().as_default():
        result = call_input_fn(input_fn, tf.estimator.ModeKeys.TRAIN, params, config, input_context)
        if isinstance(result, tf.data.Dataset):
            count = _batches_of_dataset(result, limit, timeout)
        elif numpy_input_epochs(input_fn) == (True, None):
            count = {"batches": None, "how": f"{REPEATS}: num_epochs=None"}
        else:
            count = _batches_of_tensors(result, limit, timeout)
    count["seconds"] = round(time.monotonic() - started, 3)
    return count


def decide(counts: Mapping[str, Mapping[str, Any]], start: int, max_steps: Optional[int]) -> dict:
    """The last step every training task trains to, from each task's count.

    Args:
      counts: Each training task's `count_input` (or None for an input not
        counted), by role.
      start: The global step training starts from (latest checkpoint's, or 0).
      max_steps: The script's `TrainSpec.max_steps`, or None.

    Returns:
      `{"last_step", "how", "start_step", "max_steps", "counts", "untrained_batches"}`.

    Raises:
      UsageError: no max_steps, and no task's input ends.
    """
    finite = {role: c["batches"] for role, c in counts.items() if c and c["batches"] is not None}
    decision: Dict[str, Any] = {
        "start_step": start,
        "max_steps": max_steps,
        "counts": {role: dict(count) if count else None for role, count in counts.items()},
        "untrained_batches": {},
    }
    if not finite:
        if max_steps is None:
            role, count = sorted(counts.items())[0]
            raise UsageError(INFINITE_INPUT.format(role=role, how=(count or {}).get("how")))
        return {**decision, "last_step": max_steps, "how": MAX_STEPS}
    fewest = min(finite.values())
    if max_steps is not None and max_steps <= start + fewest:
        return {**decision, "last_step": max_steps, "how": MAX_STEPS}
    hows = {counts[role]["how"] for role in finite}
    decision["untrained_batches"] = {
        role: batches - fewest for role, batches in sorted(finite.items()) if batches > fewest
    }
    return {
        **decision,
        "last_step": start + fewest,
        "how": CARDINALITY if hows == {CARDINALITY} else COUNTED,
    }


def check_count(count: Mapping[str, Any], role: str, max_steps: Optional[int]) -> None:
    """Fails this task at once when its input was not counted in time and nothing else ends it."""
    if count.get("timed_out") and max_steps is None:
        read = count.get("read")
        what = f"{read} batches" if read is not None else "part of it"
        raise UsageError(COUNT_TIMEOUT.format(role=role, seconds=count["seconds"], what=what))


def describe(decision: Mapping[str, Any]) -> str:
    """One line for the log: the last step, how it was found, and what is left untrained."""
    counts = ", ".join(
        f"{role} {c['batches'] if c['batches'] is not None else 'unending'} ({c['seconds']:.2f} s)"
        for role, c in sorted(decision["counts"].items())
        if c
    )
    line = f"training ends at global step {decision['last_step']} ({decision['how']}"
    line += f"; batches per task from step {decision['start_step']}: {counts})" if counts else ")"
    for role, surplus in decision["untrained_batches"].items():
        line += f"; {role} leaves its last {surplus} batch(es) untrained (a longer shard)"
    return line


def write_decision(model_dir: str, decision: Mapping[str, Any]) -> None:
    """Writes `decision` to `model_dir/last_step.json` (the chief, before training)."""

    files.write_json(os.path.join(model_dir, DECISION_FILE), decision)


def read_decision(model_dir: str) -> Optional[dict]:
    """The decision in `model_dir`, or None."""

    return files.read_json(os.path.join(model_dir, DECISION_FILE))


def remove_decision(model_dir: str) -> None:
    """Removes an earlier attempt's decision (the chief, before it decides again)."""
    import tensorflow as tf

    path = os.path.join(model_dir, DECISION_FILE)
    if tf.io.gfile.exists(path):
        tf.io.gfile.remove(path)


def wait_for_decision(
    model_dir: str,
    chief_gone: Callable[[], bool],
    timeout: float,
    max_steps: Optional[int],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """The last step the evaluator uses: the chief's decision, waited for.

    A decision whose last step is not past the latest checkpoint may be an
    earlier job's: it is taken once the chief is gone (training over), or
    waits for the evaluator before going on (`CHIEF_WAITS_FILE`).

    Args:
      model_dir: Where the chief writes its decision.
      chief_gone: Whether the chief cannot be reached.
      timeout: Seconds to wait (the start-up timeout).
      max_steps: The script's TrainSpec.max_steps, used when no decision comes.

    Raises:
      ClusterTimeoutError: no decision in time and no max_steps.
    """

    deadline = clock() + timeout
    while clock() < deadline:
        decision = read_decision(model_dir)
        if decision is not None and (
            decision["last_step"] > files.checkpoint_step(model_dir) or chief_gone()
        ):
            return int(decision["last_step"])
        sleep(0.5)
    if max_steps is None:
        raise ClusterTimeoutError(
            NO_DECISION.format(file=DECISION_FILE, model_dir=model_dir, timeout=timeout)
        )
    logging.warning(
        "estimator_dist: no %s from the chief in %g s: the evaluator takes TrainSpec's "
        "max_steps=%d as the last step.",
        DECISION_FILE,
        timeout,
        max_steps,
    )
    return max_steps


def _counts_here(cluster: Any) -> bool:
    """Whether this task counts its input: a training task of a collective cluster."""
    from estimator_dist.cluster.tf_config import CHIEF, WORKER

    return cluster.is_distributed and cluster.task_type in (CHIEF, WORKER) and not cluster.num_ps


def count_for_task(
    cluster: Any,
    estimator: Any,
    input_fn: Callable,
    max_steps: Optional[int],
    startup_timeout: float,
) -> Optional[Dict[str, Any]]:
    """This training task's count of training steps its input yields, with the start step.

    None where nothing is counted: a single process (it trains until its input
    ends, as Estimator does), the evaluator, a cluster with parameter servers.

    Raises:
      UsageError: the count ran past its time bound and TrainSpec has no max_steps.
    """
    import tensorflow as tf

    from estimator_dist.cluster.tf_config import CHIEF
    from estimator_dist.task.user_code import present_input_fn
    from estimator_dist.tf_runtime import estimators

    if not _counts_here(cluster):
        return None
    model_dir = estimator.model_dir
    start = files.checkpoint_step(model_dir)
    if max_steps is not None and start >= max_steps:
        return {
            "batches": None,
            "how": "not counted: training is done",
            "seconds": 0.0,
            "start": start,
            "max_steps": max_steps,
        }
    strategy = estimators.run_config(estimator).train_distribute
    replicas = strategy.num_replicas_in_sync if strategy is not None else cluster.num_workers
    per_worker = max(1, replicas // cluster.num_workers)
    index = cluster.task_index + (1 if CHIEF in cluster.jobs else 0)
    context = tf.distribute.InputContext(
        cluster.num_workers, 0 if cluster.task_type == CHIEF else index, replicas
    )
    limit = None if max_steps is None else (max_steps - start) * per_worker
    timeout = startup_timeout / 2
    if max_steps is not None:
        timeout = min(timeout, COUNT_SECS_WITH_MAX_STEPS)
    try:
        config = estimators.run_config(estimator)
        count = count_input(
            present_input_fn(input_fn), estimator.params, config, context, limit, timeout
        )
    except Exception as error:  # With max_steps, training can go on without the count.
        if max_steps is None:
            raise
        logging.warning("estimator_dist: the training input was not counted (%s).", error)
        count = {"batches": None, "how": f"not counted: {type(error).__name__}", "seconds": 0.0}
    check_count(count, cluster.role, max_steps)
    if count["batches"] is not None:
        count["batches"] //= per_worker  # Each step takes a batch on every local replica.
    logging.info(
        "estimator_dist: task %s's training input yields %s steps from step %d (%s, %.2f s).",
        cluster.role,
        "unending" if count["batches"] is None else count["batches"],
        start,
        count["how"],
        count["seconds"],
    )
    return {**count, "start": start, "max_steps": max_steps}


def decide_for_task(
    cluster: Any,
    model_dir: str,
    counts: Mapping[str, Any],
    max_steps: Optional[int],
    startup_timeout: float,
    attempt: Optional[str] = None,
) -> Tuple[Optional[int], Optional[dict]]:
    """The last step this task trains to, or evaluates at, and the decision if one was made.

    Args:
      cluster: This task's cluster configuration.
      model_dir: The job's model_dir.
      counts: Every training task's `count_for_task` by role, from the rendezvous.
      max_steps: The script's TrainSpec.max_steps.
      startup_timeout: Seconds the evaluator waits for the chief's decision.
      attempt: The rendezvous's attempt id, written with the decision.
    """
    from estimator_dist.cluster.tf_config import CHIEF, EVALUATOR
    from estimator_dist.guards.watchdog import unreachable

    if cluster.is_distributed and cluster.task_type == EVALUATOR:
        chief = {"chief-0": cluster.jobs[CHIEF][0]}
        waits = os.path.join(model_dir, CHIEF_WAITS_FILE)

        def training_over() -> bool:
            return bool(unreachable(chief)) or files.read_json(waits) is not None

        last = wait_for_decision(model_dir, training_over, startup_timeout, max_steps)
        logging.info("estimator_dist: the evaluator's last step is %d.", last)
        return last, None
    if not _counts_here(cluster):
        if not (cluster.is_distributed and cluster.is_chief):
            return max_steps, None
        # With parameter servers, or counts not asked for: the evaluator still waits for it.
        decision = {"last_step": max_steps, "how": MAX_STEPS, "max_steps": max_steps}
        write_decision(model_dir, {**decision, "counts": {}, "attempt": attempt})
        return max_steps, decision
    counted = {role: count for role, count in counts.items() if count is not None}
    chief = counted.get(f"{CHIEF}-0", {})
    start = chief.get("start", 0)
    max_steps = _agreed_max_steps(counted, chief, max_steps)
    decision = {**decide(counted, start, max_steps), "attempt": attempt}
    logging.info("estimator_dist: %s.", describe(decision))
    if cluster.is_chief:
        write_decision(model_dir, decision)
    return decision["last_step"], decision


def _agreed_max_steps(
    counts: Mapping[str, Mapping[str, Any]], chief: Mapping[str, Any], own: Optional[int]
) -> Optional[int]:
    """The chief's `max_steps`, which every task trains to, said once when the tasks' differ.

    A program may compute it from data each task reads (an unseeded split's
    size): in one process the number is the program's, on a cluster one number
    must hold for every task.
    """
    if "max_steps" not in chief:
        return own
    given = {role: count.get("max_steps") for role, count in counts.items()}
    if len(set(given.values())) > 1:
        logging.warning(
            "estimator_dist: the tasks computed different max_steps (%s): every task trains to "
            "the chief's, %s.",
            ", ".join(f"{role} {steps}" for role, steps in sorted(given.items())),
            chief["max_steps"],
        )
    return chief["max_steps"]


def stop_how(how: Optional[str]) -> str:
    """A decision's `how` as `status.StopStep.how`; an early stop's reason is early stopping.

    >>> stop_how(CARDINALITY), stop_how(None)
    ('inputs_counted', 'max_steps')
    """
    if how is None:
        return status.MAX_STEPS
    return _STOP_HOWS.get(how, status.EARLY_STOPPING)


def record_input_end(model_dir: str, step: int, batches: int, cluster: Any) -> int:
    """Says that a training segment ended where the shortest input ended, at global `step`.

    Every training task ran the `batches` of the shortest input; a train_op
    that never steps the global step leaves it below the segment's last step,
    as one process leaves it. Each task tells the launcher the step training
    ended at (`status.StopStep`, which it takes as the last step); the chief
    writes it into the decision.

    Returns:
      `step`.
    """
    logging.info(
        "estimator_dist: every training task ran the %d batches of the shortest training input; "
        "the program's train_op left the global step at %d, as one process would.",
        batches,
        step,
    )
    status.emit(status.StopStep(step=step, how=status.INPUT_ENDED))
    if cluster.is_chief:
        decision = read_decision(model_dir) or {}
        write_decision(model_dir, {**decision, "last_step": step, "how": INPUT_ENDED})
    return step


def finish_alone(
    estimator: Any, exporter: Any, result: Any, model_dir: str, max_steps: Optional[int]
) -> None:
    """A single process's end: its final evaluation, and where training ended.

    One process that trained until its input ran out (no max_steps, or an
    input shorter than it) evaluated its last checkpoint, but Estimator could
    not know that evaluation was the final one: it is exported as final here.
    """
    import tensorflow as tf

    if exporter.final_metrics is None and isinstance(result, tuple) and result[0]:
        latest = tf.train.latest_checkpoint(model_dir)
        exporter.export(estimator, "", latest, result[0], is_the_final_export=True)
    if exporter.final_metrics is None:
        return
    step = int(exporter.final_metrics.get("global_step", files.checkpoint_step(model_dir)))
    how = MAX_STEPS if max_steps is not None and step >= max_steps else INPUT_ENDED
    write_decision(model_dir, {"last_step": step, "how": how, "max_steps": max_steps, "counts": {}})
