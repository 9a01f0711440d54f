"""TF Model Garden's flag names, and training counted in epochs.

Model Garden's Estimator ResNet (`official/r1/resnet`) is started on each
machine with flags such as `--data_dir cifar-10-batches-bin/
--distribution_strategy multi_worker_mirrored --num_gpus 8 --train_epochs 182
--epochs_between_evals 10`. `estimator_dist.train` takes that command:

* the flags that mean the same here are accepted: `--num_gpus` (GPUs per
  worker, `run_config.gpus`), `--all_reduce_alg` (`ring`/`nccl`, our
  `--communication`), `--resnet_size` (`resnet_cifar`'s `depth`), and the
  aliases `--max_train_steps` (`--train_steps`),
  `--inter_op_parallelism_threads` and `--intra_op_parallelism_threads`;
  `--distribution_strategy`, `--batch_size` (global), `--model_dir` and
  `--data_dir` are our own flags already; `--dtype` (`fp32`, `bf16`,
  `fp16`) is `--mixed_precision` (`off`, `bfloat16`, `float16`);
* epochs become steps by the package's one rule
  (`model_fns.learning_rates.epochs_to_steps`) and each mapping is logged:
  `--train_epochs` (stopping at `--train_steps` if that comes first, as
  Model Garden's `--max_train_steps` does), and `--save_checkpoints_epochs`
  or Model Garden's `--epochs_between_evals`, a checkpoint (which the
  evaluator evaluates) every that many epochs;
* a `--data_dir` holding CIFAR-10's binary release is read with
  `cifar10_binary` when `--input_fn` is `cifar10` or not given;
* Model Garden's flags that do not apply are refused, each with a message
  naming what to use instead (`REFUSED`).

The examples in an epoch come from `--num_train_examples`, or are counted
from the input (the binary release, a prepared TFDS dataset, `synthetic`).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Dict, List, Mapping, Optional, Tuple

from absl import flags, logging

from estimator_dist.base.errors import UsageError
from estimator_dist.base.params import from_params
from estimator_dist.report.console import SUPERVISED_ENV

#: Model Garden's flags that have no equivalent meaning here, with what to use instead.
REFUSED: Mapping[str, str] = {
    "clean": "estimator_dist resumes from model_dir's checkpoints; to start afresh, give a "
    "new --model_dir or delete the old one yourself",
    "hooks": "the progress line (every --log_step_count_steps) and --trace_every_steps take "
    "the place of Model Garden's logging and profiler hooks",
    "export_dir": "--export writes SavedModels under model_dir/export/",
    "use_synthetic_data": "--input_fn=synthetic --params=image_shape=32x32x3",
    "loss_scale": "--mixed_precision=float16 scales the loss dynamically",
    "fp16_implementation": "--mixed_precision=float16 is the graph rewrite, with dynamic loss "
    "scaling (Keras models: the mixed_float16 policy)",
    "num_packs": "--bytes_per_pack packs the gradients of each all-reduce",
    "tf_gpu_thread_mode": "TensorFlow's GPU threads are left at their defaults",
    "per_gpu_thread_count": "TensorFlow's GPU threads are left at their defaults",
    "datasets_num_private_threads": "tf.data uses TensorFlow's default thread pool",
    "tf_data_experimental_slack": "tf.data's options are the input functions' own",
    "worker_hosts": "each task reads its cluster from TF_CONFIG; on one machine, "
    "python -m estimator_dist.launch --num_workers=N starts the cluster for you",
    "task_index": "each task reads its index from TF_CONFIG (task.index)",
    "resnet_version": "resnet_cifar is ResNet v1, Model Garden's default",
    "data_format": "resnet_cifar is channels_last",
    "fine_tune": "--warm_start_from=CHECKPOINT initialises every variable and trains them all",
    "pretrained_model_checkpoint_path": "--warm_start_from=CHECKPOINT (every variable, not "
    "all but the dense layer)",
    "eval_only": "there is no evaluation-only run; predict with an export "
    "(python -m estimator_dist.predict)",
    "image_bytes_as_serving_input": "exports take the image tensor",
    "use_train_and_evaluate": "every job runs tf.estimator.train_and_evaluate; drop the flag",
    "enable_lars": "resnet_cifar trains with momentum SGD only",
    "label_smoothing": "resnet_cifar has no label smoothing",
    "weight_decay": "--params=weight_decay=W (resnet_cifar adds W x sum(w^2); Model Garden's "
    "CIFAR model W x sum(w^2) / 2)",
}
_BOOLEANS = frozenset(
    {
        "clean",
        "use_synthetic_data",
        "tf_data_experimental_slack",
        "fine_tune",
        "eval_only",
        "image_bytes_as_serving_input",
        "use_train_and_evaluate",
        "enable_lars",
    }
)
#: Model Garden's flags that are another name of one of ours.
ALIASES = {
    "max_train_steps": "train_steps",
    "inter_op_parallelism_threads": "inter_op_threads",
    "intra_op_parallelism_threads": "intra_op_threads",
}
#: `--all_reduce_alg` values, and the `--communication` each means.
ALL_REDUCE_ALGS = {"ring": "RING", "nccl": "NCCL"}
#: `--dtype` values, and the `--mixed_precision` each means.
DTYPES = {"fp32": "off", "bf16": "bfloat16", "fp16": "float16"}
#: The flags that count in epochs.
EPOCH_FLAGS = ("train_epochs", "save_checkpoints_epochs", "epochs_between_evals")


def define_flags(flag_values: flags.FlagValues) -> None:
    """Defines Model Garden's flags and the epoch flags; call it after the training flags.

    Model Garden's flags that are settings of the job (`--num_gpus`,
    `--num_train_examples`, `--stop_threshold`) are defined with the job's
    (`estimator_dist.config.job`); these are the ones mapped onto them.
    """
    f = flag_values
    flags.DEFINE_float(
        "train_epochs",
        None,
        "Train this many epochs of --num_train_examples: ceil(epochs x examples / "
        "(--batch_size x --gradient_accumulation_steps)) steps, logged; with --train_steps "
        "too, training stops at whichever comes first.",
        lower_bound=0.0,
        flag_values=f,
    )
    flags.DEFINE_float(
        "save_checkpoints_epochs",
        None,
        "Checkpoint every this many epochs (mapped to --save_checkpoints_steps and logged); "
        "the evaluator evaluates each checkpoint.",
        lower_bound=0.0,
        flag_values=f,
    )
    flags.DEFINE_float(
        "epochs_between_evals",
        None,
        "Model Garden's flag: evaluate every this many epochs, which here means a checkpoint "
        "every this many epochs (--save_checkpoints_epochs), each evaluated by the evaluator.",
        lower_bound=0.0,
        flag_values=f,
    )
    flags.DEFINE_string(
        "all_reduce_alg",
        None,
        "Model Garden's name for --communication: ring or nccl.",
        flag_values=f,
    )
    flags.DEFINE_integer(
        "resnet_size",
        None,
        "Model Garden's ResNet depth (6n+2: 20, 32, 56, ...): --model_fn=resnet_cifar "
        "with --params=depth=N.",
        lower_bound=8,
        flag_values=f,
    )
    flags.DEFINE_enum(
        "dtype",
        None,
        list(DTYPES),
        "Model Garden's precision: fp32, bf16 or fp16, our --mixed_precision off, bfloat16 or "
        "float16 (variables stay float32).",
        flag_values=f,
    )
    for alias, original in ALIASES.items():
        flags.DEFINE_alias(alias, original, flag_values=f)
    for name, instead in REFUSED.items():
        define = flags.DEFINE_boolean if name in _BOOLEANS else flags.DEFINE_string
        define(name, None, f"Model Garden's flag, refused here: {instead}.", flag_values=f)


@dataclasses.dataclass(frozen=True)
class Resolved:
    """The job settings Model Garden's flags and the epoch flags come to.

    Each attribute but `notes` is named after the training flag whose value
    it replaces (`settings()`).

    Attributes:
      model_fn: The model_fn name (`resnet_cifar` with `--resnet_size`).
      input_fn: The training input, `cifar10_binary` for the binary release.
      eval_input_fn: The evaluation input, likewise, or None.
      params: `--params`, with `depth` from `--resnet_size`.
      train_steps: The last step.
      save_checkpoints_steps: The checkpoint interval.
      communication: RING, NCCL or AUTO.
      mixed_precision: `--mixed_precision`, or `--dtype` in its terms.
      num_train_examples: Examples in an epoch, when known.
      notes: One line for each mapping made, as logged.
    """

    model_fn: str
    input_fn: str
    eval_input_fn: Optional[str]
    params: Dict[str, Any]
    train_steps: int
    save_checkpoints_steps: int
    communication: str
    mixed_precision: str
    num_train_examples: Optional[int]
    notes: Tuple[str, ...]

    def settings(self) -> Dict[str, Any]:
        """The training flags' values these replace, by flag name."""
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if field.name != "notes"
        }


def resolve(f: flags.FlagValues, params: Dict[str, Any], read_data: bool = True) -> Resolved:
    """Turns Model Garden's flags and the epoch flags into the job's settings; logs each mapping.

    Args:
      f: Parsed training flags.
      params: `--params`, parsed.
      read_data: Whether to look at the data: for CIFAR-10's binary release
        in `--data_dir`, and to count the examples of an epoch. Without, the
        inputs stay as given and the epoch flags are only checked, for each
        task to map when it reads its data (a manifest's data is in the
        cluster).

    Raises:
      UsageError: for a refused flag, conflicting flags, or epochs without a
        known number of training examples.
    """
    refused = [name for name in REFUSED if f[name].present]
    if refused:
        lines = [f"--{name} is Model Garden's, not used here: {REFUSED[name]}" for name in refused]
        raise UsageError("; ".join(lines) + ".")
    params = dict(params)
    notes: List[str] = []
    model_fn = _model(f, params, notes)
    _check_epochs(f)
    if read_data:
        input_fn, eval_input_fn = _inputs(f, notes)
        examples = _train_examples(f, input_fn, {**params, "data_dir": f.data_dir})
        train_steps, checkpoint_steps = _epochs(f, examples, notes)
    else:
        input_fn, eval_input_fn = f.input_fn, f.eval_input_fn
        examples = f.num_train_examples
        train_steps, checkpoint_steps = f.train_steps, f.save_checkpoints_steps
    resolved = Resolved(
        model_fn=model_fn,
        input_fn=input_fn,
        eval_input_fn=eval_input_fn,
        params=params,
        train_steps=train_steps,
        save_checkpoints_steps=checkpoint_steps,
        communication=_communication(f),
        mixed_precision=_mixed_precision(f, notes),
        num_train_examples=examples,
        notes=tuple(notes),
    )
    # Under the launcher, which logged them once for the console, they go to the task's log.
    prefix = "" if os.environ.get(SUPERVISED_ENV) else "estimator_dist: "
    for note in notes:
        logging.info("%s%s", prefix, note)
    return resolved


def _model(f: flags.FlagValues, params: Dict[str, Any], notes: List[str]) -> str:
    """The model_fn; `--resnet_size` sets resnet_cifar's depth."""
    model_fn = f.model_fn or "mnist_cnn"
    if f.resnet_size is None:
        return model_fn
    if f.keras_model or f.estimator or (f.model_fn and f.model_fn != "resnet_cifar"):
        other = f.keras_model or f.estimator or f.model_fn
        raise UsageError(
            f"--resnet_size={f.resnet_size} is the depth of resnet_cifar, but the model is "
            f"{other}. Drop --resnet_size, or use --model_fn=resnet_cifar."
        )
    if params.get("depth", f.resnet_size) != f.resnet_size:
        raise UsageError(
            f"--resnet_size={f.resnet_size} and --params=depth={params['depth']} disagree; "
            "give one of them."
        )
    params["depth"] = f.resnet_size
    notes.append(
        f"--resnet_size={f.resnet_size} is --model_fn=resnet_cifar --params=depth={f.resnet_size}"
    )
    return "resnet_cifar"


def _inputs(f: flags.FlagValues, notes: List[str]) -> Tuple[str, Optional[str]]:
    """The input functions, reading CIFAR-10's binary release where `cifar10` would not."""
    from input_fns import cifar10_binary

    chosen = [f.input_fn, f.eval_input_fn]
    default = not f["input_fn"].present
    if (default or "cifar10" in chosen) and cifar10_binary.holds_layout(f.data_dir):
        if default or f.input_fn == "cifar10":
            chosen[0] = cifar10_binary.NAME
        if f.eval_input_fn == "cifar10":
            chosen[1] = cifar10_binary.NAME
        given = "no --input_fn" if default else "--input_fn=cifar10"
        if not default and f.input_fn != "cifar10":
            given = "--eval_input_fn=cifar10"
        notes.append(
            f"--data_dir={f.data_dir} holds CIFAR-10's binary release: {given} reads it with "
            f"--input_fn={cifar10_binary.NAME} (not a prepared TFDS dataset)"
        )
    return chosen[0], chosen[1]


def _communication(f: flags.FlagValues) -> str:
    """`--communication`, or `--all_reduce_alg` in Model Garden's terms."""
    if f.all_reduce_alg is None:
        return f.communication
    meant = ALL_REDUCE_ALGS.get(f.all_reduce_alg.lower())
    if meant is None:
        raise UsageError(
            f"--all_reduce_alg={f.all_reduce_alg}: valid here are {', '.join(ALL_REDUCE_ALGS)}, "
            "the collectives of multi_worker_mirrored (MirroredStrategy's all-reduce on one "
            "machine is TensorFlow's choice). Or use --communication=RING|NCCL|AUTO."
        )
    if f["communication"].present and f.communication.upper() != meant:
        raise UsageError(
            f"--all_reduce_alg={f.all_reduce_alg} and --communication={f.communication} "
            "disagree; give one of them."
        )
    return meant


def _mixed_precision(f: flags.FlagValues, notes: List[str]) -> str:
    """`--mixed_precision`, or `--dtype` in Model Garden's terms."""
    if f.dtype is None:
        return f.mixed_precision
    meant = DTYPES[f.dtype]
    if f["mixed_precision"].present and f.mixed_precision.lower() != meant:
        raise UsageError(
            f"--dtype={f.dtype} means --mixed_precision={meant}, but --mixed_precision="
            f"{f.mixed_precision} was given too; give one of them."
        )
    notes.append(f"--dtype={f.dtype} is --mixed_precision={meant}")
    return meant


def _train_examples(f: flags.FlagValues, input_fn: str, params: Mapping[str, Any]) -> Optional[int]:
    """Examples in an epoch, when an epoch flag or `decay_epochs` needs them, or given."""
    if f.num_train_examples is not None:
        return f.num_train_examples
    needed = [f"--{name}" for name in EPOCH_FLAGS if getattr(f, name) is not None]
    if params.get("decay_epochs") not in (None, ""):
        needed.append("--params=decay_epochs")
    if not needed:
        return None
    counted = count_train_examples(input_fn, params)
    if counted is None and not needed[0].startswith("--params"):
        raise UsageError(
            f"{needed[0]} needs the number of training examples, which input_fn {input_fn} "
            "cannot count; pass --num_train_examples=N."
        )
    return counted


def count_train_examples(input_fn: str, params: Mapping[str, Any]) -> Optional[int]:
    """Examples in one epoch of a registered input, or None when it cannot tell.

    Raises:
      UsageError: if its data is missing (as its pre-flight would).
    """
    from input_fns import cifar10_binary, digits, synthetic, tfds_input

    if input_fn == cifar10_binary.NAME:
        return cifar10_binary.count_examples(params.get("data_dir"))
    if input_fn == "synthetic":
        return from_params(synthetic.SyntheticParams, params, "synthetic", False).num_examples
    datasets = {"digits": digits.NAME, "tfds": params.get("dataset")}
    dataset = datasets.get(input_fn, input_fn)
    if input_fn not in ("digits", "mnist", "fashion_mnist", "cifar10", "tfds") or not dataset:
        return None
    if input_fn == "digits":
        digits.prepare(params)
    builder = tfds_input.get_prepared_builder(dataset, params.get("data_dir"))
    return builder.info.splits[params.get("split", "train")].num_examples


def _check_epochs(f: flags.FlagValues) -> None:
    """Refuses epoch flags of 0, and checkpoint intervals given twice that disagree."""
    for name in EPOCH_FLAGS:
        if getattr(f, name) is not None and getattr(f, name) <= 0:
            raise UsageError(f"--{name} must be more than 0, received {getattr(f, name)}.")
    given = {n: getattr(f, n) for n in EPOCH_FLAGS[1:] if getattr(f, n) is not None}
    if given and (len(set(given.values())) > 1 or f["save_checkpoints_steps"].present):
        named = [f"--{n}={v:g}" for n, v in given.items()]
        if f["save_checkpoints_steps"].present:
            named.append(f"--save_checkpoints_steps={f.save_checkpoints_steps}")
        raise UsageError(f"{' and '.join(named)} disagree; give one of them.")


def _epochs(f: flags.FlagValues, examples: Optional[int], notes: List[str]) -> Tuple[int, int]:
    """`--train_steps` and `--save_checkpoints_steps`, from the epoch flags where given."""
    from model_fns.learning_rates import epochs_to_steps

    per_step = f.batch_size * f.gradient_accumulation_steps
    unit = f"{per_step:,} examples" + (
        f" ({f.batch_size} x {f.gradient_accumulation_steps} accumulated)"
        if f.gradient_accumulation_steps > 1
        else ""
    )
    train_steps = f.train_steps
    if f.train_epochs is not None:
        steps = epochs_to_steps(f.train_epochs, examples, per_step)
        train_steps = min(steps, f.train_steps) if f["train_steps"].present else steps
        cap = f", stopping at --train_steps={f.train_steps}" if train_steps < steps else ""
        notes.append(
            f"--train_epochs={f.train_epochs:g} is {steps} steps of {unit} over {examples:,} "
            f"training examples{cap}"
        )
    given = {n: getattr(f, n) for n in EPOCH_FLAGS[1:] if getattr(f, n) is not None}
    if not given:
        return train_steps, f.save_checkpoints_steps
    name, epochs = next(iter(given.items()))
    steps = epochs_to_steps(epochs, examples, per_step)
    notes.append(
        f"--{name}={epochs:g} is a checkpoint every {steps} steps of {unit} over "
        f"{examples:,} training examples, each one evaluated"
    )
    return train_steps, steps
