"""The training driver: one call runs `tf.estimator.train_and_evaluate` on any role.

`train_and_evaluate(job, cluster)` runs the same way on the chief, a worker,
a parameter server, the evaluator, or a single process with no TF_CONFIG.
Because `tf.estimator.train_and_evaluate` returns nothing in multi-worker
mode, the evaluator (or the single process) writes the final metrics to
`model_dir/eval_metrics.json`, and the chief writes what actually ran to
`model_dir/run_record.json` (`estimator_dist.task.records`).

Example, a single process on the embedded digits:

  >>> from run_config.run_config import RunConfigOptions
  >>> job = JobConfig(run=RunConfigOptions(model_dir="/tmp/digits"),  # doctest: +SKIP
  ...                 train_steps=200)
  >>> train_and_evaluate(job, ClusterConfig())["accuracy"]  # doctest: +SKIP
  0.95...
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import List, Optional, Tuple, Union

import tensorflow as tf
from absl import logging

from estimator_dist.base import console, files, precision, status
from estimator_dist.base.cluster import CHIEF, EVALUATOR, WORKER, ClusterConfig
from estimator_dist.base.errors import DataError, Error
from estimator_dist.config.job import JobConfig, check_batch
from estimator_dist.guards.checkpoints import settle_for_task
from estimator_dist.guards.evaluator_watchdog import EvaluatorWatchdog
from estimator_dist.guards.heartbeat import start_heartbeat
from estimator_dist.guards.preemption import PREEMPTION_DIR, Preemption
from estimator_dist.guards.rendezvous import rendezvous
from estimator_dist.guards.roles import enter_task, progress_hook, start_preemption, start_watchdog
from estimator_dist.guards.startup import Startup
from estimator_dist.guards.watchdog import Watchdog
from estimator_dist.storage.task import task_storage
from estimator_dist.task import early_stopping, export, records
from estimator_dist.task.diagnose import (
    error_summary,
    explain_training_error,
    explain_user_error,
    refused_writes,
)
from estimator_dist.task.preflight import (
    Preflight,
    build_estimator,
    build_keras_model,
    model_fn_estimator,
    preflight,
)
from estimator_dist.tf_runtime import patches
from input_fns import bad_data
from run_config.run_config import make_run_config
from run_config.strategies import Strategies, make_strategies

_AnyWatchdog = Optional[Union[Watchdog, EvaluatorWatchdog]]


def train_and_evaluate(job: JobConfig, cluster: ClusterConfig) -> Optional[dict]:
    """Runs `tf.estimator.train_and_evaluate` for this task of the job.

    A job whose results live at a URL TensorFlow cannot write (`--model_dir=s3://...`,
    or `--storage`) trains in a local model_dir that `estimator_dist.storage` keeps in
    step with the URL; the tasks compare and identify the job by the model_dir it names.

    Everything this task can check alone comes before it waits for the
    others at the rendezvous; then the chief records what runs, and every
    task trains, evaluates or serves as a parameter server.

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
    # --- storage (issue 35): the task's local model_dir, synchronised with the job's URL.
    shared = (PREEMPTION_DIR, files.LAST_STEP_FILE)
    with task_storage(
        job.run.model_dir, job.storage, cluster.role, cluster.task_type, shared
    ) as local:
        run = dataclasses.replace(job.run, model_dir=local)
        return _train_and_evaluate(dataclasses.replace(job, run=run), cluster, named=job)
    # --- end storage


def _train_and_evaluate(job: JobConfig, cluster: ClusterConfig, named: JobConfig) -> Optional[dict]:
    """`train_and_evaluate` in the task's model_dir; `named` is the job as every task names it."""
    startup = Startup(cluster.role)
    startup.mark("imports")
    enter_task(cluster)
    patches.install()
    checked = preflight(job, cluster.num_workers if cluster.task_type != EVALUATOR else 1)
    startup.mark("pre-flight")
    strategies, num_replicas = _strategies(job, cluster)
    run_config = make_run_config(
        job.run, strategies.train_distribute, strategies.eval_distribute, job.strategy.num_gpus
    )
    startup.mark("strategies")
    preemption = _start_preemption(job, cluster)
    with refused_writes(job.run.model_dir):  # The chief settles before the others may restore.
        settle_for_task(cluster, job.run.model_dir, job.startup_timeout)
    attempt = rendezvous(cluster, records.job_view(named, cluster), job.startup_timeout)
    preemption.joined(attempt)
    startup.mark("rendezvous")
    if cluster.task_type in (None, CHIEF, WORKER):
        status.emit(status.StopStep(step=job.train_steps, how=status.MAX_STEPS))
    estimator = _record_and_build(job, cluster, checked, strategies, num_replicas, run_config)
    watchdog = start_watchdog(
        cluster,
        job.run.model_dir,
        job.train_steps,
        job.startup_timeout,
        job.stall_timeout,
        preemption,
    )
    exporter = records.MetricsExporter(job.run.model_dir)
    train_spec, eval_spec = _specs(job, cluster, checked, exporter, startup, preemption, watchdog)
    heartbeat = start_heartbeat(
        cluster, named.run.model_dir, attempt, job.heartbeat_timeout, preemption
    )
    if heartbeat is not None:
        train_spec = train_spec._replace(hooks=(*train_spec.hooks, heartbeat.hook()))
    if job.stop_threshold is not None:
        train_spec, eval_spec = _stop_at_threshold(
            job, cluster, estimator, preemption, train_spec, eval_spec
        )
    _train(job, cluster, estimator, train_spec, eval_spec, watchdog, preemption)
    if (
        cluster.task_type is None
        and exporter.final_metrics is None
        and early_stopping.stopped_early(preemption)
    ):
        # One process stopped early: its last evaluation, of the step it stopped at, is final.
        return files.mark_final_metrics(job.run.model_dir)
    if cluster.task_type in (None, EVALUATOR):
        return exporter.final_metrics
    return None


def _strategies(job: JobConfig, cluster: ClusterConfig) -> Tuple[Strategies, int]:
    """This task's strategies and training replicas, with the batch checked against them."""
    strategies = make_strategies(job.strategy, job.eval_strategy, cluster)
    train = strategies.train_distribute
    num_replicas = train.num_replicas_in_sync if train and cluster.task_type != EVALUATOR else 1
    check_batch(job.batch_size, job.micro_batches, num_replicas, f"{cluster.num_workers} worker(s)")
    return strategies, num_replicas


def _start_preemption(job: JobConfig, cluster: ClusterConfig) -> Preemption:
    """Creates model_dir, where preemption requests go, and catches the signals."""
    with refused_writes(job.run.model_dir):
        tf.io.gfile.makedirs(job.run.model_dir)
        console.keep_log(job.run.model_dir, cluster.role)
        return start_preemption(
            cluster, job.run.model_dir, job.preemption_checkpoint, job.preemption_grace_secs
        )


def _record_and_build(
    job: JobConfig,
    cluster: ClusterConfig,
    checked: Preflight,
    strategies: Strategies,
    num_replicas: int,
    run_config: tf.estimator.RunConfig,
) -> tf.estimator.Estimator:
    """Logs and (on the chief) records what this task runs; returns its estimator."""
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
    with refused_writes(job.run.model_dir):
        if cluster.is_chief:
            files.write_json(
                os.path.join(job.run.model_dir, files.RUN_RECORD_FILE),
                records.make_run_record(job, cluster, strategies, num_replicas, checked),
            )
        return make_estimator(job, checked, run_config)


def make_estimator(
    job: JobConfig, checked: Preflight, run_config: tf.estimator.RunConfig
) -> tf.estimator.Estimator:
    """The job's estimator: canned (`--estimator`), from a model_fn, or from a Keras model."""
    if job.estimator:
        return build_estimator(job, checked.feature_specs, run_config)
    if job.keras_model is None:
        return model_fn_estimator(job, checked.model_fn, run_config)
    # model_to_estimator writes the warm-start checkpoint to model_dir/keras on every task.
    # "saver": the default object-based format builds its Saver inside the replica context,
    # where batch normalization's moving statistics cannot be read ("Method requires being
    # in cross-replica context" at the first step of any Keras model with BatchNormalization).
    used = precision.resolve(job.run.precision.mixed_precision, job.strategy.num_gpus)
    with files.model_dir_lock(job.run.model_dir, "keras_bridge"), precision.keras_policy(used):
        return tf.keras.estimator.model_to_estimator(
            keras_model=build_keras_model(job, checked.feature_specs),
            config=run_config,
            checkpoint_format="saver",
        )


def _specs(
    job: JobConfig,
    cluster: ClusterConfig,
    checked: Preflight,
    exporter: records.MetricsExporter,
    startup: Startup,
    preemption: Preemption,
    watchdog: _AnyWatchdog,
) -> Tuple[tf.estimator.TrainSpec, tf.estimator.EvalSpec]:
    """The TrainSpec and EvalSpec, with this task's hooks and the exporters."""
    hooks: List[tf.estimator.SessionRunHook] = [startup.hook(), *preemption.hooks()]
    hooks.append(
        progress_hook(
            job.train_steps,
            job.batch_size,
            job.run.log_step_count_steps,
            job.gradient_accumulation_steps,
            cluster.num_workers if job.strategy.name == "parameter_server" else 0,
        )
    )
    eval_hooks = [] if watchdog is None else [watchdog.eval_hook()]
    if isinstance(watchdog, Watchdog):
        hooks.append(watchdog.hook())
    if job.trace_every_steps:
        traces = os.path.join(job.run.model_dir, "traces", cluster.role)
        hooks.append(tf.compat.v1.train.ProfilerHook(job.trace_every_steps, output_dir=traces))
    exporters = export.make_exporters(
        checked.feature_specs, checked.exports, job.export_best_by, job.exports_to_keep
    )
    train_spec = tf.estimator.TrainSpec(checked.input_fn, max_steps=job.train_steps, hooks=hooks)
    eval_spec = tf.estimator.EvalSpec(
        checked.eval_input_fn,
        steps=checked.eval_steps,
        exporters=[exporter, *exporters],
        hooks=eval_hooks,
        start_delay_secs=0,
        throttle_secs=job.eval_throttle_secs,
    )
    return train_spec, eval_spec


def _stop_at_threshold(
    job: JobConfig,
    cluster: ClusterConfig,
    estimator: tf.estimator.Estimator,
    preemption: Preemption,
    train_spec: tf.estimator.TrainSpec,
    eval_spec: tf.estimator.EvalSpec,
) -> Tuple[tf.estimator.TrainSpec, tf.estimator.EvalSpec]:
    """The specs with `--stop_threshold`'s early stopping, which every task follows.

    The chief reads the evaluations' accuracy after every checkpoint; the
    evaluator ends once it evaluated the step the job stopped at.
    """
    hook = tf.estimator.experimental.stop_if_higher_hook(
        estimator,
        "accuracy",
        job.stop_threshold,
        run_every_secs=None,
        run_every_steps=job.run.save_checkpoints_steps,
    )
    hooks = early_stopping.agreed([hook], preemption, cluster, job.preemption_checkpoint)
    final = early_stopping.FinalEvaluationExporter(job.run.model_dir)
    return (
        train_spec._replace(hooks=(*train_spec.hooks, *hooks)),
        eval_spec._replace(exporters=(*eval_spec.exporters, final)),
    )


def _train(
    job: JobConfig,
    cluster: ClusterConfig,
    estimator: tf.estimator.Estimator,
    train_spec: tf.estimator.TrainSpec,
    eval_spec: tf.estimator.EvalSpec,
    watchdog: _AnyWatchdog,
    preemption: Preemption,
) -> None:
    """Runs `tf.estimator.train_and_evaluate`; a failure leaves as the error it means."""
    model_dir = job.run.model_dir
    started = time.monotonic()
    try:
        tf.estimator.train_and_evaluate(estimator, train_spec, eval_spec)
    except early_stopping.StoppedEarly as stopped:
        logging.info("estimator_dist: the evaluator ends: it %s.", stopped)
    except tf.errors.OpError as error:
        step = watchdog.step if isinstance(watchdog, Watchdog) else None
        explained = explain_training_error(error, step, time.monotonic() - started, model_dir)
        if preemption.requested:
            logging.warning(
                "Training failed while stopping for a preemption: %s", error_summary(error)
            )
            preemption.finished(failed=True)
        if explained is None:
            raise
        raise explained from (error if isinstance(explained, DataError) else None)
    except (Error, KeyboardInterrupt, SystemExit):
        raise
    except Exception as error:  # The user's model_fn, input_fn or hooks raised while training.
        step = watchdog.step if isinstance(watchdog, Watchdog) else None
        raise explain_user_error(error, model_dir, step) from None
    finally:
        skipped = bad_data.summary()
        if skipped:
            logging.warning("%s", skipped)
    if watchdog is not None:
        watchdog.stop()
    preemption.finished()
    preemption.uninstall()
    if early_stopping.stopped_early(preemption):
        early_stopping.record_stop(model_dir, preemption, cluster)
    logging.info("Training finished in %.1f s.", time.monotonic() - started)
