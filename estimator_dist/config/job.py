"""The job: everything one training job needs, the same on every task.

`JobConfig` is the frozen, validated configuration that the entry points
build from flags and that the driver, the pre-flight and the launcher
receive; library code never reads flags.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping, Optional, Tuple

from estimator_dist.base import params as params_lib
from estimator_dist.base.errors import UsageError
from model_fns.optimizers import ACCUMULATION_STEPS, MICRO_BATCHES
from run_config.run_config import RunConfigOptions
from run_config.strategies import StrategyConfig

#: What `--export` can name.
EXPORTS = ("latest", "best")
#: Metric names (or parts of them) for which lower is better.
LOWER_IS_BETTER = ("loss", "error", "mse", "rmse", "mae", "mean_squared", "mean_absolute")


def best_metric(best_by: str) -> Tuple[str, bool]:
    """Parses `name`, `name:min` or `name:max` into (name, higher_is_better).

    Raises:
      UsageError: for anything else.
    """
    name, colon, direction = best_by.partition(":")
    if not name or (colon and direction not in ("min", "max")):
        raise UsageError(
            f"--export_best_by={best_by!r} is not `metric`, `metric:min` or "
            "`metric:max`; for example --export_best_by=accuracy:max."
        )
    if direction:
        return name, direction == "max"
    return name, not any(part in name for part in LOWER_IS_BETTER)


#: The `params` entry of the examples in an epoch (`model_fns.learning_rates.EpochParams`).
EPOCH_EXAMPLES = "num_train_examples"
#: `params` entries the driver fills from flags of their own.
_FLAG_PARAMS = ("batch_size", "learning_rate", "data_dir", "seed")


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
      input_fn: Registry name or `package.module:function` of an input_fn;
        it feeds training, and evaluation too unless `eval_input_fn` is set.
      eval_input_fn: Registry name or `package.module:function` of the
        evaluation input_fn; None calls `input_fn` with mode EVAL.
      eval_params: Parameters for the evaluation input_fn, over `params`.
      train_steps: Global steps to train; every task stops there.
      stop_threshold: Early stopping: every task stops at one checkpointed step
        once an evaluation's accuracy reaches it (Model Garden's flag), or None.
      eval_steps: Evaluation batches; None reads the whole evaluation data,
        or `user_code.DEFAULT_EVAL_STEPS` batches of an input that repeats
        forever.
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
      preemption_checkpoint: Stop every task at one checkpointed step on
        SIGTERM/SIGINT (`estimator_dist.guards.preemption`); False leaves the
        signals' default (the task dies at once).
      preemption_grace_secs: Seconds from SIGTERM/SIGINT to a forced exit,
        within which every task stops at one step and the chief saves it
        (`estimator_dist.guards.preemption`); keep it below the platform's grace
        period (Kubernetes' `terminationGracePeriodSeconds`, 30 by default).
      trace_every_steps: Write a Chrome trace (every op's start and duration,
        collectives included) of every this many global steps to
        `model_dir/traces/<task>/`, for chrome://tracing or Perfetto; None
        for none.
      num_train_examples: Examples in one training epoch, when known
        (`--num_train_examples`, or counted for the epoch flags); the model
        receives it as `params["num_train_examples"]` for `decay_epochs`.
      notes: How flags given in epochs or in Model Garden's terms became
        these settings, one line each (`estimator_dist.config.garden_flags`).
      run: Checkpoint, summary, thread and GPU settings; holds `model_dir`.
    """

    run: RunConfigOptions
    model_fn: str = "mnist_cnn"
    keras_model: Optional[str] = None
    estimator: Optional[str] = None
    input_fn: str = "digits"
    eval_input_fn: Optional[str] = None
    eval_params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    train_steps: int = 1000
    stop_threshold: Optional[float] = None
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
    preemption_checkpoint: bool = True
    preemption_grace_secs: float = 25.0
    trace_every_steps: Optional[int] = None
    warm_start_from: Optional[str] = None
    exports: Tuple[str, ...] = EXPORTS
    export_best_by: str = "loss"
    exports_to_keep: int = 3
    num_train_examples: Optional[int] = None
    notes: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.keras_model and self.estimator:
            raise UsageError(
                f"Give --keras_model or --estimator, not both; received "
                f"--keras_model={self.keras_model} and --estimator={self.estimator}."
            )
        unknown = sorted(set(self.exports) - set(EXPORTS))
        if unknown:
            raise UsageError(
                f"--export names {', '.join(unknown)}; valid: {', '.join(EXPORTS)} (or none)."
            )
        best_metric(self.export_best_by)
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
        for name in ("startup_timeout", "stall_timeout", "preemption_grace_secs"):
            if getattr(self, name) <= 0:
                raise UsageError(f"{name} must be positive, received {getattr(self, name)}.")
        if self.trace_every_steps is not None and self.trace_every_steps < 1:
            raise UsageError(
                f"trace_every_steps must be at least 1 or None, received {self.trace_every_steps}."
            )
        if self.stop_threshold is not None and not math.isfinite(self.stop_threshold):
            raise UsageError(
                f"--stop_threshold must be a number (an accuracy such as 0.9), received "
                f"{self.stop_threshold}."
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
        self._check_epoch_settings()
        for flag in ("params", "eval_params"):
            clashes = sorted(set(getattr(self, flag)) & {*_FLAG_PARAMS, *params_lib.JOB_KEYS})
            if clashes:
                raise UsageError(
                    f"--{flag} sets {', '.join(clashes)}, which have flags of their own; "
                    f"use --{clashes[0]} instead."
                )

    def _check_epoch_settings(self) -> None:
        examples = self.num_train_examples
        if examples is not None and examples < 1:
            raise UsageError(f"num_train_examples must be at least 1, received {examples}.")
        given = self.params.get("num_train_examples", examples)
        if given != examples and examples is not None:
            raise UsageError(
                f"--params=num_train_examples={given} and --num_train_examples={examples} "
                "disagree; give one of them."
            )
        if self.strategy.num_gpus != self.run.num_gpus:
            raise UsageError(
                f"num_gpus must be the same for the strategy ({self.strategy.num_gpus}) and "
                f"the sessions ({self.run.num_gpus}); build both from --num_gpus."
            )

    @property
    def model_params(self) -> dict:
        """The `params` dict handed to the model_fn and input_fn."""
        epoch = {} if self.num_train_examples is None else {EPOCH_EXAMPLES: self.num_train_examples}
        return {
            **epoch,
            **self.params,
            **{name: getattr(self, name) for name in _FLAG_PARAMS},
            ACCUMULATION_STEPS: self.gradient_accumulation_steps,
            MICRO_BATCHES: self.micro_batches,
        }

    @property
    def eval_model_params(self) -> dict:
        """The `params` dict handed to the evaluation input_fn: `eval_params` over `params`."""
        return {**self.model_params, **self.eval_params}

    @property
    def eval_input_name(self) -> str:
        """The name of the input_fn that feeds evaluation."""
        return self.eval_input_fn or self.input_fn

    def to_dict(self) -> dict:
        """Returns the configuration as JSON-serialisable data."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))


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


def check_batch(batch_size: int, micro_batches: int, num_replicas: int, workers: str) -> None:
    """Refuses a global batch that does not divide over the replicas and micro-batches.

    Args:
      batch_size: The global batch (`--batch_size`).
      micro_batches: Micro-batches per replica and step.
      num_replicas: Training replicas of the job.
      workers: Where the replicas come from, for the message (e.g. `2 worker(s)`).

    Raises:
      UsageError: naming the nearest batch sizes that divide.
    """
    if batch_size % num_replicas:
        lower = max(num_replicas, batch_size - batch_size % num_replicas)
        raise UsageError(
            f"--batch_size={batch_size} is the global batch and must divide evenly "
            f"over the {num_replicas} replicas ({workers}); use a "
            f"multiple of {num_replicas}, such as {lower} or {lower + num_replicas}."
        )
    check_micro_batches(batch_size, micro_batches, num_replicas)
