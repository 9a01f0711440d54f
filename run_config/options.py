"""What a RunConfig and a strategy are built from: validated options, no TensorFlow import.

`RunConfigOptions` (checkpoints, summaries, threads, seed, and the
`PrecisionConfig` of its sessions) and `StrategyConfig`
(the strategy, its collectives, the GPUs per worker) are frozen and checked on
construction. Each of their settings is written once, as a field that carries
its command-line flag (`estimator_dist.base.settings`), so the training flags
are generated from them. `run_config.run_config` and `run_config.strategies`
build the TensorFlow objects; `plan_strategy` and `check_cluster_fits` decide
what fits before any of it is imported, as `estimator_dist.manifest` does.

>>> StrategyConfig("multi_worker_mirrored", communication="ring").communication
'RING'
>>> plan_strategy("multi_worker_mirrored", 4, distributed=False)
('mirrored', ('/gpu:0', '/gpu:1', '/gpu:2', '/gpu:3'))
>>> plan_strategy("multi_worker_mirrored", 4, distributed=True)
('multi_worker_mirrored', ())
>>> PrecisionConfig("BFloat16").mixed_precision
'bfloat16'
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from estimator_dist.base.errors import UsageError
from estimator_dist.base.settings import check_bounds, none_for_zero, setting
from estimator_dist.cluster.tf_config import ClusterConfig
from estimator_dist.hardware.precision import MIXED_PRECISIONS
from run_config.names import (
    CENTRAL_STORAGE,
    COMMUNICATIONS,
    MIRRORED,
    MULTI_WORKER_MIRRORED,
    OFF,
    ONE_DEVICE,
    PARAMETER_SERVER,
    STRATEGY_NAMES,
    WIRE_DTYPES,
)


def choice(kind: str, value: str, valid: Tuple[str, ...], fix: str) -> UsageError:
    """The error for `value`, which is not one of `valid`.

    >>> str(choice("collective", "X", ("RING",), "Use RING."))
    "Unknown collective 'X'; valid values are RING. Use RING."
    """
    return UsageError(f"Unknown {kind} {value!r}; valid values are {', '.join(valid)}. {fix}")


def _none_for_every_gpu(count: Optional[int]) -> Optional[int]:
    return None if count in (None, -1) else count


@dataclasses.dataclass(frozen=True)
class PrecisionConfig:
    """The precision sessions compute in (`estimator_dist.hardware.precision`).

    One setting, nested in `RunConfigOptions` (so in the training flags) and
    in a script's settings (`estimator_dist.programs.config.ScriptConfig`).

    Attributes:
      mixed_precision: `off` (the default: float32), `bfloat16` (oneDNN's
        bfloat16 rewrite of convolutions and matmuls on a CPU with AVX-512 BF16
        or AMX), `float16` (the CUDA rewrite with dynamic loss scaling, on GPUs
        of compute capability 7.0 or more) or `auto` (the first of the two the
        machine has, else off); any case. Variables, checkpoints, exports and
        the all-reduce stay float32.
    """

    mixed_precision: str = setting(
        "off",
        "Compute in 16 bits where the hardware does it fast; variables, checkpoints, exports "
        "and the all-reduce stay float32. bfloat16: oneDNN's bfloat16 rewrite of every training "
        "and evaluation session (CPUs with AVX-512 BF16 or AMX; exit 2 elsewhere); float16: "
        "the CUDA rewrite with dynamic loss scaling (GPUs of compute capability 7.0+; exit 2 "
        "elsewhere); auto: float16 on such GPUs, else bfloat16 on such CPUs, else off. The "
        "run record says what ran and why.",
        enum=MIXED_PRECISIONS,
    )

    def __post_init__(self) -> None:
        value = str(self.mixed_precision).lower()
        if value not in MIXED_PRECISIONS:
            raise choice(
                "mixed precision",
                self.mixed_precision,
                MIXED_PRECISIONS,
                "Set --mixed_precision to one of them (any case).",
            )
        object.__setattr__(self, "mixed_precision", value)


@dataclasses.dataclass(frozen=True)
class RunConfigOptions:
    """Everything in a RunConfig except the strategies and the GPUs.

    Attributes:
      model_dir: Where checkpoints, summaries and results go; shared by every
        task of a cluster. None lets the Estimator pick a temporary directory,
        as `tf.estimator.RunConfig` does. Not a flag here: the program whose
        flags are generated from these options declares its `--model_dir`.
      save_checkpoints_steps: Save a checkpoint every this many steps.
      save_checkpoints_secs: Save every this many seconds instead; refused with
        collective strategies. Give at most one of the two.
      keep_checkpoint_max: Checkpoints kept (older ones are deleted).
      save_summary_steps: Write summaries every this many steps.
      log_step_count_steps: Log loss and steps/s every this many steps.
      intra_op_threads: Threads inside one op; 0 lets TensorFlow choose.
      inter_op_threads: Ops run in parallel; 0 lets TensorFlow choose.
      tf_random_seed: Graph-level seed, so every task initialises alike;
        `--seed`, which also orders the data.
      precision: The precision of every session (`--mixed_precision`).
    """

    model_dir: Optional[str] = None
    save_checkpoints_steps: Optional[int] = setting(
        100, "Checkpoint every this many steps.", lower_bound=1
    )
    save_checkpoints_secs: Optional[int] = None
    keep_checkpoint_max: int = setting(5, "Checkpoints to keep.", lower_bound=1)
    save_summary_steps: int = setting(100, "Summaries every this many steps.", lower_bound=1)
    log_step_count_steps: int = setting(
        100, "Log loss and speed every this many steps.", lower_bound=1
    )
    intra_op_threads: int = setting(
        0, "Threads within an op; 0: TensorFlow chooses.", lower_bound=0
    )
    inter_op_threads: int = setting(0, "Ops run in parallel; 0: TensorFlow chooses.", lower_bound=0)
    tf_random_seed: Optional[int] = setting(
        0, "Seed for initial weights and data order.", flag="seed"
    )
    precision: PrecisionConfig = PrecisionConfig()

    def __post_init__(self) -> None:
        if self.model_dir is not None and not self.model_dir:
            raise UsageError(
                f"model_dir must be a non-empty path or None, received {self.model_dir!r}."
            )
        if self.save_checkpoints_steps is not None and self.save_checkpoints_secs is not None:
            raise UsageError(
                f"Give save_checkpoints_steps or save_checkpoints_secs, not both; received "
                f"{self.save_checkpoints_steps} steps and {self.save_checkpoints_secs} secs."
            )
        if self.save_checkpoints_steps is None and self.save_checkpoints_secs is None:
            raise UsageError(
                "Give save_checkpoints_steps (or save_checkpoints_secs without collective "
                "strategies); with neither, no checkpoint is written and the evaluator "
                "has nothing to evaluate."
            )
        if self.save_checkpoints_secs is not None and self.save_checkpoints_secs < 1:
            raise UsageError(
                "save_checkpoints_secs must be at least 1 or None, received "
                f"{self.save_checkpoints_secs}."
            )
        check_bounds(self)


@dataclasses.dataclass(frozen=True)
class StrategyConfig:
    """What strategy to build; validated and normalised on construction.

    Attributes:
      name: One of `STRATEGY_NAMES`, any case.
      communication: RING, NCCL or AUTO, any case; used by
        `multi_worker_mirrored` only.
      collective_timeout_seconds: Deadline for each collective operation, or
        None (the default) for none. With a deadline, a peer that stops
        answering (a network partition, a frozen host) fails the job within
        it. But TensorFlow 2.15 holds one sleeping thread per collective for
        the whole deadline: a 2-worker mnist_cnn job with 120 s had 12,189
        threads per worker after 40 s (190 without), and jobs with more
        collectives abort when threads run out. The driver's stall watchdog
        (`JobConfig.stall_timeout`) catches partitions without that cost.
      bytes_per_pack: Gradients are all-reduced in packs of about this many
        bytes, so that a pack can start while later gradients are still being
        computed; 0 (the default) sends all of them in one all-reduce after
        the backward pass, which measured fastest with one core per worker
        (see docs/performance.md).
      gradient_wire_dtype: `float32` (the default), or `bfloat16`/`float16`:
        float32 gradients are rounded to that dtype for the all-reduce, summed
        in it, and converted back to float32 before the optimizer uses them.
        Half the bytes on the network, and about 3 significant digits per
        gradient value (see `estimator_dist.tf_runtime.patches`).
      num_gpus: GPUs per worker (Model Garden's `--num_gpus`): the first
        that many of those a task sees, 0 for the CPU; None (the default)
        uses every visible GPU. The strategy plans its devices with it and
        the RunConfig's sessions create that many. See `run_config.gpus`.
    """

    name: str = setting(
        MULTI_WORKER_MIRRORED,
        "Training strategy.",
        flag="distribution_strategy",
        enum=STRATEGY_NAMES,
    )
    communication: str = setting(
        "AUTO",
        "Collective implementation of multi_worker_mirrored; NCCL needs GPUs, RING runs "
        "anywhere, AUTO lets TensorFlow choose.",
        enum=COMMUNICATIONS,
    )
    collective_timeout_seconds: Optional[float] = setting(
        None,
        "Seconds a collective operation may wait for its peers before the task fails "
        "(exit 150); 0 (default) waits forever and leaves partitions to --stall_timeout. "
        "TensorFlow 2.15 keeps one thread per collective for this long, so threads grow "
        "with collectives per second x timeout.",
        kind="float",
        flag="collective_timeout",
        flag_default=0,
        lower_bound=0.0,
        convert=none_for_zero,
    )
    bytes_per_pack: int = setting(
        0,
        "All-reduce gradients in packs of about this many bytes, so that early packs can "
        "start during the backward pass; 0 (default): one all-reduce of all gradients.",
        lower_bound=0,
    )
    gradient_wire_dtype: str = setting(
        "float32",
        "Dtype gradients are all-reduced in: bfloat16 or float16 halve the bytes on the "
        "network and round each gradient value to 8 or 11 significant bits; the weights "
        "and the optimizer stay float32.",
        enum=WIRE_DTYPES,
    )
    num_gpus: Optional[int] = setting(
        None,
        "GPUs each worker trains on, the first it sees (Model Garden's flag): 0 hides them "
        "and trains on the CPU; with --distribution_strategy=multi_worker_mirrored each "
        "worker mirrors over its GPUs and all-reduces across workers; in one process "
        "without TF_CONFIG, 2 or more train with MirroredStrategy over them. Default, or "
        "-1: every visible GPU.",
        kind="integer",
        lower_bound=-1,
        convert=_none_for_every_gpu,
    )

    def __post_init__(self) -> None:
        name = str(self.name).lower()
        if name not in STRATEGY_NAMES:
            raise choice(
                "distribution strategy",
                self.name,
                STRATEGY_NAMES,
                "Set --distribution_strategy to one of them.",
            )
        communication = str(self.communication).upper()
        if communication not in COMMUNICATIONS:
            raise choice(
                "collective communication",
                self.communication,
                COMMUNICATIONS,
                "Set --communication to one of them (any case).",
            )
        timeout = self.collective_timeout_seconds
        if timeout is not None and timeout <= 0:
            raise UsageError(
                f"collective_timeout_seconds must be positive or None, received {timeout}."
            )
        wire_dtype = str(self.gradient_wire_dtype).lower()
        if wire_dtype not in WIRE_DTYPES:
            raise choice(
                "gradient wire dtype",
                self.gradient_wire_dtype,
                WIRE_DTYPES,
                "Set --gradient_wire_dtype to one of them.",
            )
        if self.num_gpus is not None and self.num_gpus < 0:
            raise UsageError(
                f"--num_gpus must be 0 (CPU) or more, received {self.num_gpus}; leave it out "
                "to use every visible GPU."
            )
        check_bounds(self)
        plan_strategy(name, self.num_gpus, distributed=True)  # Refuses 2+ GPUs on one device.
        object.__setattr__(self, "gradient_wire_dtype", wire_dtype)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "communication", communication)


def plan_strategy(
    name: str, num_gpus: Optional[int], distributed: bool
) -> Tuple[str, Tuple[str, ...]]:
    """The strategy to build for `--num_gpus`, and the local devices to give it.

    Args:
      name: The strategy asked for (`--distribution_strategy`).
      num_gpus: GPUs per worker (`--num_gpus`), or None for whatever is visible.
      distributed: Whether this task is part of a cluster (TF_CONFIG).

    Returns:
      `(name, devices)`: the strategy's name, and its devices, or `()` for
      the strategy's own choice among the visible devices.

    Raises:
      UsageError: for `off` or `one_device` with 2 or more GPUs.
    """
    if num_gpus is None:
        return name, ()
    if name in (OFF, ONE_DEVICE) and num_gpus > 1:
        raise UsageError(
            f"--distribution_strategy={name} trains on one device, but --num_gpus={num_gpus} "
            f"asks for {num_gpus}. Use --distribution_strategy={MIRRORED} (one process) or "
            f"{MULTI_WORKER_MIRRORED}, or --num_gpus=1."
        )
    if name == MULTI_WORKER_MIRRORED and not distributed and num_gpus > 1:
        name = MIRRORED
    if name == MIRRORED:
        devices = tuple(f"/gpu:{index}" for index in range(num_gpus)) or ("/cpu:0",)
        return name, devices
    if name == ONE_DEVICE:
        return name, ("/gpu:0" if num_gpus else "/cpu:0",)
    return name, ()


def check_cluster_fits(config: StrategyConfig, cluster: ClusterConfig) -> None:
    """Refuses strategy and cluster combinations TensorFlow cannot run.

    Raises:
      UsageError: if parameter servers and the strategy do not match, or a
        local-only strategy is asked to train on several workers.
    """
    if cluster.num_ps and config.name != PARAMETER_SERVER:
        raise UsageError(
            f"TF_CONFIG lists {cluster.num_ps} ps task(s) but the distribution strategy "
            f"is {config.name!r}; only 'parameter_server' uses ps tasks. Set "
            "--distribution_strategy=parameter_server or remove the ps job."
        )
    if config.name == PARAMETER_SERVER and cluster.is_distributed and not cluster.num_ps:
        raise UsageError(
            "--distribution_strategy=parameter_server needs at least one ps task in "
            "TF_CONFIG (or --num_ps with the launcher)."
        )
    if config.name in (MIRRORED, CENTRAL_STORAGE, ONE_DEVICE, OFF) and cluster.num_workers > 1:
        raise UsageError(
            f"--distribution_strategy={config.name} trains in one process, but TF_CONFIG "
            f"has {cluster.num_workers} workers, which would wait forever for it. Use "
            f"{MULTI_WORKER_MIRRORED!r} (or {PARAMETER_SERVER!r} with ps tasks)."
        )
