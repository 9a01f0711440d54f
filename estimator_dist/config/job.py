"""The job: everything one training job needs, the same on every task.

`JobConfig` is the frozen, validated configuration that the entry points
build from flags and that the driver, the pre-flight and the launcher
receive; library code never reads flags. Each of its settings is written
once, as a field carrying its flag. No TensorFlow import: the launcher and
the manifest check a job without it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Mapping, Optional, Tuple

from estimator_dist.base import params as params_lib
from estimator_dist.base.errors import UsageError
from estimator_dist.base.settings import check_bounds, setting
from estimator_dist.config.evaluation import EvaluationConfig
from estimator_dist.config.guards import GuardConfig
from estimator_dist.config.results import ResultsConfig
from run_config.names import EVAL_STRATEGY_NAMES
from run_config.options import RunConfigOptions, StrategyConfig

#: Global steps of a job whose --train_steps is not given and whose input repeats.
DEFAULT_TRAIN_STEPS = 1000
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
      train_steps: Global steps to train; every task stops there. None: where
        the training input ends when it ends by itself, else
        `DEFAULT_TRAIN_STEPS`.
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
      params: Extra model and input hyper-parameters (`--params`).
      strategy: Training distribution strategy, and the GPUs per worker.
      eval_strategy: Evaluation strategy name (`off`, `mirrored`, `one_device`).
      eval_throttle_secs: Least seconds between two evaluations.
      guards: The task's time bounds and preemption checkpoint.
      trace_every_steps: Write a Chrome trace (every op's start and duration,
        collectives included) of every this many global steps to
        `model_dir/traces/<task>/`, for chrome://tracing or Perfetto; None
        for none.
      num_train_examples: Examples in one training epoch, when known
        (`--num_train_examples`, or counted for the epoch flags); the model
        receives it as `params["num_train_examples"]` for `decay_epochs`.
      notes: How flags given in epochs or in Model Garden's terms became
        these settings, one line each (`estimator_dist.config.garden_flags`).
      run: Checkpoint, summary, thread and seed settings; its `model_dir` is
        the job's.
      results: `--model_dir` and `--storage`; a job needs a model_dir, given
        here or in `run`.

    Each setting is a field that carries its flag (`estimator_dist.base.settings`),
    nested `run` and `strategy` included: `estimator_dist.config.train_flags`
    generates the training flags from them and builds the job from the parsed
    flags, and `__post_init__` is where the job is validated.
    """

    run: RunConfigOptions = RunConfigOptions()
    results: ResultsConfig = ResultsConfig()
    model_fn: str = setting(
        "mnist_cnn",
        "model_fn: a registered name (mnist_cnn, resnet_cifar, dnn_classifier, "
        "linear_classifier, wide_and_deep) or package.module:function (also "
        "module:object.method). It may take any subset of features, labels, mode, params, "
        "config, as with tf.estimator. Default mnist_cnn.",
        kind="string",
        flag_default=None,
    )
    keras_model: Optional[str] = setting(
        None,
        "Instead of --model_fn: a function returning a "
        "compiled Keras model (registered name or package.module:function), "
        "converted with model_to_estimator.",
        kind="string",
    )
    estimator: Optional[str] = setting(
        None,
        "Instead of --model_fn: a function build(config[, params]) returning a "
        "tf.estimator.Estimator (or tf.compat.v1.estimator.*) built with the given RunConfig, "
        "such as a canned DNNClassifier (registered name or package.module:function).",
        kind="string",
    )
    warm_start_from: Optional[str] = setting(
        None,
        "Checkpoint or directory whose variables initialise the model when model_dir has no "
        "checkpoint yet (fine-tuning, or the same start for several runs).",
        kind="string",
    )
    exports: Tuple[str, ...] = setting(
        EXPORTS,
        "SavedModels the evaluator exports under model_dir/export/: latest (every "
        "evaluation), best (when --export_best_by improves); empty for none.",
        flag="export",
    )
    export_best_by: str = setting(
        "loss", "Evaluation metric deciding the best export: name, name:min or name:max."
    )
    exports_to_keep: int = setting(3, "Exports kept of each kind.", lower_bound=1)
    input_fn: str = setting(
        "digits",
        "input_fn: a registered name (digits, mnist, fashion_mnist, cifar10, cifar10_binary, "
        "tfds, tfrecord, csv, synthetic, tabular) or package.module:function. It may take any "
        "subset of mode, params, config, input_context and return a Dataset or (features, "
        "labels). A --data_dir holding CIFAR-10's binary release makes cifar10, or no "
        "--input_fn, read it with cifar10_binary.",
    )
    eval_input_fn: Optional[str] = setting(
        None,
        "Evaluation input_fn, as --input_fn; default: --input_fn called with mode EVAL.",
        kind="string",
    )
    eval_params: Mapping[str, Any] = setting(
        dataclasses.MISSING,
        "Parameters of the evaluation input_fn over --params: key=value,... or a JSON/YAML file.",
        flag_default="",
        convert=params_lib.parse_params_flag,
        default_factory=dict,
    )
    train_steps: Optional[int] = setting(
        None,
        "Global training steps; every task stops there. Default: where the training input "
        "ends, when it ends by itself (a Dataset of known size, numpy_input_fn with num_epochs), "
        f"else {DEFAULT_TRAIN_STEPS}.",
        kind="integer",
        lower_bound=1,
    )
    stop_threshold: Optional[float] = setting(
        None,
        "Model Garden's early stopping: once an evaluation's accuracy reaches this, every task "
        "stops at one step a little ahead, which the chief checkpoints, and the job ends "
        "(exit 0) with the final evaluation of that step.",
        kind="float",
    )
    eval_steps: Optional[int] = setting(
        None,
        "Evaluation batches; default: the whole evaluation input, or 100 batches (as "
        "tf.estimator.EvalSpec) when it repeats forever.",
        kind="integer",
        lower_bound=1,
    )
    batch_size: int = setting(
        64,
        "Global batch size over all replicas; must divide evenly by the number of replicas.",
        lower_bound=1,
    )
    gradient_accumulation_steps: int = setting(
        1,
        "Micro-batches of --batch_size whose mean gradient makes one update: gradients are "
        "summed locally and all-reduced once every this many steps. Multiplies the "
        "effective global batch by this number; --train_steps counts updates.",
        lower_bound=1,
    )
    micro_batches: int = setting(
        1,
        "Split each replica's batch into this many micro-batches computed one after another "
        "in the step, and apply their mean gradient once: the same update as the whole "
        "batch, with one micro-batch's activation memory. Must divide the per-replica batch.",
        lower_bound=1,
    )
    learning_rate: float = setting(0.001, "Learning rate.", lower_bound=0.0)
    data_dir: Optional[str] = setting(
        None,
        "Dataset directory: TFDS data_dir (default ~/tensorflow_datasets), or the folder of "
        "CIFAR-10's binary release (cifar-10-batches-bin).",
        kind="string",
    )
    params: Mapping[str, Any] = setting(
        dataclasses.MISSING,
        "Model/input hyper-parameters: key=value,... or a .json/.yaml file.",
        flag_default="",
        convert=params_lib.parse_params_flag,
        default_factory=dict,
    )
    strategy: StrategyConfig = StrategyConfig()
    eval_strategy: str = setting(
        "off", "Evaluation strategy.", flag="eval_distribution_strategy", enum=EVAL_STRATEGY_NAMES
    )
    evaluation: EvaluationConfig = EvaluationConfig()
    guards: GuardConfig = GuardConfig()
    trace_every_steps: Optional[int] = setting(
        None,
        "Write a Chrome trace of every this many global steps (each op's start and duration, "
        "collectives included) to model_dir/traces/<task>/, to see where a step's time goes.",
        kind="integer",
        lower_bound=1,
    )
    num_train_examples: Optional[int] = setting(
        None,
        "Examples in one training epoch, for the epoch flags and --params=decay_epochs; "
        "default: counted from the input (cifar10_binary, prepared TFDS datasets, synthetic).",
        kind="integer",
        lower_bound=1,
    )
    notes: Tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_bounds(self)
        self._place_results()
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
        if self.warm_start_from and self.keras_model:
            raise UsageError(
                f"--warm_start_from={self.warm_start_from} cannot be used with --keras_model: "
                "model_to_estimator starts from the Keras model's own weights. Load them in "
                "your build function with model.load_weights(...) instead."
            )
        if self.stop_threshold is not None and not math.isfinite(self.stop_threshold):
            raise UsageError(
                f"--stop_threshold must be a number (an accuracy such as 0.9), received "
                f"{self.stop_threshold}."
            )
        for name in ("gradient_accumulation_steps", "micro_batches"):
            value = getattr(self, name)
            if value > 1 and (self.keras_model or self.estimator):
                raise UsageError(
                    f"--{name}={value} needs a model_fn that builds its update with "
                    "model_fns.optimizers; --keras_model and --estimator build their "
                    f"optimizers inside TensorFlow. Use --model_fn, or --{name}=1."
                )
        check_micro_batches(self.batch_size, self.micro_batches, 1)
        if self.learning_rate <= 0:
            raise UsageError(f"learning_rate must be positive, received {self.learning_rate}.")
        self._check_params()

    def _place_results(self) -> None:
        """Makes `run.model_dir` and `results.model_dir` the job's one model_dir."""
        given = {self.run.model_dir, self.results.model_dir} - {None}
        if len(given) > 1:
            raise UsageError(
                f"two model_dirs for one job: {' and '.join(sorted(given))}; give one, as "
                "--model_dir (or RunConfigOptions.model_dir in code)."
            )
        if not given:
            raise UsageError(
                "no --model_dir: a job needs the directory of its checkpoints and results, "
                "reached by every task; pass e.g. --model_dir=/tmp/run1 (or a URL such as "
                "s3://bucket/run1)."
            )
        (model_dir,) = given
        object.__setattr__(self, "run", dataclasses.replace(self.run, model_dir=model_dir))
        results = dataclasses.replace(self.results, model_dir=model_dir)
        object.__setattr__(self, "results", results)

    @property
    def storage(self) -> Optional[str]:
        """`--storage`: the URL the job's results live at, or None."""
        return self.results.storage

    def working_in(self, model_dir: str) -> JobConfig:
        """This job as a task runs it in `model_dir`, its local copy of the job's results."""
        run = dataclasses.replace(self.run, model_dir=model_dir)
        results = dataclasses.replace(self.results, model_dir=model_dir)
        return dataclasses.replace(self, run=run, results=results)

    def _check_params(self) -> None:
        """Refuses `--params`/`--eval_params` keys that flags set, or that disagree with them."""
        examples = self.num_train_examples
        given = self.params.get(EPOCH_EXAMPLES, examples)
        if given != examples and examples is not None:
            raise UsageError(
                f"--params={EPOCH_EXAMPLES}={given} and --num_train_examples={examples} "
                "disagree; give one of them."
            )
        for flag in ("params", "eval_params"):
            clashes = sorted(set(getattr(self, flag)) & {*_FLAG_PARAMS, *params_lib.JOB_KEYS})
            if clashes:
                raise UsageError(
                    f"--{flag} sets {', '.join(clashes)}, which have flags of their own; "
                    f"use --{clashes[0]} instead."
                )

    @property
    def seed(self) -> Optional[int]:
        """`--seed`: the graph seed of every task (`run.tf_random_seed`), and the data order's."""
        return self.run.tf_random_seed

    @property
    def model_params(self) -> dict:
        """The `params` dict handed to the model_fn and input_fn."""
        epoch = {} if self.num_train_examples is None else {EPOCH_EXAMPLES: self.num_train_examples}
        return {
            **epoch,
            **self.params,
            **{name: getattr(self, name) for name in _FLAG_PARAMS},
            params_lib.ACCUMULATION_STEPS: self.gradient_accumulation_steps,
            params_lib.MICRO_BATCHES: self.micro_batches,
            params_lib.MIXED_PRECISION: self.run.precision.mixed_precision,
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
