"""The JobSet and Indexed Job manifests run end to end, pods as processes in their own netns.

`tests/jobset_controller.py` stands in for JobSet, the Job controller and the
kubelet: a network namespace per pod, the pods' hosts in every pod's hosts file
(the headless Service), JobSet's labels through the downward API, the Job's
completion index, and the manifest's command as each pod's process. Each pod
builds its own TF_CONFIG (`estimator_dist.cluster.pod_env`). These tests delete the
worker pod mid-training and check that the kind's rule brings the job back from
the preemption checkpoint, no step lost, to exactly `--train_steps`; and that an
exit 2 fails the whole job without a restart. A TrainJob's pods are its
runtime's JobSet's (kinds_test.py checks the runtime holds the same spec).
"""

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from estimator_dist.base import exit_codes
from estimator_dist.base.files import checkpoint_step
from estimator_dist.report import status
from tests.jobset_controller import KindRun
from tests.pod_emulation import namespaces_unavailable, wait_for
from tests.procs import REPO, report

NAME = "digits"
STEPS = 300
EVERY = 50
#: The chief's and the worker's pod slot, by kind.
PODS = {
    "jobset": ("digits-train-0-0", "digits-train-0-1"),
    "indexed-job": ("digits-train-0", "digits-train-1"),
}


@pytest.fixture(scope="module")
def pods_allowed():
    """Skips, saying why, where network namespaces cannot be made (they need root)."""
    why = namespaces_unavailable()
    if why:
        pytest.skip(f"the pod emulation needs network namespaces: {why}")


def printed(kind, volume, data_dir):
    """What `python -m estimator_dist.manifest --kind=KIND` prints; `volume` stands for a claim."""
    command = [
        sys.executable,
        "-m",
        "estimator_dist.manifest",
        f"--kind={kind}",
        f"--name={NAME}",
        "--image=estimator-dist:test",
        "--num_workers=2",
        f"--pvc=runs:{volume}",
        "--backoff_limit=2",
        "--",
        f"--model_dir={volume}/model",
        f"--data_dir={data_dir}",
        f"--train_steps={STEPS}",
        f"--save_checkpoints_steps={EVERY}",
        "--communication=RING",
        "--log_step_count_steps=10",
        "--collective_timeout=30",
    ]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, report(f"exited {result.returncode}: {command}", result.stderr)
    return list(yaml.safe_load_all(result.stdout))


@pytest.mark.multiprocess
@pytest.mark.slow
@pytest.mark.timeout(400)
@pytest.mark.parametrize("kind", ["jobset", "indexed-job"])
def test_a_deleted_worker_pod_resumes_from_the_preemption_checkpoint(
    pods_allowed, tmp_path, data_dir, kind
):
    model_dir = str(tmp_path / "model")
    chief, worker = PODS[kind]
    with KindRun(printed(kind, tmp_path, data_dir), str(tmp_path / "logs"), backoff_secs=10) as run:
        wait_for(lambda: checkpoint_step(model_dir) > 0, 240, "a checkpoint past step 0", run)
        _, reached = run.wait_for_event(chief, status.Progress, 120, since=time.monotonic())
        deleted = time.monotonic()
        run.delete_pod(worker)
        wait_for(lambda: run.slots[chief].exit_codes, 60, "the chief's exit", run)
        decision = json.load(open(os.path.join(model_dir, "preemption", "decision.json")))
        resumed_at, first = run.wait_for_event(chief, status.FirstStep, 240, since=deleted)
        result = run.wait(timeout=300)
        logs = run.logs()
    saved = decision["saved_step"]
    codes = {name: run.slots[name].exit_codes for name in (chief, worker)}
    print(
        f"{kind}: worker deleted at step >= {reached.step}; preemption checkpoint {saved}; "
        f"training resumed at step {first.step}, {resumed_at - deleted:.1f} s after the "
        f"delete; JobSet restarts {run.restarts}; exit codes {codes}; final step "
        f"{checkpoint_step(model_dir)}"
    )
    assert result == "Succeeded", report(f"job {result}: {run.message}", logs)
    assert checkpoint_step(model_dir) == STEPS, report(
        f"latest step {checkpoint_step(model_dir)}", logs
    )
    assert decision["requested_by"] == "worker-0" and decision["done"], decision
    assert saved > reached.step, report(f"{decision}", logs)
    # The first step's global step races its increment: the saved step or the one after.
    assert first.step in (saved, saved + 1), report(f"resumed at {first.step}, saved {saved}", logs)
    assert codes == {chief: [exit_codes.PREEMPTED, 0], worker: [exit_codes.PREEMPTED, 0]}, codes
    if kind == "jobset":  # the whole set restarted once; every pod in a new sandbox
        assert run.restarts == 1 and all(s.created == 2 for s in run.slots.values())
    else:  # each training pod replaced alone, after the Job controller's back-off
        assert run.restarts == 0
        assert [run.slots[n].failures for n in (chief, worker)] == [1, 1]
        assert resumed_at - deleted >= 10


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["jobset", "indexed-job"])
def test_an_exit_2_fails_the_whole_job_without_a_restart(pods_allowed, tmp_path, data_dir, kind):
    docs = printed(kind, tmp_path, data_dir)
    # A pod that cannot build its TF_CONFIG exits 2 (pod_env.py): the subdomain edited out.
    for doc in docs:
        for container in _containers(doc):
            container["env"] = [
                e for e in container["env"] if e["name"] != "ESTIMATOR_DIST_SUBDOMAIN"
            ]
    with KindRun(docs, str(tmp_path / "logs")) as run:
        result = run.wait(timeout=90)
        logs = run.logs()
    assert result == "Failed", report(f"job {result}: {run.message}", logs)
    assert "PodFailurePolicy" in run.message, report(run.message, logs)
    assert run.restarts == 0
    created = [s.created for s in run.slots.values()]
    # The chief, the worker and the evaluator (manifests have one by default), each once.
    assert created == [1, 1, 1], report(f"pods created {created}", logs)
    assert exit_codes.USAGE in [c for s in run.slots.values() for c in s.exit_codes]
    assert "ESTIMATOR_DIST_SUBDOMAIN is unset" in "".join(logs.values()), logs


def _containers(value):
    if isinstance(value, list):
        return [c for item in value for c in _containers(item)]
    if not isinstance(value, dict):
        return []
    return [*value.get("containers", []), *_containers(list(value.values()))]
