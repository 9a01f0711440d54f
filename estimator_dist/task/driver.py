"""A job of named functions (`estimator_dist.train`): its estimator and specs, then the task's run.

`train_and_evaluate(job, cluster)` runs the same way on the chief, a worker,
a parameter server, the evaluator, or a single process with no TF_CONFIG: it
checks the job (`estimator_dist.task.preflight`), builds the strategies, the
RunConfig and the estimator of the named model, and the `TrainSpec` and
`EvalSpec` a plain TensorFlow program would give the named input functions;
`estimator_dist.task.run` does the rest, as for every kind of job. Because
`tf.estimator.train_and_evaluate` returns nothing in multi-worker mode, the
evaluator (or the single process) writes the final metrics to
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

import os
from typing import Optional, Tuple

import tensorflow as tf
from absl import logging

from estimator_dist.base import files
from estimator_dist.cluster.tf_config import EVALUATOR, ClusterConfig
from estimator_dist.config.evaluation import NAMED_START_DELAY_SECS, NAMED_THROTTLE_SECS
from estimator_dist.config.job import DEFAULT_TRAIN_STEPS, JobConfig, check_batch
from estimator_dist.guards.preemption import PREEMPTION_DIR
from estimator_dist.guards.roles import enter_task
from estimator_dist.guards.startup import Startup
from estimator_dist.hardware import precision
from estimator_dist.storage.task import task_storage
from estimator_dist.task import export, last_step, records
from estimator_dist.task.diagnose import explain_user_error, refused_writes
from estimator_dist.task.preflight import (
    Preflight,
    build_estimator,
    build_keras_model,
    model_fn_estimator,
    preflight,
)
from estimator_dist.task.run import Call, TaskRun
from estimator_dist.tf_runtime import patches
from run_config.run_config import make_run_config
from run_config.strategies import Strategies, make_strategies


def train_and_evaluate(job: JobConfig, cluster: ClusterConfig) -> Optional[dict]:
    """Runs `tf.estimator.train_and_evaluate` for this task of the job.

    Everything this task can check alone comes first (the pre-flight); then
    it builds the estimator and the specs that the same functions would get
    in a program of plain TensorFlow, and the task's run
    (`estimator_dist.task.run`) meets the other tasks and trains, evaluates or
    serves as a parameter server.

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
    # A job whose results live at a URL TensorFlow cannot write (`--model_dir=s3://...`, or
    # `--storage`) trains in a local model_dir that `estimator_dist.storage` keeps in step
    # with the URL; the tasks compare and identify the job by the model_dir it names.
    shared = (PREEMPTION_DIR, files.LAST_STEP_FILE)
    with task_storage(
        job.run.model_dir, job.storage, cluster.role, cluster.task_type, shared
    ) as local:
        return _train_and_evaluate(job.working_in(local), cluster, named=job)


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
        tf.io.gfile.makedirs(job.run.model_dir)
        estimator = make_estimator(job, checked, run_config)
    max_steps, count_inputs = _max_steps(job, checked)
    train_spec, eval_spec = _specs(job, checked, estimator, max_steps)
    run = TaskRun(cluster, job.guards, startup)
    run.train_and_evaluate(
        estimator,
        train_spec,
        eval_spec,
        Call(
            view=records.job_view(named, cluster),
            named_model_dir=named.run.model_dir,
            record=lambda decision: records.make_run_record(
                job, cluster, strategies, num_replicas, checked
            ),
            name_last_step=lambda step, how: _name_last_step(job, step, how),
            fix=FIX_INPUT,
            examples_per_step=_examples_per_step(job, cluster),
            count_inputs=count_inputs,
            explain=lambda error, step: explain_user_error(error, job.run.model_dir, step),
            hooks=_trace(job, cluster),
        ),
    )
    return run.final_metrics


#: How to make a training input that ran out before the last step last.
FIX_INPUT = (
    "Make the training input repeat (dataset.repeat(), or num_epochs=None for numpy_input_fn) "
    "and let --train_steps end training, or leave --train_steps out to train until the input ends."
)


def _max_steps(job: JobConfig, checked: Preflight) -> Tuple[Optional[int], bool]:
    """`TrainSpec.max_steps` and whether the tasks count their inputs to find the end.

    --train_steps when given; else where an input that ends by itself ends
    (counted on a cluster, as plain TensorFlow trains to its end), else the
    default for an input that repeats.
    """
    if job.train_steps is not None:
        return job.train_steps, False
    if checked.train_input_ends:
        return None, True
    return DEFAULT_TRAIN_STEPS, False


def _name_last_step(job: JobConfig, step: int, how: str) -> str:
    """The last step as the user set it, for messages."""
    if job.train_steps is not None:
        return f"--train_steps={job.train_steps}"
    if how == last_step.MAX_STEPS:
        return f"the default of --train_steps ({DEFAULT_TRAIN_STEPS})"
    return f"global step {step}, where the shortest training input ends"


def _examples_per_step(job: JobConfig, cluster: ClusterConfig) -> int:
    """Examples one global step trains on: with parameter servers, one worker's share."""
    examples = job.batch_size * job.gradient_accumulation_steps
    if job.strategy.name == "parameter_server":
        examples = max(1, examples // cluster.num_workers)
    return examples


def _trace(job: JobConfig, cluster: ClusterConfig) -> Tuple[tf.estimator.SessionRunHook, ...]:
    """The Chrome trace hook of --trace_every_steps, or none."""
    if not job.trace_every_steps:
        return ()
    traces = os.path.join(job.run.model_dir, "traces", cluster.role)
    return (tf.compat.v1.train.ProfilerHook(job.trace_every_steps, output_dir=traces),)


def _strategies(job: JobConfig, cluster: ClusterConfig) -> Tuple[Strategies, int]:
    """This task's strategies and training replicas, with the batch checked against them."""
    strategies = make_strategies(job.strategy, job.eval_strategy, cluster)
    train = strategies.train_distribute
    num_replicas = train.num_replicas_in_sync if train and cluster.task_type != EVALUATOR else 1
    check_batch(job.batch_size, job.micro_batches, num_replicas, f"{cluster.num_workers} worker(s)")
    return strategies, num_replicas


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
    checked: Preflight,
    estimator: tf.estimator.Estimator,
    max_steps: Optional[int],
) -> Tuple[tf.estimator.TrainSpec, tf.estimator.EvalSpec]:
    """The specs a program of plain TensorFlow would give these functions.

    With --stop_threshold, the early-stopping hook Model Garden's flag means:
    the task's run makes every task follow it.
    """
    hooks = []
    if job.stop_threshold is not None:
        hooks.append(
            tf.estimator.experimental.stop_if_higher_hook(
                estimator,
                "accuracy",
                job.stop_threshold,
                run_every_secs=None,
                run_every_steps=job.run.save_checkpoints_steps,
            )
        )
    exporters = export.make_exporters(
        checked.feature_specs, checked.exports, job.export_best_by, job.exports_to_keep
    )
    train_spec = tf.estimator.TrainSpec(checked.input_fn, max_steps=max_steps, hooks=hooks)
    start_delay_secs, throttle_secs = job.evaluation.or_else(
        NAMED_START_DELAY_SECS, NAMED_THROTTLE_SECS
    )
    eval_spec = tf.estimator.EvalSpec(
        checked.eval_input_fn,
        steps=checked.eval_steps,
        exporters=exporters,
        start_delay_secs=start_delay_secs,
        throttle_secs=throttle_secs,
    )
    return train_spec, eval_spec
