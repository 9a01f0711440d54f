"""The flags of `estimator_dist.train`, and the `JobConfig` they make.

`define_flags` declares every training flag (docs/flags.md is generated from
them); `job_from_flags` turns parsed flags into the frozen, validated
`JobConfig` the driver receives, so library code never reads FLAGS. The
launcher, the check and the manifest parse the flags given after their `--` with
`estimator_dist.config.train_args`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from absl import flags

from estimator_dist.base.cpus import ONEDNN_SETTINGS
from estimator_dist.config import garden_flags
from run_config.names import COMMUNICATIONS, EVAL_STRATEGY_NAMES, STRATEGY_NAMES, WIRE_DTYPES

if TYPE_CHECKING:
    from estimator_dist.config.job import JobConfig

PROGRAM = "estimator_dist.train"


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines the training flags on `flag_values`."""
    f = flag_values
    flags.DEFINE_string(
        "model_fn",
        None,
        "model_fn: a registered name (mnist_cnn, resnet_cifar, dnn_classifier, "
        "linear_classifier, wide_and_deep) or package.module:function (also "
        "module:object.method). It may take any subset of features, labels, mode, params, "
        "config, as with tf.estimator. Default mnist_cnn.",
        flag_values=f,
    )
    flags.DEFINE_string(
        "keras_model",
        None,
        "Instead of --model_fn: a function returning a "
        "compiled Keras model (registered name or package.module:function), "
        "converted with model_to_estimator.",
        flag_values=f,
    )
    flags.DEFINE_string(
        "estimator",
        None,
        "Instead of --model_fn: a function build(config[, params]) returning a "
        "tf.estimator.Estimator (or tf.compat.v1.estimator.*) built with the given RunConfig, "
        "such as a canned DNNClassifier (registered name or package.module:function).",
        flag_values=f,
    )
    flags.DEFINE_string(
        "warm_start_from",
        None,
        "Checkpoint or directory whose variables initialise the model when model_dir has no "
        "checkpoint yet (fine-tuning, or the same start for several runs).",
        flag_values=f,
    )
    flags.DEFINE_list(
        "export",
        "latest,best",
        "SavedModels the evaluator exports under model_dir/export/: latest (every "
        "evaluation), best (when --export_best_by improves); empty for none.",
        flag_values=f,
    )
    flags.DEFINE_string(
        "export_best_by",
        "loss",
        "Evaluation metric deciding the best export: name, name:min or name:max.",
        flag_values=f,
    )
    flags.DEFINE_integer(
        "exports_to_keep", 3, "Exports kept of each kind.", lower_bound=1, flag_values=f
    )
    flags.DEFINE_string(
        "input_fn",
        "digits",
        "input_fn: a registered name (digits, mnist, fashion_mnist, cifar10, cifar10_binary, "
        "tfds, tfrecord, csv, synthetic, tabular) or package.module:function. It may take any "
        "subset of mode, params, config, input_context and return a Dataset or (features, "
        "labels). A --data_dir holding CIFAR-10's binary release makes cifar10, or no "
        "--input_fn, read it with cifar10_binary.",
        flag_values=f,
    )
    flags.DEFINE_string(
        "eval_input_fn",
        None,
        "Evaluation input_fn, as --input_fn; default: --input_fn called with mode EVAL.",
        flag_values=f,
    )
    flags.DEFINE_string(
        "eval_params",
        "",
        "Parameters of the evaluation input_fn over --params: key=value,... or a JSON/YAML file.",
        flag_values=f,
    )
    flags.DEFINE_string(
        "model_dir",
        None,
        "Directory for checkpoints and results, shared by every task.",
        flag_values=f,
    )
    flags.DEFINE_integer(
        "train_steps", 1000, "Global training steps.", lower_bound=1, flag_values=f
    )
    flags.DEFINE_integer(
        "eval_steps",
        None,
        "Evaluation batches; default: the whole evaluation input, or 100 batches (as "
        "tf.estimator.EvalSpec) when it repeats forever.",
        lower_bound=1,
        flag_values=f,
    )
    flags.DEFINE_integer(
        "batch_size",
        64,
        "Global batch size over all replicas; must divide evenly by the number of replicas.",
        lower_bound=1,
        flag_values=f,
    )
    flags.DEFINE_integer(
        "gradient_accumulation_steps",
        1,
        "Micro-batches of --batch_size whose mean gradient makes one update: gradients are "
        "summed locally and all-reduced once every this many steps. Multiplies the "
        "effective global batch by this number; --train_steps counts updates.",
        lower_bound=1,
        flag_values=f,
    )
    flags.DEFINE_integer(
        "micro_batches",
        1,
        "Split each replica's batch into this many micro-batches computed one after another "
        "in the step, and apply their mean gradient once: the same update as the whole "
        "batch, with one micro-batch's activation memory. Must divide the per-replica batch.",
        lower_bound=1,
        flag_values=f,
    )
    flags.DEFINE_float("learning_rate", 0.001, "Learning rate.", lower_bound=0.0, flag_values=f)
    flags.DEFINE_enum(
        "distribution_strategy",
        STRATEGY_NAMES[0],
        STRATEGY_NAMES,
        "Training strategy.",
        case_sensitive=False,
        flag_values=f,
    )
    flags.DEFINE_enum(
        "communication",
        "AUTO",
        COMMUNICATIONS,
        "Collective implementation of "
        "multi_worker_mirrored; NCCL needs GPUs, RING runs anywhere, AUTO lets "
        "TensorFlow choose.",
        case_sensitive=False,
        flag_values=f,
    )
    flags.DEFINE_float(
        "collective_timeout",
        0,
        "Seconds a collective operation may wait for its peers before the task fails "
        "(exit 150); 0 (default) waits forever and leaves partitions to --stall_timeout. "
        "TensorFlow 2.15 keeps one thread per collective for this long, so threads grow "
        "with collectives per second x timeout.",
        lower_bound=0.0,
        flag_values=f,
    )
    flags.DEFINE_integer(
        "bytes_per_pack",
        0,
        "All-reduce gradients in packs of about this many bytes, so that early packs can "
        "start during the backward pass; 0 (default): one all-reduce of all gradients.",
        lower_bound=0,
        flag_values=f,
    )
    flags.DEFINE_enum(
        "gradient_wire_dtype",
        "float32",
        WIRE_DTYPES,
        "Dtype gradients are all-reduced in: bfloat16 or float16 halve the bytes on the "
        "network and round each gradient value to 8 or 11 significant bits; the weights "
        "and the optimizer stay float32.",
        case_sensitive=False,
        flag_values=f,
    )
    flags.DEFINE_float(
        "startup_timeout",
        600,
        "Seconds for the cluster to assemble and run the first step before a training "
        "task fails (exit 151), naming the peers it cannot reach.",
        lower_bound=1.0,
        flag_values=f,
    )
    flags.DEFINE_float(
        "stall_timeout",
        120,
        "Seconds the global step may stay the same before a training task fails "
        "(exit 152); on the evaluator, seconds without a new checkpoint while the chief "
        "is unreachable.",
        lower_bound=1.0,
        flag_values=f,
    )
    flags.DEFINE_boolean(
        "preemption_checkpoint",
        True,
        "On SIGTERM or SIGINT, stop every task at one global step and checkpoint it (exit "
        "155); --nopreemption_checkpoint leaves the signals' default.",
        flag_values=f,
    )
    flags.DEFINE_float(
        "preemption_grace_secs",
        25,
        "On SIGTERM or SIGINT every task stops at one global step, the chief checkpoints it "
        "and all exit 155 (retryable, no step lost); this many seconds after the signal a "
        "task exits even if the job could not stop. Keep it below the platform's grace "
        "period (Kubernetes terminationGracePeriodSeconds, default 30).",
        lower_bound=1.0,
        flag_values=f,
    )
    flags.DEFINE_integer(
        "trace_every_steps",
        None,
        "Write a Chrome trace of every this many global steps (each op's start and duration, "
        "collectives included) to model_dir/traces/<task>/, to see where a step's time goes.",
        lower_bound=1,
        flag_values=f,
    )
    flags.DEFINE_enum(
        "eval_distribution_strategy",
        "off",
        EVAL_STRATEGY_NAMES,
        "Evaluation strategy.",
        case_sensitive=False,
        flag_values=f,
    )
    flags.DEFINE_integer(
        "save_checkpoints_steps",
        100,
        "Checkpoint every this many steps.",
        lower_bound=1,
        flag_values=f,
    )
    flags.DEFINE_integer(
        "keep_checkpoint_max", 5, "Checkpoints to keep.", lower_bound=1, flag_values=f
    )
    flags.DEFINE_integer(
        "save_summary_steps", 100, "Summaries every this many steps.", lower_bound=1, flag_values=f
    )
    flags.DEFINE_integer(
        "log_step_count_steps",
        100,
        "Log loss and speed every this many steps.",
        lower_bound=1,
        flag_values=f,
    )
    flags.DEFINE_boolean(
        "verbose",
        False,
        "Print everything TensorFlow and absl log on the console too (deprecation warnings, "
        "start-up lines, Estimator's INFO lines). By default a single process shows a progress "
        "line every --log_step_count_steps steps, warnings, errors and the metrics, and writes "
        "the full log to model_dir/logs/<task>.log; under the launcher, pass --verbose to the "
        "launcher; a task of a cluster platform (TF_CONFIG set) prints everything anyway.",
        flag_values=f,
    )
    flags.DEFINE_integer(
        "intra_op_threads",
        0,
        "Threads within an op; 0: TensorFlow chooses.",
        lower_bound=0,
        flag_values=f,
    )
    flags.DEFINE_integer(
        "inter_op_threads",
        0,
        "Ops run in parallel; 0: TensorFlow chooses.",
        lower_bound=0,
        flag_values=f,
    )
    flags.DEFINE_enum(
        "onednn",
        "auto",
        ONEDNN_SETTINGS,
        "oneDNN kernels (TF_ENABLE_ONEDNN_OPTS): on, off, or auto, which keeps the "
        "environment's TF_ENABLE_ONEDNN_OPTS and otherwise turns them on. TensorFlow 2.15 "
        "leaves them off on CPUs without AVX-512 VNNI/BF16 or AMX, where they train "
        "mnist_cnn 3.1x and ResNet-20 1.9x faster.",
        case_sensitive=False,
        flag_values=f,
    )
    flags.DEFINE_integer(
        "eval_throttle_secs", 5, "Least seconds between evaluations.", lower_bound=0, flag_values=f
    )
    flags.DEFINE_string(
        "data_dir",
        None,
        "Dataset directory: TFDS data_dir (default ~/tensorflow_datasets), or the folder of "
        "CIFAR-10's binary release (cifar-10-batches-bin).",
        flag_values=f,
    )
    flags.DEFINE_integer("seed", 0, "Seed for initial weights and data order.", flag_values=f)
    flags.DEFINE_string(
        "params",
        "",
        "Model/input hyper-parameters: key=value,... or a .json/.yaml file.",
        flag_values=f,
    )
    flags.mark_flag_as_required("model_dir", flag_values=f)
    flags.mark_flags_as_mutual_exclusive(["model_fn", "keras_model", "estimator"], flag_values=f)
    garden_flags.define_flags(f)


def job_from_flags(f: flags.FlagValues = flags.FLAGS) -> JobConfig:
    """Turns parsed flags into a validated `JobConfig`.

    Raises:
      UsageError: if the values do not make a valid job.
    """
    from estimator_dist.base.errors import UsageError
    from estimator_dist.base.params import parse_params_flag
    from estimator_dist.config.job import JobConfig
    from run_config.run_config import RunConfigOptions
    from run_config.strategies import StrategyConfig

    try:
        garden = garden_flags.resolve(f, parse_params_flag(f.params))
        return JobConfig(
            run=RunConfigOptions(
                model_dir=f.model_dir,
                save_checkpoints_steps=garden.save_checkpoints_steps,
                keep_checkpoint_max=f.keep_checkpoint_max,
                save_summary_steps=f.save_summary_steps,
                log_step_count_steps=f.log_step_count_steps,
                intra_op_threads=f.intra_op_threads,
                inter_op_threads=f.inter_op_threads,
                tf_random_seed=f.seed,
                num_gpus=garden.num_gpus,
            ),
            model_fn=garden.model_fn,
            keras_model=f.keras_model,
            estimator=f.estimator,
            warm_start_from=f.warm_start_from,
            exports=tuple(f.export),
            export_best_by=f.export_best_by,
            exports_to_keep=f.exports_to_keep,
            input_fn=garden.input_fn,
            eval_input_fn=garden.eval_input_fn,
            eval_params=parse_params_flag(f.eval_params),
            train_steps=garden.train_steps,
            stop_threshold=f.stop_threshold,
            eval_steps=f.eval_steps,
            batch_size=f.batch_size,
            learning_rate=f.learning_rate,
            data_dir=f.data_dir,
            seed=f.seed,
            params=garden.params,
            num_train_examples=garden.num_train_examples,
            notes=garden.notes,
            gradient_accumulation_steps=f.gradient_accumulation_steps,
            micro_batches=f.micro_batches,
            strategy=StrategyConfig(
                f.distribution_strategy,
                garden.communication,
                f.collective_timeout or None,
                bytes_per_pack=f.bytes_per_pack,
                gradient_wire_dtype=f.gradient_wire_dtype,
                num_gpus=garden.num_gpus,
            ),
            eval_strategy=f.eval_distribution_strategy,
            eval_throttle_secs=f.eval_throttle_secs,
            startup_timeout=f.startup_timeout,
            stall_timeout=f.stall_timeout,
            preemption_checkpoint=f.preemption_checkpoint,
            preemption_grace_secs=f.preemption_grace_secs,
            trace_every_steps=f.trace_every_steps,
        )
    except UsageError:
        raise
    except ValueError as error:
        raise UsageError(str(error)) from None
