"""A TFJob manifest run end to end as the Kubeflow training operator (v1) runs it.

`tests/tfjob_operator.py` stands in for the operator and the kubelet: a network
namespace per pod with its own address, the operator's service names in each
pod's hosts file, TF_CONFIG byte for byte as the operator writes it, and the
manifest's command and args as each pod's process. These tests give it what
`python -m estimator_dist.manifest` prints, and check that the job trains to
`--train_steps`, also when a pod is deleted mid-training and recreated.
"""

import json
import os
import subprocess
import sys
import time
import types

import pytest
import tensorflow as tf
import yaml

from estimator_dist.base import exit_codes
from estimator_dist.report import status
from tests.pod_emulation import namespaces_unavailable, wait_for
from tests.procs import REPO, report
from tests.tfjob_operator import TFJob, TFJobRun

NAME = "digits"
# Enough steps for the pod deletion to land mid-training, with room to spare: the worker is
# deleted after the first checkpoint (step 50) and the next progress line (step 60 to 70
# measured), and the preemption checkpoint followed at step 110 to 160.
STEPS = 400
EVERY = 50


def container(command, args):
    return {
        "name": "tensorflow",
        "image": "estimator-dist:test",
        "command": command,
        "args": args,
        "ports": [{"name": "tfjob-port", "containerPort": 2222}],
    }


def replica(count, command, args, policy="ExitCode", grace=30):
    return {
        "replicas": count,
        "restartPolicy": policy,
        "template": {
            "spec": {
                "terminationGracePeriodSeconds": grace,
                "containers": [container(command, args)],
            }
        },
    }


def tfjob(name, replicas, backoff_limit=3, clean="None", namespace="kubeflow"):
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "runPolicy": {"backoffLimit": backoff_limit, "cleanPodPolicy": clean},
            "tfReplicaSpecs": replicas,
        },
    }


@pytest.fixture(scope="module")
def pods_allowed():
    """Skips, saying why, where network namespaces cannot be made (they need root)."""
    why = namespaces_unavailable()
    if why:
        pytest.skip(f"the TFJob emulation needs network namespaces: {why}")


def test_tf_config_is_byte_for_byte_the_operators():
    job = TFJob.from_manifest(
        tfjob(
            "mnist",
            {
                "worker": replica(2, ["python"], []),
                "Chief": replica(1, ["python"], []),
                "Evaluator": replica(1, ["python"], []),
            },
        )
    )
    assert job.tf_config("Worker", 1) == (
        '{"cluster":{"chief":["mnist-chief-0.kubeflow.svc:2222"],'
        '"evaluator":["mnist-evaluator-0.kubeflow.svc:2222"],'
        '"worker":["mnist-worker-0.kubeflow.svc:2222","mnist-worker-1.kubeflow.svc:2222"]},'
        '"task":{"type":"worker","index":1},"environment":"cloud"}'
    )
    assert job.tf_config("Evaluator", 0, cluster_domain="cluster.local").startswith(
        '{"cluster":{"chief":["mnist-chief-0.kubeflow.svc.cluster.local:2222"],'
    )
    single = TFJob.from_manifest(tfjob("one", {"Worker": replica(1, ["python"], [])}))
    assert single.tf_config("Worker", 0) is None, "a one-replica job gets no TF_CONFIG"


def shell_job(name, script, **kwargs):
    """A chief that runs `script` under sh and a worker that exits 0: no Python started."""
    return tfjob(
        name,
        {
            "Chief": replica(1, ["sh", "-c"], [script], grace=2),
            "Worker": replica(1, ["sh", "-c"], ["exit 0"], grace=2),
        },
        **kwargs,
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "first_exit, backoff_limit, condition, replaced",
    [(137, 3, "Succeeded", 1), (155, 1, "Failed", 1), (1, 3, "Failed", 0)],
)
def test_exit_code_policy_replaces_the_pod_or_fails_the_job(
    pods_allowed, tmp_path, first_exit, backoff_limit, condition, replaced
):
    marker = tmp_path / "ran-once"
    script = f"[ -e {marker} ] && exit 0; touch {marker}; exit {first_exit}"
    manifest = shell_job("sh", script, backoff_limit=backoff_limit)
    with TFJobRun(manifest, str(tmp_path / "logs")) as run:
        result = run.wait(timeout=30)
        chief = run.replicas["sh-chief-0"]
        logs = run.logs()
    assert result == condition, report(f"job {result} ({run.message}), expected {condition}", logs)
    assert chief.replaced_after_failure == replaced, report("replacements", logs)
    assert chief.exit_codes[0] == first_exit, report(f"exit codes {chief.exit_codes}", logs)
    if replaced and condition == "Succeeded":
        assert chief.exit_codes == [first_exit, 0]
        assert chief.addresses[0] != chief.addresses[1], "a replaced pod gets a new sandbox"


def train_args(model_dir, data_dir):
    return [
        f"--model_dir={model_dir}",
        f"--data_dir={data_dir}",
        f"--train_steps={STEPS}",
        f"--save_checkpoints_steps={EVERY}",
        # Every checkpoint kept: with the default 5, a chief this fast once deleted the
        # checkpoint a late evaluator was exporting ("not a valid checkpoint", exit 5).
        f"--keep_checkpoint_max={STEPS // EVERY + 2}",
        "--communication=RING",
        "--eval_throttle_secs=1",
        "--log_step_count_steps=10",
        "--collective_timeout=30",
    ]


def manifest_text(tmp_path, model_dir, data_dir):
    """What `python -m estimator_dist.manifest` prints for a chief, a worker and an evaluator.

    `tmp_path` stands for a PersistentVolumeClaim mounted in every pod.
    """
    command = [
        sys.executable,
        "-m",
        "estimator_dist.manifest",
        f"--name={NAME}",
        "--image=estimator-dist:test",
        "--namespace=kubeflow",
        "--num_workers=2",
        "--evaluator",
        f"--pvc=runs:{tmp_path}",
        "--",
        *train_args(model_dir, data_dir),
    ]
    # Standard output only: TensorFlow's start-up lines and the warnings go to standard error.
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, report(f"exited {result.returncode}: {command}", result.stderr)
    return result.stdout


@pytest.fixture(scope="module")
def printed_manifest(tmp_path_factory, data_dir):
    """`(volume, text)`: the manifest printed once for a volume folder; the tests share it."""
    volume = str(tmp_path_factory.mktemp("volume"))
    return volume, manifest_text(volume, os.path.join(volume, "model"), data_dir)


def manifest(printed_manifest, tmp_path):
    """The printed manifest, its volume (and the model_dir in it) moved to `tmp_path`.

    One run of `estimator_dist.manifest` (a TensorFlow start-up) serves both jobs: each
    gets the same text with its own folder, so that their checkpoints stay apart.
    """
    volume, text = printed_manifest
    assert text.count(volume) >= 2, text  # the volume and the model_dir
    return yaml.safe_load(text.replace(volume, str(tmp_path)))


def latest_step(model_dir):
    latest = tf.train.latest_checkpoint(model_dir)
    return int(latest.rsplit("-", 1)[1]) if latest else 0


def pods(name):
    return (f"{name}-chief-0", f"{name}-worker-0", f"{name}-evaluator-0")


def assert_finished_at_max_steps(run, model_dir, logs):
    chief, worker, evaluator = pods(NAME)
    assert latest_step(model_dir) == STEPS, report(f"latest step {latest_step(model_dir)}", logs)
    final = json.load(open(os.path.join(model_dir, "eval_metrics.json")))
    assert final["final"] and final["metrics"]["global_step"] == STEPS, report(str(final), logs)
    for name in (chief, worker, evaluator):
        seen = run.replicas[name].tf_configs_seen
        assert seen and set(seen) == {run.replicas[name].tf_config}, report(
            f"{name} ran with TF_CONFIG {seen}, expected {run.replicas[name].tf_config}", logs
        )


def assert_peers_by_name(run, chief, worker):
    """The chief's and the worker's gRPC connections go to each other's pod address."""
    for here, there in ((chief, worker), (worker, chief)):
        address = run.replicas[there].pod.address
        assert run.resolve(here, run.replicas[there].host) == address
        wait_for(lambda h=here, a=address: a in run.peers(h), 30, f"{here} -> {address}", run)


def deleted_worker_job(tmp_path, printed_manifest):
    """The job of `manifest`, its worker pod deleted mid-training and recreated, to the end.

    One job serves both end-to-end tests (`shared_run`): it trains, a fault or not, to
    max steps with its final metrics, the chief and the worker reaching each other by
    their pods' names before the delete and after (`assert_peers_by_name`, which fails
    the run); then `test_tfjob_trains_...` checks how it ended and
    `test_deleted_worker_pod_...` how it came back. A job with no fault proves nothing
    this one does not: its first attempt is the same until the delete, and the ending
    is the same after it.
    """
    model_dir = str(tmp_path / "model")
    chief, worker, evaluator = pods(NAME)
    with TFJobRun(manifest(printed_manifest, tmp_path), str(tmp_path / "logs")) as run:
        wait_for(lambda: latest_step(model_dir) > 0, 300, "a checkpoint past step 0", run)
        _, reached = run.wait_for_event(chief, status.Progress, 120, since=time.monotonic())
        assert_peers_by_name(run, chief, worker)
        old_address = run.replicas[worker].pod.address
        deleted = time.monotonic()
        run.delete_pod(worker)
        wait_for(lambda: run.replicas[chief].exit_codes, 60, "the chief's exit", run)
        decision = json.load(open(os.path.join(model_dir, "preemption", "decision.json")))
        saved = latest_step(model_dir)
        resumed_at, first = run.wait_for_event(chief, status.FirstStep, 300, since=deleted)
        assert_peers_by_name(run, chief, worker)
        result = run.wait(timeout=400)
        codes = {name: run.wait_for_exit(name, 120) for name in (chief, worker, evaluator)}
        logs = run.logs()
    return types.SimpleNamespace(
        run=run,
        model_dir=model_dir,
        result=result,
        codes=codes,
        logs=logs,
        reached=reached,
        old_address=old_address,
        deleted=deleted,
        decision=decision,
        saved=saved,
        resumed_at=resumed_at,
        first=first,
    )


@pytest.fixture
def deleted_worker(pods_allowed, tmp_path_factory, printed_manifest, shared_run):
    return shared_run(
        "tfjob deleted worker",
        lambda: deleted_worker_job(tmp_path_factory.mktemp("deleted"), printed_manifest),
    )


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_tfjob_trains_to_max_steps_with_final_metrics(deleted_worker):
    job = deleted_worker
    chief, worker, evaluator = pods(NAME)
    assert job.result == "Succeeded", report(f"job {job.result}: {job.run.message}", job.logs)
    assert job.codes == {chief: 0, worker: 0, evaluator: 0}, report(
        f"exit codes {job.codes}", job.logs
    )
    assert_finished_at_max_steps(job.run, job.model_dir, job.logs)
    assert all(
        ".kubeflow.svc:2222" in a
        for a in json.loads(job.run.replicas[chief].tf_config)["cluster"]["worker"]
    )


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_deleted_worker_pod_is_recreated_and_the_job_ends_at_max_steps(deleted_worker):
    job = deleted_worker
    run, logs, saved, reached, first = job.run, job.logs, job.saved, job.reached, job.first
    decision = job.decision
    chief, worker, evaluator = pods(NAME)
    restarts = {
        name: (r.replaced_after_failure, r.recreated_after_delete, r.exit_codes)
        for name, r in run.replicas.items()
    }
    print(
        f"worker deleted at step >= {reached.step}; preemption checkpoint {saved}; training "
        f"resumed at step {first.step} {job.resumed_at - job.deleted:.1f} s after the delete; "
        f"(replaced, recreated, exit codes) per pod: {restarts}"
    )
    assert job.result == "Succeeded", report(f"job {job.result}: {run.message}", logs)
    assert job.codes == {chief: 0, worker: 0, evaluator: 0}, report(f"exit codes {job.codes}", logs)
    assert_finished_at_max_steps(run, job.model_dir, logs)
    assert run.replicas[worker].exit_codes[0] == exit_codes.PREEMPTED, report(str(restarts), logs)
    assert run.replicas[chief].exit_codes[0] == exit_codes.PREEMPTED, report(str(restarts), logs)
    assert (
        run.replicas[worker].recreated_after_delete,
        run.replicas[chief].replaced_after_failure,
    ) == (1, 1)
    assert run.replicas[evaluator].exit_codes == [0], report(str(restarts), logs)
    assert decision["requested_by"] == "worker-0" and decision["done"], decision
    assert decision["saved_step"] == saved > reached.step, report(f"{decision}, {saved}", logs)
    # The first step's global step is fetched in the session call that increments it, racing
    # the increment: it shows as the saved step or the one after.
    resumed = first.step
    assert resumed in (saved, saved + 1), report(f"resumed at {resumed}, saved {saved}", logs)
    assert run.replicas[worker].addresses[1] != job.old_address
