"""The guards every task runs beside training: the fail-fast watchdog and the preemption checkpoint.

`estimator_dist.train` (through the driver) and `estimator_dist.script` start
the same guards for the same roles, from plain values:

* a single process, the chief and the workers: a `Watchdog` (start-up and
  stall deadlines, an input that runs out on a cluster, silent session
  recovery) and the `Preemption` hook;
* the evaluator: an `EvaluatorWatchdog`, and on SIGTERM an immediate exit;
* a parameter server: no watchdog; on SIGTERM it waits for the chief's save.
"""

from __future__ import annotations

import os
from typing import Optional, Union

import tensorflow as tf
from absl import logging

from estimator_dist.base.cluster import CHIEF, EVALUATOR, PS, WORKER, ClusterConfig
from estimator_dist.preemption import Preemption
from estimator_dist.watchdog import EvaluatorWatchdog, Watchdog


def enter_task(cluster: ClusterConfig) -> None:
    """Sets this process up as the task `cluster` describes, before any user code runs.

    Graph mode, as Estimator's distributed training needs (the evaluator
    crashes in eager mode), and TF_CONFIG set to the normalised cluster, which
    TensorFlow reads from the environment (removed for a single process).
    """
    tf.compat.v1.disable_eager_execution()
    if cluster.is_distributed:
        os.environ["TF_CONFIG"] = cluster.to_json()
    else:
        os.environ.pop("TF_CONFIG", None)
    for note in cluster.notes:
        logging.info("TF_CONFIG: %s.", note)


def start_preemption(
    cluster: ClusterConfig, model_dir: str, enabled: bool, grace_secs: float
) -> Preemption:
    """Catches SIGTERM/SIGINT for this task's part of the preemption checkpoint.

    Args:
      cluster: This task's cluster configuration.
      model_dir: The job's shared model_dir, where requests and the decision go.
      enabled: False leaves the signals' defaults.
      grace_secs: Seconds from the signal to a forced exit.

    Returns:
      The installed `Preemption`; its `hooks()` go into the training hooks.
    """
    if cluster.task_type in (EVALUATOR, PS):
        kind = cluster.task_type
    else:
        kind = CHIEF if cluster.is_chief else WORKER
    preemption = Preemption(
        cluster.role,
        model_dir,
        kind,
        lockstep=not cluster.num_ps,
        grace_secs=grace_secs,
        enabled=enabled,
    )
    preemption.install()
    return preemption


def start_watchdog(
    cluster: ClusterConfig,
    model_dir: str,
    last_step: Optional[int],
    startup_timeout: float,
    stall_timeout: float,
    preemption: Preemption,
) -> Optional[Union[Watchdog, EvaluatorWatchdog]]:
    """Starts the fail-fast watchdog of this task; None on a parameter server.

    Args:
      cluster: This task's cluster configuration.
      model_dir: Where the chief writes checkpoints (watched by the evaluator).
      last_step: The step training ends at; a cluster task ending below it
        fails (exit 6), a single process only warns. None when unknown.
      startup_timeout: Seconds to the first step.
      stall_timeout: Seconds the global step may stay the same.
      preemption: Its stop below `last_step` is on purpose.
    """
    watchdog: Optional[Union[Watchdog, EvaluatorWatchdog]]
    if not cluster.is_distributed:
        watchdog = Watchdog(
            cluster.role,
            {},
            startup_timeout,
            stall_timeout,
            last_step,
            alone=True,
            preempted=lambda: preemption.requested,
        )
    elif cluster.task_type == EVALUATOR:
        chief = {"chief-0": cluster.jobs[CHIEF][0]}
        watchdog = EvaluatorWatchdog(cluster.role, model_dir, chief, stall_timeout)
    elif cluster.task_type == PS:
        return None
    else:
        peers = {
            f"{name}-{index}": address
            for name, addresses in cluster.jobs.items()
            for index, address in enumerate(addresses)
            if (name, index) != (cluster.task_type, cluster.task_index)
        }
        watchdog = Watchdog(
            cluster.role,
            peers,
            startup_timeout,
            stall_timeout,
            # Collective training needs every worker at every step; with parameter
            # servers a worker may stop alone.
            None if cluster.num_ps else last_step,
            preempted=lambda: preemption.requested,
        )
    watchdog.start()
    return watchdog
