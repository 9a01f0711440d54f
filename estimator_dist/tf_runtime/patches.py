"""Every workaround for a TensorFlow internal, in one place.

`install()` applies them all; the driver and the script runner call it once
per process, before any strategy or Estimator is built. Calling it again does
nothing, and `uninstall()` restores TensorFlow as it was (tests use it for
their controls). Nothing else in the package patches TensorFlow, and no
getter installs anything as a side effect. Each patch below says what it
works around and which test shows it. Each internal exists, with the same
signature, in TensorFlow 2.15.1 and 2.21.0 (the package's two stacks), and the
tests named below pass on both.

1. **Sparse gradients all-reduced as dense tensors**
   (`CollectiveAllReduceExtended._batch_reduce_to`, for strategies opted in
   with `set_gradient_transport`). Embedding, hashed, crossed and vocabulary
   columns, and `tf.gather` in a model_fn, give sparse gradients
   (`IndexedSlices`) with one row per id a worker looked up.
   MultiWorkerMirroredStrategy all-reduces them in graph mode by gathering
   every worker's rows, which fails as soon as the row count differs ("Shape
   mismatch in the collective instance"). Each sparse value is made dense, of
   its variable's full shape, on its own device, before the all-reduce: the
   same sum, at the cost of sending the whole table every step (a 1,000,000 x
   4 float32 table adds 16 MB; huge embeddings belong on `parameter_server`).
   Optimizers, v1 and Keras legacy (the V2 canned estimators), all go through
   `batch_reduce_to`; `_reduce_to` only ever carries the logged loss.
   Shown by `tests/estimator_dist/tf_runtime/patches_sparse_test.py` (two real workers, a v1 and a
   V2 `DNNLinearCombinedClassifier` and an embedding_lookup model_fn).

2. **Gradients on the wire in bfloat16 or float16** (same method, when
   `set_gradient_transport(strategy, "bfloat16")` chose it). float32
   gradients, sparse ones made dense included, are rounded to the wire dtype
   for the all-reduce, summed in it, and converted back to float32 before the
   optimizer applies them: 8 (bfloat16) or 11 (float16) significant bits per
   value, half the bytes. float16 flushes values below about 6e-8 to 0 and
   overflows above 65504 (no loss scaling). Shown by
   `tests/estimator_dist/tf_runtime/patches_wire_test.py`.

3. **Input iterators that close at once**
   (`multi_device_iterator_ops._create_device_dataset`). An autotuned
   `tf.data` iterator runs a model thread that, when the iterator is
   destroyed, can miss the cancellation and sleep out its period of up to
   60 s: a job sat idle 38-94 s after its final checkpoint. The per-replica
   datasets distributed input builds only forward elements, so they are
   built without autotuning (the user's own datasets get the same through
   `estimator_dist.task.user_code`). Shown by `tests/estimator_dist/tf_runtime/patches_test.py`.

4. **The model_fn runs as written under a strategy**
   (`Estimator._call_model_fn`, marked as AutoGraph output). Under a
   strategy, `call_for_each_replica` passes the model_fn through AutoGraph,
   which rewrites it and everything it calls: 3 to 6 s of each task's
   start-up on 2 cores, and Python control flow on tensors gets a meaning it
   never has in one process. Marked, it runs as Estimator runs it without a
   strategy (Keras layers still convert their own `call`). Shown by
   `tests/estimator_dist/tf_runtime/patches_autograph_test.py`.

5. **A MultiWorkerMirroredStrategy set up as Estimator needs it**
   (`CollectiveAllReduceExtended._initialize_strategy`). The evaluator is
   outside the cluster, so building the strategy there raises
   `KeyError: 'evaluator'`; a script that builds its own strategy on every
   task gets a local one there, as with no TF_CONFIG (it trains nothing).
   And a program that runs eagerly (TensorFlow 2's default, which a task
   keeps) would set the strategy up for eager training: its own server, a
   coordination service and a health-check thread, after which Estimator's
   distribute coordinator cannot deep-copy it ("cannot be deep copied in
   eager mode") and starts a second server on the same port. It is set up
   in a graph instead, as in a program that disabled eager execution, and
   so are its copies (`CollectiveAllReduce.__deepcopy__`) and its
   configuration for the task's server (`_configure`): Estimator trains in
   graphs of its own. Shown by
   `tests/estimator_dist/script_test.py` and the differential program
   `eager_peek.py`.

6. **No silent session recovery once training runs**
   (`monitored_session._PREEMPTION_ERRORS`). MonitoredSession re-creates its
   session after an AbortedError or UnavailableError, which on one task of
   a collective job restores an old checkpoint there alone and hangs or
   diverges. Before the first step that recovery is wanted (a peer may start
   late), so `install()` only prepares it and the watchdog calls
   `stop_session_recovery()` at the first step. Shown by
   `tests/estimator_dist/guards/watchdog_test.py` and the fault tests.

7. **No extra session call per step for checkpoints**
   (`CheckpointSaverHook.__init__`). The hook assumes 1,000,000 steps per
   session call (a TPU loop), so with any checkpoint interval up to that
   (Estimator's default is 100 steps) it re-reads the global step in a
   session call of its own after every step: two calls per training step
   instead of one. Training runs one step per call here, so the hook is told
   so, and reads the step again only when a save may be due; it saves at the
   same steps. Shown by `tests/estimator_dist/tf_runtime/patches_test.py`.

8. **The evaluator's sleeps can end early** (`training.time`, the `time`
   module as `tensorflow_estimator`'s training.py sees it). TensorFlow's
   evaluator sleeps `EvalSpec.start_delay_secs` (120 s by default) before its
   first evaluation and up to `throttle_secs` (600 s) after each one, even
   when training has ended: a short job sat idle for minutes before, or
   after, its final evaluation. Every `time.sleep` of that module goes
   through `set_training_sleep`'s function when one is set (the evaluator's
   watchdog sets one that ends once a checkpoint at or past the last step
   exists); `time.time` and everything else are the `time` module's. Shown by
   `tests/estimator_dist/task/last_step_test.py`.

9. **Fresh collective instance keys for every graph of a process**
   (`CollectiveKeys._instance_key_table`, by `fresh_collective_keys`).
   Estimator's distribute coordinator deep-copies the strategy for each
   `train_and_evaluate` call, so every call's graph numbers its collectives
   from the same start, while the task's server remembers the shape of each
   (group, instance) it has run. A program that trains a second model in the
   same process (a `train()` loop over two estimators) then all-reduced
   against the first model's shapes ("Shape mismatch in the collective
   instance"). Each call's graph gets a range of its own, the same on every
   task since every task makes the same calls. Shown by
   `tests/estimator_dist/programs/loop_test.py` (two models in one program).

10. **No second save of the checkpoint a session restored**
   (`CheckpointSaverHook.after_create_session`). On session creation the
   chief's hook saves the step the session starts at; after a restart that is
   the step it has just restored, saved again under the same name. Writing a
   checkpoint's `.index` truncates the file first, so a worker (every
   MultiWorkerMirroredStrategy worker restores the files itself) or the
   evaluator reading it at that moment fails: `DataLossError: file is too
   short to be an sstable`, 1 restart in 11 under load. When the latest
   checkpoint already holds the session's step, that save is skipped (the
   graph and meta graph are still written); a fresh start saves its step 0 as
   before. Every later save is of a new step, which no task restores. Shown by
   `tests/estimator_dist/guards/checkpoints_test.py`.

11. **A hook's request to stop, seen before it stops training**
   (`SessionRunContext.request_stop`). A program's hook may end training
   (`StopAtStepHook`, a custom hook calling `run_context.request_stop()`).
   In one process that is the end; on a cluster a task that stops alone
   leaves the others waiting in their collectives, and the package must know
   the stop was asked for, not an input that ran out. While a handler is set
   (`route_stop_requests`), each request calls it with the hook that asked
   (the object whose method called `request_stop`) and the run context; the
   session stops only when the handler says so. Shown by
   `tests/estimator_dist/tf_runtime/patches_test.py` and the differential
   programs `stop_hook_finite.py` and `hooks_tf1.py`.

Example:
  >>> install()
  >>> installed()
  True
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import tensorflow as tf
from absl import logging
from tensorflow.python.autograph.impl.api import autograph_artifact
from tensorflow.python.data.ops import multi_device_iterator_ops
from tensorflow.python.distribute import (
    collective_all_reduce_strategy,
    cross_device_ops,
    cross_device_utils,
)
from tensorflow.python.distribute import values as value_lib
from tensorflow.python.training import monitored_session, session_run_hook
from tensorflow_estimator.python.estimator import estimator as estimator_lib
from tensorflow_estimator.python.estimator import training as training_lib

_EXTENDED = collective_all_reduce_strategy.CollectiveAllReduceExtended
_SAVER_HOOK = tf.compat.v1.train.CheckpointSaverHook
_KEYS = cross_device_utils.CollectiveKeys
# The original of each replaced attribute, by (owner, name), while installed.
_ORIGINALS: Dict[Tuple[Any, str], Any] = {}
# On a strategy's `extended` object; deep-copied with it, as Estimator's
# distribute coordinator copies and reconfigures the strategy on every task.
_TRANSPORT = "_estimator_dist_gradient_transport"

WIRE_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class GradientTransport:
    """How an opted-in strategy sends gradients: always dense, in `wire_dtype`."""

    wire_dtype: str = "float32"


def install() -> None:
    """Applies every workaround; does nothing when they are installed."""
    if installed():
        return
    _replace(_EXTENDED, "_batch_reduce_to", _batch_reduce_to)
    _replace(_EXTENDED, "_initialize_strategy", _initialize_strategy)
    _replace(_EXTENDED, "_configure", _configure)
    _replace(cross_device_ops.CollectiveAllReduce, "__deepcopy__", _collective_deepcopy)
    _replace(_EXTENDED, "_initialize_multi_worker", _initialize_multi_worker)
    _replace(_KEYS, "_get_new_group_key", _get_new_group_key)
    _replace(multi_device_iterator_ops, "_create_device_dataset", _create_device_dataset)
    _replace(estimator_lib.Estimator, "_call_model_fn", _call_model_fn)
    _replace(_SAVER_HOOK, "__init__", _saver_hook_init)
    _replace(_SAVER_HOOK, "after_create_session", _saver_hook_after_create_session)
    _replace(training_lib, "time", _TrainingTime())
    _replace(session_run_hook.SessionRunContext, "request_stop", _request_stop)
    # Unchanged until `stop_session_recovery()`; recorded so that uninstall restores it.
    _replace(monitored_session, "_PREEMPTION_ERRORS", monitored_session._PREEMPTION_ERRORS)


def uninstall() -> None:
    """Restores what `install()` replaced; does nothing when nothing is installed."""
    for (owner, name), original in reversed(list(_ORIGINALS.items())):
        setattr(owner, name, original)
    _ORIGINALS.clear()


def installed() -> bool:
    """Whether `install()` is in effect."""
    return bool(_ORIGINALS)


def _replace(owner: Any, name: str, value: Any) -> None:
    _ORIGINALS[(owner, name)] = getattr(owner, name)
    setattr(owner, name, value)


def _original(owner: Any, name: str) -> Any:
    return _ORIGINALS[(owner, name)]


def set_gradient_transport(strategy: tf.distribute.Strategy, wire_dtype: str = "float32") -> None:
    """Makes `strategy` all-reduce sparse gradients dense and float32 ones in `wire_dtype`.

    Other strategies, a user's own included, keep TensorFlow's behaviour.

    Args:
      strategy: A MultiWorkerMirroredStrategy, changed in place.
      wire_dtype: `float32` (no cast), `bfloat16` or `float16`.

    Raises:
      TypeError: if `strategy` is not a MultiWorkerMirroredStrategy.
      ValueError: for another dtype.
      RuntimeError: if `install()` has not run.
    """
    if not isinstance(strategy.extended, _EXTENDED):
        raise TypeError(
            "gradients are made dense and cast for MultiWorkerMirroredStrategy only, received "
            f"{type(strategy).__name__}; other strategies all-reduce IndexedSlices themselves."
        )
    if wire_dtype not in WIRE_DTYPES:
        raise ValueError(
            f"gradients cross the wire as {', '.join(WIRE_DTYPES)}, not {wire_dtype!r}."
        )
    if not installed():
        raise RuntimeError(
            "estimator_dist.tf_runtime.patches.install() must run before a strategy is given a "
            "gradient transport (the driver and the script runner call it at start-up)."
        )
    setattr(strategy.extended, _TRANSPORT, GradientTransport(wire_dtype))


def set_training_sleep(sleep: Optional[Callable[[float], None]]) -> None:
    """Makes the sleeps of TensorFlow's evaluator loop call `sleep` (patch 8); None: time.sleep."""
    _TrainingTime.sleepers[:] = [sleep] if sleep is not None else []


#: Collective instance keys each graph of a process may use (patch 9).
KEYS_PER_GRAPH = 100_000


# On a strategy's `extended` object (deep-copied with it): which graph of the process it builds.
_GRAPH_INDEX = "_estimator_dist_graph_index"
# On a `CollectiveKeys` object: where the instance keys of its groups start.
_INSTANCE_START = "_estimator_dist_instance_start"


def fresh_collective_keys(strategy: tf.distribute.Strategy, graph_index: int) -> None:
    """Numbers the collectives of a process's `graph_index`-th graph in a range of their own."""
    setattr(strategy.extended, _GRAPH_INDEX, graph_index)
    _number_keys(strategy.extended)


def _number_keys(extended: Any) -> None:
    keys = getattr(extended, "_collective_keys", None)
    index = getattr(extended, _GRAPH_INDEX, 0)
    if keys is None or not index:
        return
    start = cross_device_utils.INSTANCE_KEY_START_NUMBER + index * KEYS_PER_GRAPH
    setattr(keys, _INSTANCE_START, start)
    with keys._lock:
        for group in keys._instance_key_table.values():
            for device in group:
                group[device] = max(group[device], start)


def stop_session_recovery() -> None:
    """Makes MonitoredSession raise the errors it would silently recover from (patch 6)."""
    if installed():
        monitored_session._PREEMPTION_ERRORS = ()


# --- 1 and 2: the gradient all-reduce ------------------------------------------------


def _batch_reduce_to(
    extended: Any, reduce_op: Any, value_destination_pairs: Sequence[Tuple[Any, Any]], options: Any
) -> List[Any]:
    original = _original(_EXTENDED, "_batch_reduce_to")
    transport = getattr(extended, _TRANSPORT, None)
    if transport is None:
        return original(extended, reduce_op, value_destination_pairs, options)
    pairs = [(_densify(value, dest), dest) for value, dest in value_destination_pairs]
    if transport.wire_dtype == "float32":
        return original(extended, reduce_op, pairs, options)
    wire = tf.as_dtype(transport.wire_dtype)
    narrowed = [_is_float32(value) for value, _ in pairs]
    pairs = [
        (_cast(value, tf.float32, wire, value_lib.PerReplica) if narrow else value, dest)
        for narrow, (value, dest) in zip(narrowed, pairs)
    ]
    reduced = original(extended, reduce_op, pairs, options)
    return [
        _cast(result, wire, tf.float32, value_lib.Mirrored) if narrow else result
        for narrow, result in zip(narrowed, reduced)
    ]


def _densify(value: Any, destination: Any) -> Any:
    """`value` with each IndexedSlices component made dense on its own device."""
    if isinstance(value, value_lib.DistributedValues):
        parts = tuple(_densify(part, destination) for part in value.values)
        if all(new is old for new, old in zip(parts, value.values)):
            return value
        return value_lib.PerReplica(parts)
    if not isinstance(value, tf.IndexedSlices):
        return value
    # On the value's own device: the strategy batches all gradients into one
    # all-reduce only when values and destinations share devices, and every
    # task must batch alike, or their collectives' keys diverge.
    with tf.device(value.device):
        dense = tf.convert_to_tensor(value)
    # The row count comes from a tensor; the variable's static shape lets the
    # strategy pack this gradient with the others (`bytes_per_pack`).
    if isinstance(destination, tf.Variable) and destination.shape.is_compatible_with(dense.shape):
        dense.set_shape(destination.shape)
    return dense


def _cast(value: Any, source: tf.DType, target: tf.DType, wrap: type) -> Any:
    """Casts the `source` tensors of a (distributed) value to `target`, on their devices."""
    if isinstance(value, value_lib.DistributedValues):
        return wrap(tuple(_cast(part, source, target, wrap) for part in value.values))
    if isinstance(value, tf.Tensor) and value.dtype == source:
        with tf.device(value.device):
            return tf.cast(value, target)
    return value


def _is_float32(value: Any) -> bool:
    parts = value.values if isinstance(value, value_lib.DistributedValues) else (value,)
    return all(isinstance(part, tf.Tensor) and part.dtype == tf.float32 for part in parts)


# --- 3: per-replica datasets without autotuning ---------------------------------------


def _create_device_dataset(*args: Any, **kwargs: Any) -> Any:
    options = tf.data.Options()
    options.autotune.enabled = False
    create = _original(multi_device_iterator_ops, "_create_device_dataset")
    return create(*args, **kwargs).with_options(options)


# --- 4: the model_fn as written -----------------------------------------------------


@autograph_artifact
def _call_model_fn(estimator: Any, *args: Any, **kwargs: Any) -> Any:
    return _original(estimator_lib.Estimator, "_call_model_fn")(estimator, *args, **kwargs)


# --- 5: a local strategy on the evaluator --------------------------------------------


def _initialize_strategy(extended: Any, cluster_resolver: Any, devices: Any) -> None:
    if cluster_resolver.task_type == "evaluator" and not devices:
        initialize = functools.partial(extended._initialize_local, cluster_resolver, devices=None)
    else:
        original = _original(_EXTENDED, "_initialize_strategy")
        initialize = functools.partial(original, extended, cluster_resolver, devices)
    if not tf.executing_eagerly():
        initialize()
        return
    # A program running eagerly: Estimator builds graphs of its own and its distribute
    # coordinator starts the task's server, so the strategy is set up as in graph mode.
    with tf.Graph().as_default():
        initialize()


def _configure(extended: Any, *args: Any, **kwargs: Any) -> Any:
    # The distribute coordinator configures the strategy for the task's server: as it was
    # set up, in a graph.
    original = _original(_EXTENDED, "_configure")
    if not tf.executing_eagerly():
        return original(extended, *args, **kwargs)
    with tf.Graph().as_default():
        return original(extended, *args, **kwargs)


def _collective_deepcopy(collective: Any, memo: dict) -> Any:
    # Copying builds the all-reduce's launchers again, which in eager mode would place
    # their ordering tokens on devices of a server that only Estimator starts.
    original = _original(cross_device_ops.CollectiveAllReduce, "__deepcopy__")
    if not tf.executing_eagerly():
        return original(collective, memo)
    with tf.Graph().as_default():
        return original(collective, memo)


# --- 7: checkpoints without a session call per step ----------------------------------


def _saver_hook_init(hook: Any, *args: Any, **kwargs: Any) -> None:
    _original(_SAVER_HOOK, "__init__")(hook, *args, **kwargs)
    hook._set_steps_per_run(1)


# --- 10: no second save of the checkpoint a session restored --------------------------


def _saver_hook_after_create_session(hook: Any, session: Any, coord: Any) -> None:
    step = int(session.run(hook._global_step_tensor))
    latest = tf.train.latest_checkpoint(hook._checkpoint_dir)
    saved = latest is not None and os.path.basename(latest) == (
        f"{os.path.basename(hook._save_path)}-{step}"
    )
    if saved:
        # The instance attribute hides the method for this one call.
        hook._save = lambda session, step: False
        logging.info("Checkpoint %s holds global step %d already; not saved again.", latest, step)
    try:
        _original(_SAVER_HOOK, "after_create_session")(hook, session, coord)
    finally:
        if saved:
            del hook._save


# --- 9: fresh collective instance keys for every graph --------------------------------


def _initialize_multi_worker(extended: Any, cluster_resolver: Any) -> None:
    _original(_EXTENDED, "_initialize_multi_worker")(extended, cluster_resolver)
    _number_keys(extended)


def _get_new_group_key(keys: Any, devices: Any) -> int:
    group_key = _original(_KEYS, "_get_new_group_key")(keys, devices)
    start = getattr(keys, _INSTANCE_START, None)
    if start is not None:
        for device in devices:
            keys._instance_key_table[group_key][device] = start
    return group_key


# --- 8: the evaluator's sleeps -------------------------------------------------------


class _TrainingTime:
    """The `time` module for training.py, whose `sleep` calls the one set, if any."""

    sleepers: List[Callable[[float], None]] = []

    def sleep(self, seconds: float) -> None:
        (self.sleepers[-1] if self.sleepers else time.sleep)(seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


# --- 11: a hook's request to stop --------------------------------------------------

#: Decides a request to stop: `handler(hook, run_context)` returns whether to stop now.
StopHandler = Callable[[Any, Any], bool]
_STOP_HANDLERS: List[StopHandler] = []


def route_stop_requests(handler: Optional[StopHandler]) -> None:
    """Sends every hook's `run_context.request_stop()` to `handler` (patch 11); None: stop."""
    _STOP_HANDLERS[:] = [handler] if handler is not None else []


def _request_stop(context: Any) -> None:
    original = _original(session_run_hook.SessionRunContext, "request_stop")
    if not _STOP_HANDLERS:
        return original(context)
    # The object whose method asked: a hook's `after_run(self, run_context, ...)`.
    hook = sys._getframe(1).f_locals.get("self")
    if _STOP_HANDLERS[-1](hook, context):
        original(context)
    return None
