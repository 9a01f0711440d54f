"""What every task runs beside training: the watchdog, the preemption checkpoint, progress.

`estimator_dist.train` (through the driver) and `estimator_dist.script` start
the same guards for the same roles, from plain values:

* a single process, the chief and the workers: a `Watchdog` (start-up and
  stall deadlines, an input that runs out on a cluster, silent session
  recovery), the `Preemption` hook and a `ProgressHook`, the progress line a
  person reads every N steps;
* the evaluator: an `EvaluatorWatchdog`, and on SIGTERM an immediate exit;
* a parameter server: no watchdog; on SIGTERM it waits for the chief's save.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable, Optional, Union

import tensorflow as tf
from absl import logging

from estimator_dist.cluster.tf_config import CHIEF, EVALUATOR, PS, WORKER, ClusterConfig
from estimator_dist.guards.evaluator_watchdog import EvaluatorWatchdog
from estimator_dist.guards.preemption import Preemption
from estimator_dist.guards.watchdog import LastStep, Watchdog
from estimator_dist.report import status
from estimator_dist.report.console import StepRate, format_progress
from model_fns import learning_rates


def enter_task(cluster: ClusterConfig, graph_mode: bool = True) -> None:
    """Sets this process up as the task `cluster` describes, before any user code runs.

    Graph mode where asked, as Estimator's distributed training needs (on a
    task of a cluster TensorFlow deep-copies the estimator and its strategy,
    which a MultiWorkerMirroredStrategy refuses in eager mode, and the
    evaluator crashes), and TF_CONFIG set to the normalised cluster, which
    TensorFlow reads from the environment (removed for a single process), its
    hosts reached without any proxy the task inherited.
    Under a launcher, the task takes its status channel (`status.connect`),
    so that no child process of the user's code inherits its name, and says
    it started.
    """
    status.connect()
    if graph_mode:
        tf.compat.v1.disable_eager_execution()
    if cluster.is_distributed:
        os.environ["TF_CONFIG"] = cluster.to_json()
        cluster.keep_peers_direct(os.environ)
    else:
        os.environ.pop("TF_CONFIG", None)
    for note in cluster.notes:
        logging.info("TF_CONFIG: %s.", note)
    status.emit(status.Started(task=cluster.role, pid=os.getpid()))


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
    lockstep = not cluster.num_ps
    workers = [f"worker-{index}" for index in range(len(cluster.jobs.get("worker", ())))]
    preemption = Preemption(
        cluster.role,
        model_dir,
        kind,
        lockstep=lockstep,
        grace_secs=grace_secs,
        enabled=enabled,
        peers=workers if lockstep and kind == "chief" else (),
    )
    preemption.install()
    return preemption


def start_watchdog(
    cluster: ClusterConfig,
    model_dir: str,
    last_step: Optional[LastStep],
    startup_timeout: float,
    stall_timeout: float,
    stopped_on_purpose: Callable[[], bool],
) -> Optional[Union[Watchdog, EvaluatorWatchdog]]:
    """Starts the fail-fast watchdog of this task; None on a parameter server.

    Args:
      cluster: This task's cluster configuration.
      model_dir: Where the chief writes checkpoints (watched by the evaluator).
      last_step: The step training ends at; a cluster task ending below it
        fails (exit 6), a single process only warns. None when unknown.
      startup_timeout: Seconds to the first step.
      stall_timeout: Seconds without a completed training step.
      stopped_on_purpose: Whether training is being stopped below `last_step`
        on purpose (a preemption, early stopping, a hook of the program).
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
            stopped_on_purpose=stopped_on_purpose,
            model_dir=model_dir,
        )
    elif cluster.task_type == EVALUATOR:
        chief = {"chief-0": cluster.jobs[CHIEF][0]}
        step = None if last_step is None else last_step.step
        watchdog = EvaluatorWatchdog(cluster.role, model_dir, chief, stall_timeout, step)
    elif cluster.task_type == PS:
        # Its only line for people until the job ends: it trains nothing, so logs no progress.
        logging.info(
            "estimator_dist: task %s serves the model's variables to the workers.", cluster.role
        )
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
            stopped_on_purpose=stopped_on_purpose,
            model_dir=model_dir,
        )
    watchdog.start()
    return watchdog


class ProgressHook(tf.compat.v1.train.SessionRunHook):
    """Logs one progress line at every `every_n_steps`-th global step, and at the last one.

    `[ 50%] loss = 0.2320, step = 200/400, 6,830 examples/s, ~2 s left`: the
    loss of the step that reached the global step (the loss Estimator logs,
    `EstimatorSpec.loss`, reduced over the replicas), the examples a second
    and the time left at the rate of the recent lines, an interval far slower
    than them (a healed network cut, a pause) left out (`console.StepRate`). With
    `learning_rate = 0.1` after the loss when the graph has a learning rate:
    the one `model_fns.learning_rates.track` recorded (`resnet_cifar`, and
    any model_fn using `model_fns.optimizers.learning_rate`), or else a float
    scalar named `learning_rate`, as Model Garden's model_fns name theirs.

    It costs nothing on the other steps: it predicts each run's global step
    from the last one read and the global steps a run adds (1 in synchronous
    training, fewer with gradient accumulation, more with asynchronous
    parameter servers), and only the run predicted to reach the next
    multiple of `every_n_steps` fetches the loss, after which one read of the
    global step confirms it. The loss is the last tensor in the graph's
    LOSSES collection, where Estimator puts the `EstimatorSpec`'s loss before
    the hooks start, for any model_fn, canned estimator or Keras model.

    Args:
      last_step: The step training ends at; None when nothing names it before
        training (one process training until its input ends): the line then
        has no percentage, and the events say 0.
      examples_per_step: Examples one global step trains on: the global batch
        times the gradient accumulation steps; with parameter servers, one
        worker's batch. None leaves examples/s out (a script's batch).
      every_n_steps: Global steps between two lines (`--log_step_count_steps`).
      clock: Monotonic clock, replaceable in tests.
      quiet: Send the `status.Progress` event only, no line: for a program
        whose Estimator logs its own `loss = ..., step = ...` lines.
    """

    def __init__(
        self,
        last_step: Optional[int],
        examples_per_step: Optional[int],
        every_n_steps: int,
        clock: Callable[[], float] = time.monotonic,
        quiet: bool = False,
    ) -> None:
        if min(last_step or 1, every_n_steps, examples_per_step or 1) < 1:
            raise ValueError(
                f"ProgressHook needs positive values, not last_step={last_step}, "
                f"examples_per_step={examples_per_step}, every_n_steps={every_n_steps}."
            )
        self._last_step = last_step
        self._examples_per_step = examples_per_step
        self._every_n_steps = every_n_steps
        self._clock = clock
        self._quiet = quiet
        self._global_step: Optional[tf.Tensor] = None
        self._loss: Optional[tf.Tensor] = None
        self._learning_rate: Optional[tf.Tensor] = None
        self._fetching = False
        self._known, self._runs, self._per_run = 0, 0, 1.0
        self._next: float = math.inf
        #: (step, time) the rate of the next line is measured from; first, the first step's end.
        self._since: Optional[tuple] = None
        self._rate = StepRate()

    def begin(self) -> None:
        self._global_step = tf.compat.v1.train.get_global_step()
        losses = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)
        self._loss = losses[-1] if losses else None
        self._learning_rate = find_learning_rate(tf.compat.v1.get_default_graph())

    def after_create_session(self, session: tf.compat.v1.Session, coord: object) -> None:
        self._known = int(session.run(self._global_step)) if self._global_step is not None else 0
        self._runs = 0
        self._per_run = 1.0
        self._next = self._boundary_after(self._known)
        self._since = None

    def _boundary_after(self, step: int) -> float:
        end = math.inf if self._last_step is None else self._last_step
        if step >= end:
            return math.inf
        return min(end, (step // self._every_n_steps + 1) * self._every_n_steps)

    def before_run(
        self, run_context: tf.compat.v1.train.SessionRunContext
    ) -> Optional[tf.compat.v1.train.SessionRunArgs]:
        self._runs += 1
        predicted = self._known + self._runs * self._per_run
        self._fetching = self._global_step is not None and predicted >= self._next
        if not self._fetching:
            return None
        fetches = {"loss": self._loss, "learning_rate": self._learning_rate}
        return tf.compat.v1.train.SessionRunArgs(
            {name: tensor for name, tensor in fetches.items() if tensor is not None}
        )

    def after_run(
        self,
        run_context: tf.compat.v1.train.SessionRunContext,
        run_values: tf.compat.v1.train.SessionRunValues,
    ) -> None:
        if self._since is None:
            self._since = (self._known + self._per_run, self._clock())
        if not self._fetching:
            return
        step = int(run_context.session.run(self._global_step))
        now = self._clock()
        if step > self._known:
            self._per_run = (step - self._known) / self._runs
        self._known, self._runs = step, 0
        if step < self._next:  # Fewer global steps a run than predicted: not there yet.
            return
        loss = run_values.results.get("loss")
        learning_rate = run_values.results.get("learning_rate")
        since_step, since_time = self._since
        rate = self._rate.add(step - since_step, now - since_time)
        loss = None if loss is None else float(loss)
        examples_per_sec = (
            rate * self._examples_per_step if rate and self._examples_per_step else None
        )
        if not self._quiet:
            self._print(step, loss, examples_per_sec, rate, learning_rate)
        status.emit(
            status.Progress(
                step=step,
                last_step=self._last_step or 0,
                loss=loss if loss is None or math.isfinite(loss) else None,
                examples_per_sec=examples_per_sec,
                interval_steps=self._every_n_steps,
                interval_secs=now - since_time if now > since_time else None,
            )
        )
        self._since = (step, now)
        self._next = self._boundary_after(step)

    def _print(
        self,
        step: int,
        loss: Optional[float],
        examples_per_sec: Optional[float],
        rate: Optional[float],
        learning_rate: Any,
    ) -> None:
        logging.info(
            "%s",
            format_progress(
                step,
                self._last_step,
                loss,
                examples_per_sec,
                (self._last_step - step) / rate if rate and self._last_step else None,
                None if learning_rate is None else float(learning_rate),
            ),
        )


def find_learning_rate(graph: tf.Graph) -> Optional[tf.Tensor]:
    """The learning rate `model_fns.learning_rates` tracked in `graph`, else one named so."""
    rate = learning_rates.tracked(graph)
    if rate is None:
        try:
            rate = graph.get_tensor_by_name("learning_rate:0")
        except KeyError:
            return None
    return rate if rate.dtype.is_floating and rate.shape.rank == 0 else None


def progress_hook(
    last_step: int,
    batch_size: int,
    every_n_steps: int,
    gradient_accumulation_steps: int = 1,
    workers_step_alone: int = 0,
) -> ProgressHook:
    """The `ProgressHook` of a training task of a job, from the job's settings.

    Args:
      last_step: `--train_steps`.
      batch_size: The global batch, `--batch_size`.
      every_n_steps: `--log_step_count_steps`.
      gradient_accumulation_steps: Micro-batches of `batch_size` a global
        step trains on.
      workers_step_alone: With parameter servers, the number of workers, each
        of whose steps is a global step of its share of the batch; 0 when the
        workers step together.
    """
    examples = batch_size * gradient_accumulation_steps
    if workers_step_alone:
        examples = max(1, examples // workers_step_alone)
    return ProgressHook(last_step, examples, every_n_steps)
