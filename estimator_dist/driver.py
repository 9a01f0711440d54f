"""The training driver: one call runs `tf.estimator.train_and_evaluate` on any role.

`train_and_evaluate(job, cluster)` runs the same way on the chief, a worker,
a parameter server, the evaluator, or a single process with no TF_CONFIG.
Because `tf.estimator.train_and_evaluate` returns nothing in multi-worker
mode, the evaluator (or the single process) writes the final metrics to
`model_dir/eval_metrics.json`, and the chief writes what actually ran to
`model_dir/run_record.json`.

Example, a single process on the embedded digits:

  >>> from run_config.run_config import RunConfigOptions
  >>> job = JobConfig(run=RunConfigOptions(model_dir="/tmp/digits"),  # doctest: +SKIP
  ...                 train_steps=200)
  >>> train_and_evaluate(job, ClusterConfig())["accuracy"]  # doctest: +SKIP
  0.95...
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import importlib.metadata
import json
import os
import platform
import re
import socket
import time
import types
from typing import Any, Iterator, Mapping, Optional

import tensorflow as tf
from absl import logging
from tensorflow.python.autograph.impl.api import autograph_artifact

from estimator_dist import export, user_code
from estimator_dist.base.cluster import EVALUATOR, ClusterConfig
from estimator_dist.base.errors import (
    CollectiveMismatchError,
    DataError,
    Error,
    ModelDirUnwritableError,
    PeerFailureError,
    UsageError,
    UserCodeError,
)
from estimator_dist.cpus import allowed_cores, onednn_enabled
from estimator_dist.guards import enter_task, start_preemption, start_watchdog
from estimator_dist.job import JobConfig, check_micro_batches
from estimator_dist.preflight import (
    Preflight,
    build_estimator,
    build_keras_model,
    model_fn_estimator,
    preflight,
)
from estimator_dist.rendezvous import rendezvous
from estimator_dist.startup import Startup
from estimator_dist.user_code import bind_input_fn
from estimator_dist.watchdog import Watchdog
from input_fns import bad_data
from run_config.run_config import make_run_config
from run_config.strategies import Strategies, make_strategies

#: Names other modules import from here.
__all__ = [
    "JobConfig",
    "Preflight",
    "bind_input_fn",
    "check_micro_batches",
    "preflight",
    "train_and_evaluate",
]

#: Written by the evaluator (or a single process) after each evaluation.
METRICS_FILE = "eval_metrics.json"
#: Written by the chief (or a single process) before training starts.
RUN_RECORD_FILE = "run_record.json"
#: Errors of collective operations and lost peers, fatal once training runs.
PEER_ERRORS = (
    tf.errors.AbortedError,
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.CancelledError,
)

#: Starts the message of any error from a collective that a peer aborted.
COLLECTIVE_ABORT = "Collective ops is aborted by"
#: In the message of a collective whose tasks contributed tensors of different shapes.
COLLECTIVE_SHAPE_MISMATCH = "Shape mismatch in the collective instance"
#: In the error of a TF1 optimizer that cannot update variables under a strategy.
DISTRIBUTED_HANDLE = "DistributedVariable.handle is not available"
#: Names the optimizers behind `DISTRIBUTED_HANDLE`, and what to use instead.
DISTRIBUTED_OPTIMIZER_HINT = (
    "Some tf.compat.v1.train optimizers (ProximalAdagradOptimizer, AdagradDAOptimizer, "
    "ProximalGradientDescentOptimizer) cannot update variables under a tf.distribute strategy, "
    "in any TensorFlow 2.15 job; use AdagradOptimizer, FtrlOptimizer (which has l1 and l2 "
    "regularization) or GradientDescentOptimizer. "
)
#: What a collective shape mismatch means, and its fixes.
COLLECTIVE_MISMATCH_MESSAGE = (
    "{kind} at global step {step}: the tasks all-reduced tensors of different shapes ({summary}). "
    "The same graph would fail the same way after a restart. Usual causes: a model whose "
    "variables differ between tasks (shapes computed from data a task read alone, such as a "
    "vocabulary built per worker), or per-task sizes of a value that is reduced. Build every "
    "shape from settings every task shares."
)
#: The refused writes no restart fixes, by errno, each with its fix.
STORAGE_FIXES = {
    errno.ENOSPC: (
        "free space on that filesystem (delete old runs, or keep fewer checkpoints with "
        "--keep_checkpoint_max and exports with --exports_to_keep) or give a --model_dir on a "
        "filesystem with room"
    ),
    errno.EDQUOT: (
        "raise this user's quota on that filesystem, free space under it, or give a --model_dir "
        "elsewhere"
    ),
    errno.EROFS: (
        "remount that filesystem read-write (one the kernel remounted read-only after I/O errors "
        "needs checking first) or give a --model_dir on a writable filesystem"
    ),
    errno.EACCES: (
        "give this user (uid {uid}) write permission on that directory, or give a --model_dir it "
        "may write to"
    ),
}
#: The errno behind each message of a refused write.
_ERRNO_OF = {os.strerror(code): code for code in STORAGE_FIXES}
#: How TensorFlow reports a refused write: a line `<path>; <strerror>`.
_REFUSED_WRITE = re.compile(
    r"^\s*(.+?); (" + "|".join(map(re.escape, _ERRNO_OF)) + ")", re.MULTILINE
)
#: Why a write to model_dir failed, what is kept, and the fix.
MODEL_DIR_UNWRITABLE_MESSAGE = (
    "cannot write the {what} to {model_dir}{at_step}: {reason} ({path}; {space}). {kept} "
    "A restart would fail the same way, so the job is not retried: {fix}, then run the same "
    "command again."
)


def is_peer_error(error: tf.errors.OpError) -> bool:
    """Whether `error` means a peer task or the network failed.

    A peer that leaves a step early aborts the collectives waiting for it;
    TensorFlow reports that as an InternalError naming the abort.

    >>> is_peer_error(tf.errors.UnavailableError(None, None, "Socket closed"))
    True
    >>> is_peer_error(tf.errors.InternalError(
    ...     None, None, "Collective ops is aborted by: Delete called on non-empty BufRendezvous"))
    True
    >>> is_peer_error(tf.errors.InternalError(None, None, "cuDNN failed"))
    False
    """
    return isinstance(error, PEER_ERRORS) or COLLECTIVE_ABORT in error.message


def explain_storage_error(
    error: BaseException, model_dir: Optional[str], step: Optional[int] = None
) -> Optional[ModelDirUnwritableError]:
    """The `ModelDirUnwritableError` (exit 9) that `error` means, if the storage refused a write.

    TensorFlow 2.15 reports a refused write as `<path>; <strerror>`: a full
    filesystem as ResourceExhaustedError (checkpoints, graph.pbtxt, files),
    or as RuntimeError from the thread writing event files; a read-only one,
    or a missing permission, as PermissionDeniedError. Python's own writes
    raise OSError.

    Args:
      error: What a write, or training, raised.
      model_dir: The job's model_dir. A refused permission counts only for a
        path in it (or one of its parents): reading data can be refused too.
        None: only a full or read-only filesystem counts, wherever it is.
      step: The last global step this task saw, or None before training.

    Returns:
      The error naming the path, what was written, the free space, the
      latest checkpoint and the fix; None for any other error.

    >>> error = tf.errors.ResourceExhaustedError(
    ...     None, None, "/runs/1/model.ckpt-100.data-00000-of-00001; No space left on device")
    >>> print(explain_storage_error(error, None, 100))  # doctest: +ELLIPSIS
    cannot write the checkpoint of step 100 to its directory at global step 100: No space ...
    """
    if isinstance(error, OSError):
        code, path = error.errno, error.filename
    else:
        message = getattr(error, "message", str(error))
        found = _REFUSED_WRITE.search(message)
        code, path = (_ERRNO_OF[found.group(2)], found.group(1)) if found else (None, None)
    if code not in STORAGE_FIXES or not isinstance(path, str):
        return None
    if model_dir is None and code == errno.EACCES:
        return None
    if model_dir is not None and not _related(path, model_dir):
        return None
    logging.error("The storage refused a write; full error: %s", error)
    latest = tf.train.latest_checkpoint(model_dir) if model_dir else None
    space = _free_space(path)
    if latest and code in (errno.ENOSPC, errno.EDQUOT) and "://" not in latest:
        size = sum(os.path.getsize(name) for name in tf.io.gfile.glob(f"{latest}.*"))
        space += f"; the latest checkpoint takes {_size(size)}"
    if latest:
        kept = f"The checkpoints already written are intact; training resumes from {latest}."
    else:
        kept = "No checkpoint had been written yet."
    return ModelDirUnwritableError(
        MODEL_DIR_UNWRITABLE_MESSAGE.format(
            what=_written_thing(path, model_dir),
            model_dir=model_dir or "its directory",
            at_step="" if step is None else f" at global step {step}",
            reason=os.strerror(code),
            path=path,
            space=space,
            kept=kept,
            fix=STORAGE_FIXES[code].format(uid=os.getuid()),
        )
    )


def _related(path: str, model_dir: str) -> bool:
    """Whether `path` is in `model_dir`, is it, or is one of its parents."""
    if "://" in model_dir:
        path, model_dir = path.rstrip("/"), model_dir.rstrip("/")
        return path.startswith(model_dir + "/") or (model_dir + "/").startswith(path + "/")
    path, model_dir = os.path.abspath(path), os.path.abspath(model_dir)
    return os.path.commonpath([path, model_dir]) in (path, model_dir)


def _written_thing(path: str, model_dir: Optional[str]) -> str:
    """Names what a write to `path` was: a checkpoint, an event file, an export..."""
    related = _related(path, model_dir) if model_dir else False
    relative = os.path.relpath(path, model_dir) if related else os.path.basename(path)
    name, first = os.path.basename(path), relative.split(os.sep)[0]
    step = re.search(r"model\.ckpt-(\d+)", relative)
    known = [k for k in ("graph.pbtxt", METRICS_FILE, RUN_RECORD_FILE) if name.startswith(k)]
    if relative.startswith(os.pardir) or relative == os.curdir:
        return "directory itself (creating it)"
    if step:
        return f"checkpoint of step {step.group(1)}"
    if name.startswith("checkpoint"):
        return "checkpoint list (the file `checkpoint`, which names the latest one)"
    if first == "eval":
        return "evaluation event file"
    if name.startswith("events.out.tfevents"):
        return "event file (TensorBoard summaries)"
    if first == "export":
        return "SavedModel export"
    if known:
        return f"file {known[0]}"
    return f"{'file' if '.' in name else 'directory'} {relative}"


def _free_space(path: str) -> str:
    """The free and total size of the filesystem holding `path`, as words."""
    if "://" in path:
        return "free space unknown: not a local path"
    directory = os.path.dirname(os.path.abspath(path))
    while not os.path.isdir(directory):
        directory = os.path.dirname(directory)
    stats = os.statvfs(directory)
    free, total = stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize
    return f"{_size(free)} free of {_size(total)} on its filesystem"


def _size(size: int) -> str:
    """A byte count as KiB, MiB or GiB.

    >>> _size(0), _size(102400), _size(20 * 2**20), _size(3 * 2**30)
    ('0 KiB', '100 KiB', '20.0 MiB', '3.0 GiB')
    """
    if size < 2**20:
        return f"{size // 1024} KiB"
    if size < 2**30:
        return f"{size / 2**20:.1f} MiB"
    return f"{size / 2**30:.1f} GiB"


@contextlib.contextmanager
def _refused_writes(model_dir: str) -> Iterator[None]:
    """Raises `ModelDirUnwritableError` for a write to `model_dir` the storage refuses."""
    try:
        yield
    except (tf.errors.OpError, OSError) as error:
        unwritable = explain_storage_error(error, model_dir)
        if unwritable is None:
            raise
        raise unwritable from None


def explain_training_error(
    error: tf.errors.OpError,
    step: Optional[int],
    seconds: float,
    model_dir: Optional[str] = None,
) -> Optional[Exception]:
    """The error with an exit code of its own that `error` from training means, if any.

    Args:
      error: What `train_and_evaluate` raised.
      step: The last global step this task saw, or None.
      seconds: How long training had run.
      model_dir: The job's model_dir, where a refused write means exit 9;
        None counts a full or read-only filesystem anywhere.

    Returns:
      A `bad_data.DataError` (exit 3) for a bad record, a
      `ModelDirUnwritableError` (exit 9) for a write the storage refused, a
      `CollectiveMismatchError` (exit 7) for tensors whose shapes differ
      between tasks, a `PeerFailureError` (exit 150) for a lost peer, or
      None for any other error.
    """
    # A collective abort carries its cause's message, which may be a bad record.
    data_error = bad_data.data_error_from(error)
    if data_error is not None:
        return data_error
    unwritable = explain_storage_error(error, model_dir, step)
    if unwritable is not None:
        return unwritable
    if COLLECTIVE_SHAPE_MISMATCH in error.message:
        logging.error("Collective shape mismatch, full TensorFlow error: %s", error.message)
        return CollectiveMismatchError(
            COLLECTIVE_MISMATCH_MESSAGE.format(
                kind=type(error).__name__, step=step, summary=_error_summary(error)
            )
        )
    if not is_peer_error(error):
        return None
    logging.error("Collective failure, full TensorFlow error: %s", error.message)
    return PeerFailureError(
        f"{type(error).__name__} at global step {step} after {seconds:.1f} s "
        f"({_error_summary(error)}). A peer task died or the network between tasks failed; "
        "restart the whole job from its latest checkpoint."
    )


class MetricsExporter(tf.estimator.Exporter):
    """Writes each evaluation's metrics to `model_dir/eval_metrics.json`.

    `tf.estimator.train_and_evaluate` returns None in multi-worker mode, so
    this exporter, which the evaluator calls after every evaluation, is where
    the final metrics come from. The file is replaced atomically.
    """

    def __init__(self, model_dir: str) -> None:
        self._path = os.path.join(model_dir, METRICS_FILE)
        self.final_metrics: Optional[dict] = None

    @property
    def name(self) -> str:
        return "metrics"

    def export(
        self,
        estimator: tf.estimator.Estimator,
        export_path: str,
        checkpoint_path: str,
        eval_result: Mapping[str, Any],
        is_the_final_export: bool,
    ) -> str:
        metrics = {key: _to_json_number(value) for key, value in eval_result.items()}
        record = {
            "metrics": metrics,
            "checkpoint": checkpoint_path,
            "final": bool(is_the_final_export),
        }
        write_json(self._path, record)
        if is_the_final_export:
            self.final_metrics = metrics
        return self._path


def _to_json_number(value: Any) -> Any:
    try:
        return value.item()
    except AttributeError:
        return value


def write_json(path: str, data: Mapping[str, Any]) -> None:
    """Writes `data` as JSON to `path` atomically (a temporary file, then a rename)."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(temporary, "w") as stream:
        stream.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tf.io.gfile.rename(temporary, path, overwrite=True)


def checkpoint_step(model_dir: str) -> int:
    """Returns the global step of the latest checkpoint in `model_dir`, or 0 if none."""
    latest = tf.train.latest_checkpoint(model_dir)
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def read_final_metrics(model_dir: str) -> Optional[dict]:
    """Returns the final evaluation metrics written to `model_dir`, or None."""
    path = os.path.join(model_dir, METRICS_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as stream:
        record = json.load(stream)
    return record["metrics"] if record.get("final") else None


def format_metrics(metrics: Mapping[str, Any]) -> str:
    """Returns `metrics` as one line, global step first."""
    step = metrics.get("global_step")
    rest = ", ".join(
        f"{key}={value:.4f}" if isinstance(value, float) else f"{key}={value}"
        for key, value in sorted(metrics.items())
        if key != "global_step"
    )
    return f"global_step={step}, {rest}"


def library_versions() -> dict:
    """Versions of Python, TensorFlow and the packages a run record names."""
    versions = {"python": platform.python_version(), "tensorflow": tf.__version__}
    for distribution in ("tensorflow-estimator", "keras", "tensorflow-datasets", "estimator-dist"):
        try:
            versions[distribution] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            versions[distribution] = None
    return versions


def make_run_record(
    job: JobConfig,
    cluster: ClusterConfig,
    strategies: Strategies,
    num_replicas: int,
    checked: Optional[Preflight] = None,
) -> dict:
    """Describes what this job really runs: role, strategy, collectives, batches, inputs."""
    train = strategies.train_distribute
    per_replica = job.batch_size // num_replicas
    inputs = {"train": job.input_fn, "eval": job.eval_input_name}
    if checked is not None:
        inputs["eval_steps"] = checked.eval_steps
        inputs["sharded_by_input_context"] = user_code.takes_input_context(checked.input_fn)
    return {
        "role": cluster.role,
        "task_type": cluster.task_type,
        "task_index": cluster.task_index,
        "host": socket.gethostname(),
        "cluster": {name: list(addresses) for name, addresses in cluster.jobs.items()},
        "tf_config_normalisations": list(cluster.notes),
        "num_workers": cluster.num_workers,
        "num_ps": cluster.num_ps,
        "num_replicas": num_replicas,
        "strategy": strategies.train_name,
        "strategy_class": type(train).__name__ if train is not None else None,
        "eval_strategy": strategies.eval_name,
        "communication_requested": strategies.communication,
        "communication_used": strategies.effective_communication,
        "global_batch_size": job.batch_size,
        "per_worker_batch_size": per_replica * max(1, num_replicas // cluster.num_workers),
        "per_replica_batch_size": per_replica,
        "gradient_accumulation_steps": job.gradient_accumulation_steps,
        "effective_global_batch_size": job.batch_size * job.gradient_accumulation_steps,
        "micro_batches": job.micro_batches,
        "per_replica_micro_batch_size": per_replica // job.micro_batches,
        "bytes_per_pack": job.strategy.bytes_per_pack,
        "gradient_wire_dtype": job.strategy.gradient_wire_dtype,
        "input_fns": inputs,
        "onednn": onednn_enabled(),
        "session_threads": {
            "intra_op": job.run.intra_op_threads,
            "inter_op": job.run.inter_op_threads,
        },
        "cores": allowed_cores(),
        "versions": library_versions(),
        "config": job.to_dict(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def _check_batch(job: JobConfig, num_replicas: int, cluster: ClusterConfig) -> None:
    if job.batch_size % num_replicas:
        lower = max(num_replicas, job.batch_size - job.batch_size % num_replicas)
        raise UsageError(
            f"--batch_size={job.batch_size} is the global batch and must divide evenly "
            f"over the {num_replicas} replicas ({cluster.num_workers} worker(s)); use a "
            f"multiple of {num_replicas}, such as {lower} or {lower + num_replicas}."
        )
    check_micro_batches(job.batch_size, job.micro_batches, num_replicas)


@contextlib.contextmanager
def _model_dir_lock(model_dir: str, name: str) -> Iterator[None]:
    """Serialises one step across the tasks sharing a local model_dir."""
    if "://" in model_dir:
        yield
        return
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, f".{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _make_estimator(
    job: JobConfig, checked: Preflight, run_config: tf.estimator.RunConfig
) -> tf.estimator.Estimator:
    if job.estimator:
        return model_fn_as_written(build_estimator(job, checked.feature_specs, run_config))
    if job.keras_model is None:
        return model_fn_as_written(model_fn_estimator(job, checked.model_fn, run_config))
    # model_to_estimator writes the warm-start checkpoint to model_dir/keras on every task.
    with _model_dir_lock(job.run.model_dir, "keras_bridge"):
        return model_fn_as_written(
            tf.keras.estimator.model_to_estimator(
                keras_model=build_keras_model(job, checked.feature_specs), config=run_config
            )
        )


def model_fn_as_written(estimator: tf.estimator.Estimator) -> tf.estimator.Estimator:
    """Makes a distribution strategy run the estimator's model_fn as one process does.

    Under a strategy, Estimator builds each replica's graph through
    `call_for_each_replica`, which in graph mode passes the model_fn through
    AutoGraph: every function it calls, the package's and the user's, is
    parsed and rewritten, 3 to 6 s of every task's start-up on 2 cores (most
    of the "graph" phase), and Python control flow on tensors gets a meaning
    it does not have in one process. Marked as AutoGraph output, the model_fn
    runs as written, in AutoGraph's default context, as it does without a
    strategy (Keras layers still convert their own `call`).

    Args:
      estimator: Any Estimator: built from a model_fn, canned, or from Keras.

    Returns:
      The same estimator.
    """
    method = type(estimator)._call_model_fn

    def call_model_fn(self: tf.estimator.Estimator, *args: Any, **kwargs: Any) -> Any:
        return method(self, *args, **kwargs)

    # Bound, so that the copy the distribute coordinator makes calls it on itself.
    estimator._call_model_fn = types.MethodType(
        autograph_artifact(functools.update_wrapper(call_model_fn, method)), estimator
    )
    return estimator


def _error_summary(error: tf.errors.OpError) -> str:
    """Returns the line of a TensorFlow error that says what happened."""
    lines = [line.strip() for line in error.message.splitlines() if line.strip()]
    noise = (
        "Graph execution error",
        "Detected at",
        "Additional GRPC",
        ":{",
        "File ",
        "Node:",
        "From ",
    )
    useful = [line for line in lines if not line.startswith(noise)]
    summary = (useful or lines or [type(error).__name__])[0][:300]
    peer = re.search(r"remote target /job:(\w+)/replica:\d+/task:(\d+)", error.message)
    return f"{summary}; peer {peer.group(1)}-{peer.group(2)}" if peer else summary


def job_view(job: JobConfig, cluster: ClusterConfig) -> dict:
    """The settings every task of a cluster must agree on, for the rendezvous."""
    model_dir = job.run.model_dir
    return {
        "cluster": {name: list(addresses) for name, addresses in cluster.jobs.items()},
        "model_dir": model_dir if "://" in model_dir else os.path.abspath(model_dir),
        "strategy": job.strategy.name,
        "communication": job.strategy.communication,
        "collective_timeout": job.strategy.collective_timeout_seconds,
        "bytes_per_pack": job.strategy.bytes_per_pack,
        "gradient_wire_dtype": job.strategy.gradient_wire_dtype,
        "train_steps": job.train_steps,
        "batch_size": job.batch_size,
        "gradient_accumulation_steps": job.gradient_accumulation_steps,
        "micro_batches": job.micro_batches,
        "model": job.keras_model or job.estimator or job.model_fn,
        "input_fn": job.input_fn,
        "eval_input_fn": job.eval_input_name,
        "params": job.to_dict()["params"],
        "tensorflow": tf.__version__,
    }


def train_and_evaluate(job: JobConfig, cluster: ClusterConfig) -> Optional[dict]:
    """Runs `tf.estimator.train_and_evaluate` for this task of the job.

    Sets TF_CONFIG to the normalised `cluster` (TensorFlow reads it from the
    environment), switches to graph mode, builds role-aware strategies and
    the RunConfig, and trains, evaluates or serves as a parameter server.

    Args:
      job: The job, identical on every task.
      cluster: This task's validated cluster configuration.

    Returns:
      The final evaluation metrics on the evaluator and in a single process;
      None on the chief, workers and parameter servers.

    Raises:
      UsageError: for configuration that cannot run (batch size, strategy
        and cluster mismatch, unknown names, missing data).
      DataError: when the input pipeline finds a bad record.
    """
    startup = Startup(cluster.role)
    startup.mark("imports")
    enter_task(cluster)

    checked = preflight(job, cluster.num_workers if cluster.task_type != EVALUATOR else 1)
    startup.mark("pre-flight")
    # Everything this task can check alone comes before waiting for the others.
    strategies = make_strategies(job.strategy, job.eval_strategy, cluster)
    train = strategies.train_distribute
    num_replicas = train.num_replicas_in_sync if train and cluster.task_type != EVALUATOR else 1
    _check_batch(job, num_replicas, cluster)
    run_config = make_run_config(job.run, train, strategies.eval_distribute)
    startup.mark("strategies")
    with _refused_writes(job.run.model_dir):
        tf.io.gfile.makedirs(job.run.model_dir)
        preemption = start_preemption(
            cluster, job.run.model_dir, job.preemption_checkpoint, job.preemption_grace_secs
        )
    rendezvous(cluster, job_view(job, cluster), job.startup_timeout)
    startup.mark("rendezvous")
    logging.info(
        "Task %s: strategy %s, communication requested %s, used %s; %d replica(s); "
        "global batch %d.",
        cluster.role,
        strategies.train_name,
        strategies.communication,
        strategies.effective_communication,
        num_replicas,
        job.batch_size,
    )
    with _refused_writes(job.run.model_dir):
        if cluster.is_chief:
            write_json(
                os.path.join(job.run.model_dir, RUN_RECORD_FILE),
                make_run_record(job, cluster, strategies, num_replicas, checked),
            )
        estimator = _make_estimator(job, checked, run_config)
    watchdog = start_watchdog(
        cluster,
        job.run.model_dir,
        job.train_steps,
        job.startup_timeout,
        job.stall_timeout,
        preemption,
    )
    exporter = MetricsExporter(job.run.model_dir)
    exporters = export.make_exporters(
        checked.feature_specs, checked.exports, job.export_best_by, job.exports_to_keep
    )
    hooks = [startup.hook(), *preemption.hooks()]
    eval_hooks = [] if watchdog is None else [watchdog.eval_hook()]
    if isinstance(watchdog, Watchdog):
        hooks.append(watchdog.hook())
    if job.trace_every_steps:
        traces = os.path.join(job.run.model_dir, "traces", cluster.role)
        hooks.append(tf.compat.v1.train.ProfilerHook(job.trace_every_steps, output_dir=traces))
    train_spec = tf.estimator.TrainSpec(checked.input_fn, max_steps=job.train_steps, hooks=hooks)
    eval_spec = tf.estimator.EvalSpec(
        checked.eval_input_fn,
        steps=checked.eval_steps,
        exporters=[exporter, *exporters],
        hooks=eval_hooks,
        start_delay_secs=0,
        throttle_secs=job.eval_throttle_secs,
    )
    started = time.monotonic()
    try:
        tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    except tf.errors.OpError as error:
        step = watchdog.step if isinstance(watchdog, Watchdog) else None
        explained = explain_training_error(
            error, step, time.monotonic() - started, job.run.model_dir
        )
        if preemption.requested:
            logging.warning("Training failed while stopping for a preemption: %s", error.message)
            preemption.finished()
        if explained is None:
            raise
        raise explained from (error if isinstance(explained, DataError) else None)
    except (Error, KeyboardInterrupt, SystemExit):
        raise
    except Exception as error:  # The user's model_fn, input_fn or hooks raised while training.
        # Except the thread writing event files, which raises what the storage refused.
        step = watchdog.step if isinstance(watchdog, Watchdog) else None
        unwritable = explain_storage_error(error, job.run.model_dir, step)
        if unwritable is not None:
            raise unwritable from None
        logging.exception("Training raised:")
        hint = DISTRIBUTED_OPTIMIZER_HINT if DISTRIBUTED_HANDLE in str(error) else ""
        raise UserCodeError(
            f"training raised {type(error).__name__}: {error}. {hint}The traceback is in the "
            "log above; the model_fn or input_fn would raise it again after a restart, so the "
            "job stops. Fix the code and run again."
        ) from None
    finally:
        skipped = bad_data.summary()
        if skipped:
            logging.warning("%s", skipped)
    if watchdog is not None:
        watchdog.stop()
    preemption.finished()
    preemption.uninstall()
    logging.info("Task %s finished in %.1f s.", cluster.role, time.monotonic() - started)
    if cluster.task_type in (None, EVALUATOR):
        return exporter.final_metrics
    return None
