"""Distribution strategies from plain strings, aware of the task's role.

`get_strategy` builds one strategy from a `StrategyConfig`;
`make_strategies` picks the training and evaluation strategies for the
current task of a cluster. The evaluator of a multi-worker job never builds
MultiWorkerMirroredStrategy: it is outside the cluster, so that strategy
raises `KeyError: 'evaluator'` there, and passing no strategy at all makes
Estimator's RunConfig demand a chief. It gets a local MirroredStrategy for
training (never used to train, only to keep Estimator in distribute
coordinator mode) and the chosen evaluation strategy.

>>> config = StrategyConfig("multi_worker_mirrored", communication="ring")
>>> config.communication
'RING'
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

import tensorflow as tf
from absl import logging
from tensorflow.python.distribute import collective_all_reduce_strategy

from estimator_dist.base import tf_patches
from estimator_dist.base.cluster import EVALUATOR, ClusterConfig
from estimator_dist.base.errors import UsageError
from run_config.gpus import check_gpus, plan_strategy, use_gpus
from run_config.names import (
    CENTRAL_STORAGE,
    COMMUNICATIONS,
    EVAL_STRATEGY_NAMES,
    MIRRORED,
    MULTI_WORKER_MIRRORED,
    OFF,
    ONE_DEVICE,
    PARAMETER_SERVER,
    STRATEGY_NAMES,
    WIRE_DTYPES,
)

#: Logged when NCCL is requested on a task that has no GPU.
NCCL_WITHOUT_GPU_MESSAGE = (
    "NCCL collectives were requested but this task sees no GPU: RING collectives "
    "will run instead (NCCL only moves tensors between GPUs)."
)

_COLLECTIVE = collective_all_reduce_strategy.CollectiveAllReduceExtended
_IMPLEMENTATIONS = {
    "AUTO": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "RING": tf.distribute.experimental.CommunicationImplementation.RING,
    "NCCL": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


def _choice(kind: str, value: str, valid: tuple, fix: str) -> UsageError:
    return UsageError(f"Unknown {kind} {value!r}; valid values are {', '.join(valid)}. {fix}")


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
        gradient value (see `estimator_dist.base.tf_patches`).
      num_gpus: GPUs per worker (Model Garden's `--num_gpus`): the first
        that many of those a task sees, 0 for the CPU; None (the default)
        uses every visible GPU. See `run_config.gpus`.
    """

    name: str = MULTI_WORKER_MIRRORED
    communication: str = "AUTO"
    collective_timeout_seconds: Optional[float] = None
    bytes_per_pack: int = 0
    gradient_wire_dtype: str = "float32"
    num_gpus: Optional[int] = None

    def __post_init__(self) -> None:
        name = str(self.name).lower()
        if name not in STRATEGY_NAMES:
            raise _choice(
                "distribution strategy",
                self.name,
                STRATEGY_NAMES,
                "Set --distribution_strategy to one of them.",
            )
        communication = str(self.communication).upper()
        if communication not in COMMUNICATIONS:
            raise _choice(
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
        if self.bytes_per_pack < 0:
            raise UsageError(
                f"bytes_per_pack must be 0 (one pack) or more, received {self.bytes_per_pack}."
            )
        wire_dtype = str(self.gradient_wire_dtype).lower()
        if wire_dtype not in WIRE_DTYPES:
            raise _choice(
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
        plan_strategy(name, self.num_gpus, distributed=True)  # Refuses 2+ GPUs on one device.
        object.__setattr__(self, "gradient_wire_dtype", wire_dtype)
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "communication", communication)


def communication_for(requested: str, num_gpus: int) -> str:
    """Decides the collective implementation a MultiWorkerMirroredStrategy runs.

    The one place that decides it: `get_strategy` builds the strategy with
    its answer, and `communication_of` applies it to a strategy someone else
    built (a script's own).

    Args:
      requested: RING, NCCL or AUTO, any case.
      num_gpus: GPUs visible to this task.

    Returns:
      `RING` on a task without GPUs whatever was requested (NCCL only moves
      tensors between GPUs, and AUTO has nothing else to choose on CPUs);
      otherwise what was requested (AUTO lets the runtime choose per
      collective).

    >>> communication_for("auto", num_gpus=0)
    'RING'
    >>> communication_for("NCCL", num_gpus=2)
    'NCCL'
    """
    return "RING" if num_gpus == 0 else requested.upper()


def communication_of(
    strategy: Optional[tf.distribute.Strategy], num_gpus: Optional[int] = None
) -> Optional[str]:
    """The collective implementation `strategy` runs, read from the built strategy.

    Args:
      strategy: Any strategy, or None.
      num_gpus: GPUs visible to this task; counted when None.

    Returns:
      RING, NCCL or AUTO for a MultiWorkerMirroredStrategy; None for a
      strategy that runs no collectives.
    """
    if strategy is None or not isinstance(strategy.extended, _COLLECTIVE):
        return None
    built = strategy.extended._communication_options.implementation.name
    return communication_for(built, count_gpus() if num_gpus is None else num_gpus)


def count_gpus() -> int:
    """Returns the number of GPUs TensorFlow sees in this process."""
    return len(tf.config.list_physical_devices("GPU"))


def get_strategy(
    config: StrategyConfig, num_gpus: Optional[int] = None, devices: Tuple[str, ...] = ()
) -> Optional[tf.distribute.Strategy]:
    """Builds the strategy named by `config`.

    Args:
      config: The strategy to build.
      num_gpus: GPUs visible to this task; counted when None.
      devices: The local devices of `mirrored` and `one_device`
        (`gpus.plan_strategy`); `()` lets the strategy choose.

    Returns:
      A `tf.distribute.Strategy`, or None for `off`. A
      MultiWorkerMirroredStrategy runs the collectives `communication_for`
      decides, and all-reduces sparse gradients as dense tensors and float32
      gradients in `config.gradient_wire_dtype` (`tf_patches`, which must be
      installed first).

    Example:
      >>> get_strategy(StrategyConfig("off")) is None
      True
    """
    if num_gpus is None:
        num_gpus = count_gpus()
    if config.name == MULTI_WORKER_MIRRORED:
        implementation = communication_for(config.communication, num_gpus)
        if config.communication == "NCCL" and implementation != "NCCL":
            logging.warning(NCCL_WITHOUT_GPU_MESSAGE)
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=_IMPLEMENTATIONS[implementation],
            timeout_seconds=config.collective_timeout_seconds,
            bytes_per_pack=config.bytes_per_pack,
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        tf_patches.set_gradient_transport(strategy, config.gradient_wire_dtype)
        return strategy
    if config.name == MIRRORED:
        return tf.distribute.MirroredStrategy(devices=list(devices) or None)
    if config.name == CENTRAL_STORAGE:
        return tf.compat.v1.distribute.experimental.CentralStorageStrategy()
    if config.name == PARAMETER_SERVER:
        return tf.compat.v1.distribute.experimental.ParameterServerStrategy()
    if config.name == ONE_DEVICE:
        return tf.distribute.OneDeviceStrategy(
            devices[0] if devices else "/gpu:0" if num_gpus else "/cpu:0"
        )
    return None


@dataclasses.dataclass(frozen=True)
class Strategies:
    """The strategies for one task, and what they resolve to.

    Attributes:
      train_distribute: For `RunConfig(train_distribute=...)`.
      eval_distribute: For `RunConfig(eval_distribute=...)`.
      train_name: Name of the training strategy this task built.
      eval_name: Name of the evaluation strategy.
      communication: Collective implementation requested.
      effective_communication: Collective implementation the built training
        strategy runs (`communication_of`), or None when it runs none.
      devices: The local devices the training strategy mirrors over, read
        from the built strategy; `()` without one.
      num_gpus: GPUs this task trains on.
    """

    train_distribute: Optional[tf.distribute.Strategy]
    eval_distribute: Optional[tf.distribute.Strategy]
    train_name: str
    eval_name: str
    communication: str
    effective_communication: Optional[str]
    devices: Tuple[str, ...] = ()
    num_gpus: int = 0

    def describe(self) -> str:
        """What this task built, as logged: class, devices, collectives."""
        train = self.train_distribute
        built = type(train).__name__ if train is not None else "no strategy"
        devices = ", ".join(self.devices) or "no device of its own"
        collectives = self.effective_communication or "none"
        return (
            f"training strategy {self.train_name} ({built}) over {devices}; {self.num_gpus} "
            f"GPU(s); collectives {collectives}; evaluation strategy {self.eval_name}"
        )


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


def check_nccl_gpus(config: StrategyConfig, cluster: ClusterConfig, num_gpus: int) -> None:
    """Refuses NCCL when the training processes on this host outnumber its GPUs.

    NCCL needs a GPU of its own for every process; processes sharing a GPU
    deadlock or fail inside NCCL. With no GPU at all, RING runs instead.

    Raises:
      UsageError: if NCCL is requested and 0 < GPUs < processes on this host.
    """
    if config.name != MULTI_WORKER_MIRRORED or config.communication != "NCCL" or not num_gpus:
        return
    if cluster.task_type not in ("chief", "worker"):
        return
    host = cluster.jobs[cluster.task_type][cluster.task_index].rpartition(":")[0]
    local = [
        f"{name}-{index}"
        for name in ("chief", "worker")
        for index, address in enumerate(cluster.jobs.get(name, ()))
        if address.rpartition(":")[0] == host
    ]
    if len(local) > num_gpus:
        raise UsageError(
            f"--communication=NCCL with {len(local)} training processes on host {host} "
            f"({', '.join(local)}) but {num_gpus} visible GPU(s): NCCL needs one GPU per "
            "process. Give each process its own GPU (CUDA_VISIBLE_DEVICES), run fewer "
            "processes per host, or use --communication=RING."
        )


def make_strategies(
    config: StrategyConfig,
    eval_name: str,
    cluster: ClusterConfig,
    num_gpus: Optional[int] = None,
) -> Strategies:
    """Picks the training and evaluation strategies for this task.

    Args:
      config: The training strategy the job asks for.
      eval_name: One of `EVAL_STRATEGY_NAMES`.
      cluster: This task's cluster configuration.
      num_gpus: GPUs visible to this task; counted when None.

    Returns:
      The `Strategies` to put into RunConfig.

    Raises:
      UsageError: for an unknown evaluation strategy, a strategy that does
        not fit the cluster, or more `config.num_gpus` than visible GPUs.
    """
    eval_name = str(eval_name).lower()
    if eval_name not in EVAL_STRATEGY_NAMES:
        raise _choice(
            "evaluation strategy",
            eval_name,
            EVAL_STRATEGY_NAMES,
            "Evaluation runs in one process; set --eval_distribution_strategy to one of them.",
        )
    check_cluster_fits(config, cluster)
    num_gpus = check_gpus(config.num_gpus, count_gpus() if num_gpus is None else num_gpus)
    if config.num_gpus is not None:
        use_gpus(num_gpus)
    check_nccl_gpus(config, cluster, num_gpus)
    train_name, devices = plan_strategy(config.name, config.num_gpus, cluster.is_distributed)
    eval_distribute = get_strategy(StrategyConfig(eval_name), num_gpus)
    evaluator = cluster.task_type == EVALUATOR
    if evaluator:
        train_distribute = tf.distribute.MirroredStrategy()
        train_name = MIRRORED
    else:
        named = dataclasses.replace(config, name=train_name)
        train_distribute = get_strategy(named, num_gpus, devices)
    # The evaluator's MirroredStrategy never trains: its devices would mislead.
    extended = None if evaluator else getattr(train_distribute, "extended", None)
    built = Strategies(
        train_distribute=train_distribute,
        eval_distribute=eval_distribute,
        train_name=train_name,
        eval_name=eval_name,
        communication=config.communication,
        effective_communication=communication_of(train_distribute, num_gpus),
        devices=tuple(getattr(extended, "worker_devices", ())),
        num_gpus=num_gpus,
    )
    logging.info("Task %s: %s.", cluster.role, built.describe())
    return built
