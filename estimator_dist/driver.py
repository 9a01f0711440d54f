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
import dataclasses
import fcntl
import functools
import importlib.metadata
import inspect
import json
import os
import platform
import re
import socket
import time
import types
from typing import Any, Callable, Iterator, Mapping, Optional, Tuple, Union

import tensorflow as tf
from absl import logging
from tensorflow.python.autograph.impl.api import autograph_artifact

from estimator_dist import export, pitfalls
from estimator_dist import params as params_lib
from estimator_dist.cluster import CHIEF, EVALUATOR, PS, ClusterConfig
from estimator_dist.cpus import allowed_cores, onednn_enabled
from estimator_dist.errors import DataError, PeerFailureError, UsageError
from estimator_dist.rendezvous import rendezvous
from estimator_dist.startup import Startup
from estimator_dist.watchdog import EvaluatorWatchdog, Watchdog
from input_fns import INPUT_FNS, bad_data, prepare_input
from model_fns import ESTIMATORS, KERAS_MODELS, MODEL_FNS
from model_fns.optimizers import ACCUMULATION_STEPS, MICRO_BATCH_COLLECTION, MICRO_BATCHES
from model_fns.optimizers import COLLECTION as ACCUMULATING_OPTIMIZERS
from run_config.run_config import RunConfigOptions, make_run_config
from run_config.strategies import Strategies, StrategyConfig, make_strategies
from run_config.teardown import without_autotune

#: Written by the evaluator (or a single process) after each evaluation.
METRICS_FILE = "eval_metrics.json"
#: Written by the chief (or a single process) before training starts.
RUN_RECORD_FILE = "run_record.json"
#: `params` entries the driver fills from flags of their own.
_FLAG_PARAMS = ("batch_size", "learning_rate", "data_dir", "seed")
#: Errors of collective operations and lost peers, fatal once training runs.
PEER_ERRORS = (
    tf.errors.AbortedError,
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.CancelledError,
)

#: Starts the message of any error from a collective that a peer aborted.
COLLECTIVE_ABORT = "Collective ops is aborted by"


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


def explain_training_error(
    error: tf.errors.OpError, step: Optional[int], seconds: float
) -> Optional[Exception]:
    """The error with an exit code of its own that `error` from training means, if any.

    Args:
      error: What `train_and_evaluate` raised.
      step: The last global step this task saw, or None.
      seconds: How long training had run.

    Returns:
      A `bad_data.DataError` (exit 3) for a bad record, a `PeerFailureError`
      (exit 150) for a lost peer, or None for any other error.
    """
    # A collective abort carries its cause's message, which may be a bad record.
    data_error = bad_data.data_error_from(error)
    if data_error is not None:
        return data_error
    if not is_peer_error(error):
        return None
    logging.error("Collective failure, full TensorFlow error: %s", error.message)
    return PeerFailureError(
        f"{type(error).__name__} at global step {step} after {seconds:.1f} s "
        f"({_error_summary(error)}). A peer task died or the network between tasks failed; "
        "restart the whole job from its latest checkpoint."
    )


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """Everything one training job needs; the same on every task.

    Attributes:
      model_fn: Registry name or `package.module:function` of a model_fn.
      keras_model: Registry name or `package.module:function` of a function
        returning a compiled Keras model; replaces `model_fn` when set.
      estimator: Registry name or `package.module:function` of a function
        `build(config, params)` returning a `tf.estimator.Estimator` (such as
        a canned `DNNClassifier`) built with the RunConfig it is given;
        replaces `model_fn` when set.
      warm_start_from: Checkpoint (or directory) whose variables initialise
        the model when `model_dir` has no checkpoint yet.
      exports: Which SavedModels the evaluator exports after evaluations:
        `latest` (every evaluation, keeping `exports_to_keep`) and/or `best`
        (when `export_best_by` improves).
      export_best_by: Metric deciding the best export, `name`, `name:min` or
        `name:max`; without a suffix, names like loss, error, rmse and mae
        are minimised and others maximised.
      exports_to_keep: Exports kept of each kind.
      input_fn: Registry name or `package.module:function` of an input_fn.
      train_steps: Global steps to train; every task stops there.
      eval_steps: Evaluation batches; None reads the whole evaluation data.
      batch_size: Global batch size, divided evenly over all replicas.
      gradient_accumulation_steps: Micro-batches of `batch_size` whose mean
        gradient makes one update (k); every k-th step all-reduces and
        applies it, so the effective global batch is k x `batch_size`. The
        model's optimizer must be wrapped with
        `model_fns.optimizers.with_gradient_accumulation`, as the shipped
        model_fns do; the dry run refuses a model_fn that does not.
      micro_batches: Slices of each replica's batch computed one after
        another within a step, whose mean gradient makes the step's update:
        the update of the whole batch with one slice's activation memory.
        The model_fn must build its update with
        `model_fns.optimizers.minimize_in_micro_batches` (`mnist_cnn` does);
        the dry run refuses a model_fn that does not.
      learning_rate: Passed to the model as `params["learning_rate"]`.
      data_dir: Dataset directory passed to the input_fn.
      seed: Seed for weight initialisation (graph seed) and data shuffling.
      params: Extra model and input hyper-parameters (`--params`).
      strategy: Training distribution strategy.
      eval_strategy: Evaluation strategy name (`off`, `mirrored`, `one_device`).
      eval_throttle_secs: Least seconds between two evaluations.
      startup_timeout: Seconds a training task may take to complete its
        first step (cluster assembly included) before it fails.
      stall_timeout: Seconds the global step may stay the same before the
        task fails; on the evaluator, seconds without a new checkpoint while
        the chief is unreachable.
      trace_every_steps: Write a Chrome trace (every op's start and duration,
        collectives included) of every this many global steps to
        `model_dir/traces/<task>/`, for chrome://tracing or Perfetto; None
        for none.
      run: Checkpoint, summary and thread settings; holds `model_dir`.
    """

    run: RunConfigOptions
    model_fn: str = "mnist_cnn"
    keras_model: Optional[str] = None
    estimator: Optional[str] = None
    input_fn: str = "digits"
    train_steps: int = 1000
    eval_steps: Optional[int] = None
    batch_size: int = 64
    gradient_accumulation_steps: int = 1
    micro_batches: int = 1
    learning_rate: float = 0.001
    data_dir: Optional[str] = None
    seed: Optional[int] = 0
    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    strategy: StrategyConfig = StrategyConfig()
    eval_strategy: str = "off"
    eval_throttle_secs: int = 5
    startup_timeout: float = 600.0
    stall_timeout: float = 120.0
    trace_every_steps: Optional[int] = None
    warm_start_from: Optional[str] = None
    exports: Tuple[str, ...] = export.EXPORTS
    export_best_by: str = "loss"
    exports_to_keep: int = 3

    def __post_init__(self) -> None:
        if self.keras_model and self.estimator:
            raise UsageError(
                f"Give --keras_model or --estimator, not both; received "
                f"--keras_model={self.keras_model} and --estimator={self.estimator}."
            )
        unknown = sorted(set(self.exports) - set(export.EXPORTS))
        if unknown:
            raise UsageError(
                f"--export names {', '.join(unknown)}; valid: {', '.join(export.EXPORTS)} "
                "(or none)."
            )
        export.best_metric(self.export_best_by)
        if self.exports_to_keep < 1:
            raise UsageError(
                f"exports_to_keep must be at least 1, received {self.exports_to_keep}."
            )
        if self.warm_start_from and self.keras_model:
            raise UsageError(
                f"--warm_start_from={self.warm_start_from} cannot be used with --keras_model: "
                "model_to_estimator starts from the Keras model's own weights. Load them in "
                "your build function with model.load_weights(...) instead."
            )
        for name in ("startup_timeout", "stall_timeout"):
            if getattr(self, name) <= 0:
                raise UsageError(f"{name} must be positive, received {getattr(self, name)}.")
        if self.trace_every_steps is not None and self.trace_every_steps < 1:
            raise UsageError(
                f"trace_every_steps must be at least 1 or None, received {self.trace_every_steps}."
            )
        if self.train_steps < 1:
            raise UsageError(f"train_steps must be at least 1, received {self.train_steps}.")
        if self.eval_steps is not None and self.eval_steps < 1:
            raise UsageError(f"eval_steps must be at least 1 or None, received {self.eval_steps}.")
        if self.batch_size < 1:
            raise UsageError(f"batch_size must be at least 1, received {self.batch_size}.")
        for name in ("gradient_accumulation_steps", "micro_batches"):
            value = getattr(self, name)
            if value < 1:
                raise UsageError(f"{name} must be at least 1, received {value}.")
            if value > 1 and (self.keras_model or self.estimator):
                raise UsageError(
                    f"--{name}={value} needs a model_fn that builds its update with "
                    "model_fns.optimizers; --keras_model and --estimator build their "
                    f"optimizers inside TensorFlow. Use --model_fn, or --{name}=1."
                )
        check_micro_batches(self.batch_size, self.micro_batches, 1)
        if self.learning_rate <= 0:
            raise UsageError(f"learning_rate must be positive, received {self.learning_rate}.")
        if self.eval_throttle_secs < 0:
            raise UsageError(
                f"eval_throttle_secs must be 0 or more, received {self.eval_throttle_secs}."
            )
        clashes = sorted(set(self.params) & {*_FLAG_PARAMS, *params_lib.JOB_KEYS})
        if clashes:
            raise UsageError(
                f"--params sets {', '.join(clashes)}, which have flags of their own; "
                f"use --{clashes[0]} instead."
            )

    @property
    def model_params(self) -> dict:
        """The `params` dict handed to the model_fn and input_fn."""
        return {
            **self.params,
            **{name: getattr(self, name) for name in _FLAG_PARAMS},
            ACCUMULATION_STEPS: self.gradient_accumulation_steps,
            MICRO_BATCHES: self.micro_batches,
        }

    def to_dict(self) -> dict:
        """Returns the configuration as JSON-serialisable data."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))


def bind_input_fn(input_fn: Callable, params: Mapping[str, Any]) -> Callable:
    """Gives `params` to an input_fn while keeping its Estimator signature.

    Estimator passes `input_context` only to functions that declare it; a
    function without it gets its dataset auto-sharded by the strategy, so
    the wrapper declares `input_context` exactly when `input_fn` does. The
    dataset it returns loses tf.data autotuning unless its options set it,
    so that the session closes at once when training ends
    (`run_config.teardown`).

    Args:
      input_fn: A function of any subset of `mode`, `input_context`, `params`.
      params: The job's params.

    Returns:
      A function for `TrainSpec`/`EvalSpec`.
    """
    accepted = inspect.signature(input_fn).parameters

    def call(mode: str, input_context: Optional[tf.distribute.InputContext]) -> Any:
        kwargs: dict = {}
        if "mode" in accepted:
            kwargs["mode"] = mode
        if "input_context" in accepted:
            kwargs["input_context"] = input_context
        if "params" in accepted:
            kwargs["params"] = params
        return without_autotune(input_fn(**kwargs))

    if "input_context" in accepted:

        def with_context(
            mode: str, input_context: Optional[tf.distribute.InputContext] = None
        ) -> Any:
            return call(mode, input_context)

        return functools.update_wrapper(with_context, input_fn)

    def without_context(mode: str) -> Any:
        return call(mode, None)

    return functools.update_wrapper(without_context, input_fn)


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
        _write_json(self._path, record)
        if is_the_final_export:
            self.final_metrics = metrics
        return self._path


def _to_json_number(value: Any) -> Any:
    try:
        return value.item()
    except AttributeError:
        return value


def _write_json(path: str, data: Mapping[str, Any]) -> None:
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


def _library_versions() -> dict:
    versions = {"python": platform.python_version(), "tensorflow": tf.__version__}
    for distribution in ("tensorflow-estimator", "keras", "tensorflow-datasets", "estimator-dist"):
        try:
            versions[distribution] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            versions[distribution] = None
    return versions


def make_run_record(
    job: JobConfig, cluster: ClusterConfig, strategies: Strategies, num_replicas: int
) -> dict:
    """Describes what this job really runs: role, strategy, collectives, batches."""
    train = strategies.train_distribute
    per_replica = job.batch_size // num_replicas
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
        "onednn": onednn_enabled(),
        "session_threads": {
            "intra_op": job.run.intra_op_threads,
            "inter_op": job.run.inter_op_threads,
        },
        "cores": allowed_cores(),
        "versions": _library_versions(),
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


def check_micro_batches(batch_size: int, micro_batches: int, num_replicas: int) -> None:
    """Refuses a `--micro_batches` that does not divide each replica's batch.

    Raises:
      UsageError: naming the per-replica batch and batch sizes that work.
    """
    unit = num_replicas * micro_batches
    if batch_size % unit:
        lower = max(unit, batch_size - batch_size % unit)
        raise UsageError(
            f"--micro_batches={micro_batches} must divide each replica's batch: "
            f"--batch_size={batch_size} over {num_replicas} replica(s) gives "
            f"{batch_size / num_replicas:g} per replica. Use a --batch_size that is a multiple "
            f"of {unit}, such as {lower} or {lower + unit}, or fewer micro-batches."
        )


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


def _element_spec(input_fn: Callable, mode: str) -> tuple:
    """Returns (features, labels) specs of `input_fn`'s dataset, built in a scratch graph."""
    with tf.Graph().as_default():
        spec = input_fn(mode=mode).element_spec
    if isinstance(spec, tuple) and len(spec) == 2:
        return spec
    return spec, None


def _placeholders(specs: Any) -> Any:
    return tf.nest.map_structure(
        lambda spec: tf.compat.v1.placeholder(spec.dtype, spec.shape), specs
    )


def dry_run_model_fn(model_fn: Callable, input_fn: Callable, params: Mapping[str, Any]) -> tf.Graph:
    """Builds the TRAIN graph once in a scratch graph, before any task commits.

    A bad hyper-parameter or a shape mismatch then fails here, with nothing
    written to model_dir and before the other workers wait for this one.

    Returns:
      The scratch graph, for checks of what the model_fn built.
    """
    features_spec, labels_spec = _element_spec(input_fn, tf.estimator.ModeKeys.TRAIN)
    with tf.Graph().as_default() as graph:
        arguments = {
            "features": _placeholders(features_spec),
            "labels": None if labels_spec is None else _placeholders(labels_spec),
            "mode": tf.estimator.ModeKeys.TRAIN,
            "params": params,
            "config": tf.estimator.RunConfig(),
        }
        accepted = inspect.signature(model_fn).parameters
        model_fn(**{name: value for name, value in arguments.items() if name in accepted})
    return graph


def _check_accumulation(job: JobConfig, graph: tf.Graph) -> None:
    """Refuses accumulation or micro-batches that the model_fn's graph would silently skip."""
    steps = job.gradient_accumulation_steps
    if steps > 1 and not graph.get_collection(ACCUMULATING_OPTIMIZERS):
        raise UsageError(
            f"--gradient_accumulation_steps={steps}, but the model_fn {job.model_fn} applies "
            "its gradients directly, so every step would all-reduce and update as if it were "
            "1. Wrap its optimizer: `optimizer = model_fns.optimizers.with_gradient_accumulation("
            "optimizer, params)`, or pass --gradient_accumulation_steps=1."
        )
    if job.micro_batches > 1 and not graph.get_collection(MICRO_BATCH_COLLECTION):
        raise UsageError(
            f"--micro_batches={job.micro_batches}, but the model_fn {job.model_fn} computes "
            "each batch whole. Build its update with `loss, train_op = model_fns.optimizers."
            "minimize_in_micro_batches(optimizer, loss_fn, features, labels, "
            "params['micro_batches'], global_step)`, or pass --micro_batches=1."
        )


def _build_keras_model(job: JobConfig, params: dict, specs: Mapping[str, Any]) -> tf.keras.Model:
    build = KERAS_MODELS.get(job.keras_model)
    if inspect.signature(build).parameters:
        shapes = {name: spec.shape.as_list()[1:] for name, spec in specs.items()}
        model = build({**params, "feature_shapes": shapes})
    else:
        model = build()
    if not isinstance(model, tf.keras.Model):
        raise UsageError(
            f"--keras_model={job.keras_model} returned {type(model).__name__}; expected a "
            "compiled tf.keras.Model."
        )
    return model


def _estimator_params(job: JobConfig, specs: Mapping[str, Any]) -> dict:
    return {**job.model_params, "feature_specs": specs, "warm_start_from": job.warm_start_from}


def _build_estimator(
    job: JobConfig, specs: Mapping[str, Any], config: tf.estimator.RunConfig
) -> tf.estimator.Estimator:
    estimator = ESTIMATORS.get(job.estimator)(config, _estimator_params(job, specs))
    if not isinstance(estimator, tf.estimator.Estimator):
        raise UsageError(
            f"--estimator={job.estimator} returned {type(estimator).__name__}; expected a "
            "tf.estimator.Estimator built with the RunConfig it is given, such as "
            "tf.estimator.DNNClassifier(..., config=config)."
        )
    return estimator


@dataclasses.dataclass(frozen=True)
class Preflight:
    """What `preflight` resolved: the input_fn with its params bound, and the model.

    Attributes:
      input_fn: The job's input_fn, bound to its params.
      feature_specs: `{name: tf.TensorSpec}` of the input_fn's features,
        batch dimension included; a bare tensor is named `image`.
      model_fn: The model_fn, or None when the job uses a Keras model or an
        estimator builder.
      keras_model: The compiled Keras model, or None.
      pitfalls: Multi-worker pitfalls found (warnings only: fatal ones raise).
    """

    input_fn: Callable
    feature_specs: Mapping[str, tf.TensorSpec]
    model_fn: Optional[Callable]
    keras_model: Optional[tf.keras.Model]
    pitfalls: Tuple[pitfalls.Pitfall, ...] = ()


def preflight(job: JobConfig, num_workers: int = 1) -> Preflight:
    """Resolves names, prepares data, builds the model once and checks for pitfalls.

    The launcher runs it once before starting any task, and every task runs
    it before joining the cluster, so a bad name, missing data, a bad
    hyper-parameter or a known multi-worker pitfall fails at once instead of
    leaving the other tasks waiting. Nothing is written to model_dir.

    Args:
      job: The job.
      num_workers: Training workers of the cluster, for the sharding check.

    Returns:
      What was resolved, with the warnings found.

    Raises:
      UsageError: for an unknown name, missing data, bad parameters or a
        fatal pitfall (the message lists every pitfall found, with its fix).
    """
    params = job.model_params
    input_fn = bind_input_fn(INPUT_FNS.get(job.input_fn), params)
    prepare_input(job.input_fn, params)
    features, _ = _element_spec(input_fn, tf.estimator.ModeKeys.EVAL)
    specs = dict(features) if isinstance(features, Mapping) else {"image": features}
    found = [pitfalls.check_input_fn(input_fn, job.input_fn, num_workers)]
    model_fn = keras_model = None
    if job.keras_model:
        keras_model = _build_keras_model(job, params, specs)
        found += pitfalls.check_keras_model(keras_model, job.keras_model)
    elif job.estimator:
        estimator = _build_estimator(job, specs, tf.estimator.RunConfig())
        dry_run_model_fn(estimator.model_fn, input_fn, params)
    else:
        model_fn = MODEL_FNS.get(job.model_fn)
        _check_accumulation(job, dry_run_model_fn(model_fn, input_fn, params))
    found = [pitfall for pitfall in found if pitfall is not None]
    if any(pitfall.fatal for pitfall in found):
        raise UsageError(pitfalls.format_report(found))
    (logging.warning if found else logging.info)("%s", pitfalls.format_report(found))
    return Preflight(input_fn, specs, model_fn, keras_model, tuple(found))


def _make_estimator(
    job: JobConfig, checked: Preflight, run_config: tf.estimator.RunConfig
) -> tf.estimator.Estimator:
    if job.estimator:
        return model_fn_as_written(_build_estimator(job, checked.feature_specs, run_config))
    if checked.keras_model is None:
        return model_fn_as_written(
            tf.estimator.Estimator(
                checked.model_fn,
                config=run_config,
                params=job.model_params,
                warm_start_from=job.warm_start_from,
            )
        )
    # model_to_estimator writes the warm-start checkpoint to model_dir/keras on every task.
    with _model_dir_lock(job.run.model_dir, "keras_bridge"):
        return model_fn_as_written(
            tf.keras.estimator.model_to_estimator(
                keras_model=checked.keras_model, config=run_config
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
        "params": job.to_dict()["params"],
        "tensorflow": tf.__version__,
    }


def _start_watchdog(
    job: JobConfig, cluster: ClusterConfig
) -> Optional[Union[Watchdog, EvaluatorWatchdog]]:
    """Starts the fail-fast watchdog of a chief, worker or evaluator of a cluster."""
    if not cluster.is_distributed or cluster.task_type == PS:
        return None
    peers = {
        f"{name}-{index}": address
        for name, addresses in cluster.jobs.items()
        for index, address in enumerate(addresses)
        if (name, index) != (cluster.task_type, cluster.task_index)
    }
    if cluster.task_type == EVALUATOR:
        watchdog = EvaluatorWatchdog(
            cluster.role, job.run.model_dir, {"chief-0": cluster.jobs[CHIEF][0]}, job.stall_timeout
        )
    else:
        # Collective training needs every worker at every step; with parameter
        # servers a worker may stop alone.
        last_step = None if cluster.jobs.get(PS) else job.train_steps
        watchdog = Watchdog(cluster.role, peers, job.startup_timeout, job.stall_timeout, last_step)
    watchdog.start()
    return watchdog


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
    tf.compat.v1.disable_eager_execution()
    if cluster.is_distributed:
        os.environ["TF_CONFIG"] = cluster.to_json()
    else:
        os.environ.pop("TF_CONFIG", None)
    for note in cluster.notes:
        logging.info("TF_CONFIG: %s.", note)

    checked = preflight(job, cluster.num_workers if cluster.task_type != EVALUATOR else 1)
    startup.mark("pre-flight")
    # Everything this task can check alone comes before waiting for the others.
    strategies = make_strategies(job.strategy, job.eval_strategy, cluster)
    train = strategies.train_distribute
    num_replicas = train.num_replicas_in_sync if train and cluster.task_type != EVALUATOR else 1
    _check_batch(job, num_replicas, cluster)
    run_config = make_run_config(job.run, train, strategies.eval_distribute)
    startup.mark("strategies")
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
    tf.io.gfile.makedirs(job.run.model_dir)
    if cluster.is_chief:
        _write_json(
            os.path.join(job.run.model_dir, RUN_RECORD_FILE),
            make_run_record(job, cluster, strategies, num_replicas),
        )

    estimator = _make_estimator(job, checked, run_config)
    watchdog = _start_watchdog(job, cluster)
    exporter = MetricsExporter(job.run.model_dir)
    exporters = export.make_exporters(
        checked.feature_specs, job.exports, job.export_best_by, job.exports_to_keep
    )
    hooks = [startup.hook()]
    if isinstance(watchdog, Watchdog):
        hooks.append(watchdog.hook())
    if job.trace_every_steps:
        traces = os.path.join(job.run.model_dir, "traces", cluster.role)
        hooks.append(tf.compat.v1.train.ProfilerHook(job.trace_every_steps, output_dir=traces))
    train_spec = tf.estimator.TrainSpec(checked.input_fn, max_steps=job.train_steps, hooks=hooks)
    eval_spec = tf.estimator.EvalSpec(
        checked.input_fn,
        steps=job.eval_steps,
        exporters=[exporter, *exporters],
        start_delay_secs=0,
        throttle_secs=job.eval_throttle_secs,
    )
    started = time.monotonic()
    try:
        tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    except tf.errors.OpError as error:
        step = watchdog.step if isinstance(watchdog, Watchdog) else None
        explained = explain_training_error(error, step, time.monotonic() - started)
        if explained is None:
            raise
        raise explained from (error if isinstance(explained, DataError) else None)
    finally:
        skipped = bad_data.summary()
        if skipped:
            logging.warning("%s", skipped)
    if watchdog is not None:
        watchdog.stop()
    logging.info("Task %s finished in %.1f s.", cluster.role, time.monotonic() - started)
    if cluster.task_type in (None, EVALUATOR):
        return exporter.final_metrics
    return None
