"""Distribution strategies from plain strings, aware of the task's role.

`get_strategy` builds one strategy from a `StrategyConfig` (`run_config.options`);
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

from estimator_dist.base.errors import UsageError
from estimator_dist.cluster.tf_config import EVALUATOR, ClusterConfig
from estimator_dist.tf_runtime import patches
from estimator_dist.tf_runtime import strategies as tf_strategies
from run_config.gpus import check_gpus, use_gpus
from run_config.names import (
    CENTRAL_STORAGE,
    EVAL_STRATEGY_NAMES,
    MIRRORED,
    MULTI_WORKER_MIRRORED,
    ONE_DEVICE,
    PARAMETER_SERVER,
)
from run_config.options import StrategyConfig, check_cluster_fits, choice, plan_strategy

#: Logged when NCCL is requested on a task that has no GPU.
NCCL_WITHOUT_GPU_MESSAGE = (
    "NCCL collectives were requested but this task sees no GPU: RING collectives "
    "will run instead (NCCL only moves tensors between GPUs)."
)

_IMPLEMENTATIONS = {
    "AUTO": tf.distribute.experimental.CommunicationImplementation.AUTO,
    "RING": tf.distribute.experimental.CommunicationImplementation.RING,
    "NCCL": tf.distribute.experimental.CommunicationImplementation.NCCL,
}


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
    if not tf_strategies.is_collective(strategy):
        return None
    built = tf_strategies.collective_implementation(strategy)
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
      gradients in `config.gradient_wire_dtype` (`tf_runtime.patches`, which must be
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
        # The workarounds a multi-worker strategy needs (docs/tensorflow.md); installing them
        # here lets this library be used without the driver, which installs them at start-up.
        patches.install()
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=_IMPLEMENTATIONS[implementation],
            timeout_seconds=config.collective_timeout_seconds,
            bytes_per_pack=config.bytes_per_pack,
        )
        strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
        patches.set_gradient_transport(strategy, config.gradient_wire_dtype)
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
        raise choice(
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
