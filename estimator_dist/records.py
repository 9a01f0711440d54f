"""The files a job leaves in model_dir besides checkpoints, and how they are read.

The chief writes `run_record.json` (what really ran: roles, strategy,
collectives, batches, inputs, versions) before training; the evaluator, or
a single process, writes `eval_metrics.json` after each evaluation, because
`tf.estimator.train_and_evaluate` returns nothing in multi-worker mode.
`job_view` is what every task must agree on at the rendezvous.

>>> format_metrics({"global_step": 400, "accuracy": 0.9625, "loss": 0.12})
'global_step=400, accuracy=0.9625, loss=0.1200'
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import json
import os
import platform
import socket
import time
from typing import Any, Iterator, Mapping, Optional

import tensorflow as tf

from estimator_dist import user_code
from estimator_dist.base.cluster import ClusterConfig
from estimator_dist.cpus import allowed_cores, onednn_enabled
from estimator_dist.job import JobConfig
from estimator_dist.preflight import Preflight
from run_config.strategies import Strategies

#: Written by the evaluator (or a single process) after each evaluation.
METRICS_FILE = "eval_metrics.json"

#: Written by the chief (or a single process) before training starts.
RUN_RECORD_FILE = "run_record.json"


class MetricsExporter(tf.estimator.Exporter):
    """Writes each evaluation's metrics to `model_dir/eval_metrics.json`.

    `tf.estimator.train_and_evaluate` returns None in multi-worker mode, so
    this exporter, which the evaluator calls after every evaluation, is where
    the final metrics come from. The file is replaced atomically.
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
        return self._path


def json_numbers(metrics: Mapping[str, Any]) -> dict:
    """An evaluation's dict with numpy numbers as Python numbers, for JSON."""
    return {key: _to_json_number(value) for key, value in metrics.items()}


def _to_json_number(value: Any) -> Any:
    try:
        return value.item()
    except AttributeError:
        return value


def write_json(path: str, data: Mapping[str, Any]) -> None:
    """Writes `data` as JSON to `path` atomically (a temporary file, then a rename)."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with tf.io.gfile.GFile(temporary, "w") as stream:
        stream.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    tf.io.gfile.rename(temporary, path, overwrite=True)


@contextlib.contextmanager
def model_dir_lock(model_dir: str, name: str) -> Iterator[None]:
    """Serialises one step across the tasks sharing a local model_dir.

    Args:
      model_dir: The shared directory; a remote one (`gs://...`) is not locked.
      name: Names the lock file, `model_dir/.<name>.lock`.
    """
    if "://" in model_dir:
        yield
        return
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, f".{name}.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def read_json(path: str) -> Optional[dict]:
    """The JSON object at `path`, or None when there is none (yet) or it is not JSON."""
    try:
        with tf.io.gfile.GFile(path) as stream:
            return json.loads(stream.read())
    except (tf.errors.NotFoundError, ValueError):
        return None


def checkpoint_step(model_dir: str) -> int:
    """Returns the global step of the latest checkpoint in `model_dir`, or 0 if none."""
    latest = tf.train.latest_checkpoint(model_dir)
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def mark_final_metrics(model_dir: str) -> Optional[dict]:
    """Marks the latest evaluation in `model_dir/eval_metrics.json` final; returns its metrics.

    For a job whose last step was decided after TensorFlow's evaluator could
    know it (early stopping, a train()/evaluate() program). None when there is none.
    """
    path = os.path.join(model_dir, METRICS_FILE)
    record = read_json(path)
    if record is None:
        return None
    write_json(path, {**record, "final": True})
    return record["metrics"]


def read_final_metrics(model_dir: str) -> Optional[dict]:
    """Returns the final evaluation metrics written to `model_dir`, or None."""
    path = os.path.join(model_dir, METRICS_FILE)
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as stream:
        record = json.load(stream)
    return record["metrics"] if record.get("final") else None


def format_metrics(metrics: Mapping[str, Any]) -> str:
    """Returns `metrics` as one line, global step first."""
    step = metrics.get("global_step")
    rest = ", ".join(
        f"{key}={value:.4f}" if isinstance(value, float) else f"{key}={value}"
        for key, value in sorted(metrics.items())
        if key != "global_step"
    )
    return f"global_step={step}, {rest}"


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
    """Describes what this job really runs: role, strategy, collectives, batches, inputs."""
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
