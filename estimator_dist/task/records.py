"""What a task records of its job: the run record, the evaluator's metrics, the job's view.

Where these files live and how they are read is `estimator_dist.base.files`.
The chief writes `run_record.json` (what really ran: roles, strategy,
collectives, batches, the precision and why, inputs, versions) before training; the evaluator, or
a single process, writes `eval_metrics.json` after each evaluation, because
`tf.estimator.train_and_evaluate` returns nothing in multi-worker mode.
`job_view` is what every task must agree on at the rendezvous.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import time
from typing import Any, Mapping, Optional

import tensorflow as tf

from estimator_dist.base.files import METRICS_FILE, json_numbers, write_json
from estimator_dist.cluster.tf_config import ClusterConfig
from estimator_dist.config.job import JobConfig
from estimator_dist.hardware import precision
from estimator_dist.hardware.cpus import allowed_cores, onednn_enabled
from estimator_dist.report import status
from estimator_dist.task import user_code
from estimator_dist.task.preflight import Preflight
from run_config.strategies import Strategies


class MetricsExporter(tf.estimator.Exporter):
    """Writes each evaluation's metrics to `model_dir/eval_metrics.json`.

    `tf.estimator.train_and_evaluate` returns None in multi-worker mode, so
    this exporter, which the evaluator calls after every evaluation, is where
    the final metrics come from. The file is replaced atomically, and the
    launcher is told (`status.Evaluated`, the scalar metrics).
    """

    def __init__(self, model_dir: str) -> None:
        self._path = os.path.join(model_dir, METRICS_FILE)
        self.final_metrics: Optional[dict] = None

    @property
    def name(self) -> str:
        return "metrics"

    def export(
        self,
        estimator: tf.estimator.Estimator,
        export_path: str,
        checkpoint_path: str,
        eval_result: Mapping[str, Any],
        is_the_final_export: bool,
    ) -> str:
        metrics = json_numbers(eval_result)
        record = {
            "metrics": metrics,
            "checkpoint": checkpoint_path,
            "final": bool(is_the_final_export),
        }
        write_json(self._path, record)
        if is_the_final_export:
            self.final_metrics = metrics
        numbers = {
            key: value
            for key, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        }
        status.emit(
            status.Evaluated(
                step=int(numbers.get("global_step", -1)),
                metrics=numbers,
                final=bool(is_the_final_export),
            )
        )
        return self._path


def library_versions() -> dict:
    """Versions of Python, TensorFlow and the packages a run record names."""
    versions = {"python": platform.python_version(), "tensorflow": tf.__version__}
    for distribution in ("tensorflow-estimator", "keras", "tensorflow-datasets", "estimator-dist"):
        try:
            versions[distribution] = importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            versions[distribution] = None
    return versions


def make_run_record(
    job: JobConfig,
    cluster: ClusterConfig,
    strategies: Strategies,
    num_replicas: int,
    checked: Optional[Preflight] = None,
) -> dict:
    """Describes what this job runs: role, strategy, collectives, batches, precision, inputs."""
    train = strategies.train_distribute
    per_replica = job.batch_size // num_replicas
    inputs = {"train": job.input_fn, "eval": job.eval_input_name}
    if checked is not None:
        inputs["eval_steps"] = checked.eval_steps
        inputs["sharded_by_input_context"] = user_code.takes_input_context(checked.input_fn)
    return {
        "role": cluster.role,
        "task_type": cluster.task_type,
        "task_index": cluster.task_index,
        "host": socket.gethostname(),
        "cluster": {name: list(addresses) for name, addresses in cluster.jobs.items()},
        "tf_config_normalisations": list(cluster.notes),
        "num_workers": cluster.num_workers,
        "num_ps": cluster.num_ps,
        "num_replicas": num_replicas,
        "strategy": strategies.train_name,
        "strategy_class": type(train).__name__ if train is not None else None,
        "devices": list(strategies.devices),
        "num_gpus": strategies.num_gpus,
        "eval_strategy": strategies.eval_name,
        "communication_requested": strategies.communication,
        "communication_used": strategies.effective_communication,
        "global_batch_size": job.batch_size,
        "per_worker_batch_size": per_replica * max(1, num_replicas // cluster.num_workers),
        "per_replica_batch_size": per_replica,
        "gradient_accumulation_steps": job.gradient_accumulation_steps,
        "effective_global_batch_size": job.batch_size * job.gradient_accumulation_steps,
        "micro_batches": job.micro_batches,
        "per_replica_micro_batch_size": per_replica // job.micro_batches,
        "bytes_per_pack": job.strategy.bytes_per_pack,
        "gradient_wire_dtype": job.strategy.gradient_wire_dtype,
        "mixed_precision": precision.resolve(
            job.run.precision.mixed_precision, job.strategy.num_gpus
        ).to_record(),
        "input_fns": inputs,
        "onednn": onednn_enabled(),
        "session_threads": {
            "intra_op": job.run.intra_op_threads,
            "inter_op": job.run.inter_op_threads,
        },
        "cores": allowed_cores(),
        "versions": library_versions(),
        "config": job.to_dict(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def job_view(job: JobConfig, cluster: ClusterConfig) -> dict:
    """The settings every task of a cluster must agree on, for the rendezvous."""
    model_dir = job.run.model_dir
    return {
        "cluster": {name: list(addresses) for name, addresses in cluster.jobs.items()},
        "model_dir": model_dir if "://" in model_dir else os.path.abspath(model_dir),
        "strategy": job.strategy.name,
        "communication": job.strategy.communication,
        "collective_timeout": job.strategy.collective_timeout_seconds,
        "bytes_per_pack": job.strategy.bytes_per_pack,
        "gradient_wire_dtype": job.strategy.gradient_wire_dtype,
        "mixed_precision": job.run.precision.mixed_precision,
        "train_steps": job.train_steps,
        "batch_size": job.batch_size,
        "gradient_accumulation_steps": job.gradient_accumulation_steps,
        "micro_batches": job.micro_batches,
        "model": job.keras_model or job.estimator or job.model_fn,
        "input_fn": job.input_fn,
        "eval_input_fn": job.eval_input_name,
        "params": job.to_dict()["params"],
        "tensorflow": tf.__version__,
    }
