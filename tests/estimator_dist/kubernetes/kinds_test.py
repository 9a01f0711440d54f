"""`--kind=trainjob|jobset|indexed-job`: the documents, the pods they make, and their schemas.

Every pod of each kind is expanded as its controller makes it (`tests/jobset_controller.py`:
JobSet's labels through the downward API, the Indexed Job's completion index and
hostname) and must build, from that alone, the same cluster as every other pod
(`estimator_dist.cluster.pod_env`), each task once, at the address its peers reach.
"""

import subprocess
import sys

import pytest
import yaml

from estimator_dist.base import exit_codes
from estimator_dist.cluster.platform_env import cluster_from_environment
from estimator_dist.kubernetes import manifest as manifest_lib
from estimator_dist.kubernetes import validate
from tests import jobset_controller, procs
from tests.estimator_dist.manifest_test import run

NAME, IMAGE, REMOTE = "mnist", "registry.example.com/trainer:1.0", "--model_dir=gs://b/mnist"
NEW_KINDS = ("trainjob", "jobset", "indexed-job")
#: Training flags whose global batch divides over 3 workers.
TRAIN = (REMOTE, "--batch_size=66")


def documents(kind, capsys, *extra, workers=3, train=TRAIN):
    args = [f"--kind={kind}", f"--name={NAME}", f"--image={IMAGE}", f"--num_workers={workers}"]
    code, out, err = run([*args, *extra, "--", *train], capsys)
    assert code == 0, err
    return list(yaml.safe_load_all(out))


def job_specs(docs):
    """Every child Job spec of the manifest, by group."""
    kinds = {d["kind"]: d for d in docs}
    if "Job" in kinds:
        return {
            d["metadata"]["name"].rsplit("-", 1)[1]: d["spec"] for d in docs if d["kind"] == "Job"
        }
    spec = kinds["JobSet"]["spec"] if "JobSet" in kinds else kinds["TrainingRuntime"]["spec"]
    spec = spec if "JobSet" in kinds else spec["template"]["spec"]
    return {r["name"]: r["template"]["spec"] for r in spec["replicatedJobs"]}


@pytest.mark.parametrize("kind", NEW_KINDS)
@pytest.mark.parametrize("extra", [("--evaluator",), ("--evaluator", "--num_ps=2")])
def test_every_pod_builds_the_same_cluster_from_what_its_controller_gives(kind, extra, capsys):
    ps = ("--distribution_strategy=parameter_server",) if "--num_ps=2" in extra else ()
    docs = documents(kind, capsys, *extra, train=(*TRAIN, *ps))
    pods = jobset_controller.pods(docs)
    clusters = {pod.name: cluster_from_environment(dict(pod.env)) for pod in pods}
    jobs = {tuple(sorted(c.jobs.items())) for c in clusters.values()}
    assert len(jobs) == 1, jobs
    roles = sorted(c.role for c in clusters.values())
    expected = ["chief-0", "evaluator-0", "worker-0", "worker-1"]
    if "--num_ps=2" in extra:
        expected = sorted([*expected, "ps-0", "ps-1"])
    assert roles == expected
    by_role = {c.role: pod for pod, c in zip(pods, clusters.values())}
    for config in clusters.values():  # Each task's address is its own pod's name.
        for role, addresses in config.jobs.items():
            for index, address in enumerate(addresses):
                assert address == f"{by_role[f'{role}-{index}'].fqdn}:2222"


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_exit_codes_follow_the_contract_pods_never_restart_in_place(kind, capsys):
    for group, spec in job_specs(documents(kind, capsys, "--evaluator")).items():
        assert spec["completionMode"] == "Indexed"
        assert spec["template"]["spec"]["restartPolicy"] == "Never"
        fail, ignore = spec["podFailurePolicy"]["rules"]
        values = fail["onExitCodes"]["values"]
        assert (fail["action"], fail["onExitCodes"]["operator"]) == ("FailJob", "In")
        assert values == sorted(set(values)) and 0 not in values
        assert values == [c for c in range(1, 256) if not exit_codes.is_retryable(c)]
        assert exit_codes.USAGE in values and exit_codes.PREEMPTED not in values
        assert ignore == {
            "action": "Ignore",
            "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
        }
        if kind == "indexed-job":
            assert (spec["backoffLimitPerIndex"], spec["maxFailedIndexes"]) == (3, 0)
        else:  # A training pod's retryable failure fails its Job; JobSet restarts the set.
            assert spec["backoffLimit"] == (3 if group == "evaluator" else 0)


@pytest.mark.parametrize("kind", ("trainjob", "jobset"))
def test_the_jobset_fails_on_a_deterministic_exit_and_restarts_on_the_others(kind, capsys):
    docs = documents(
        kind,
        capsys,
        "--evaluator",
        "--num_ps=1",
        "--backoff_limit=5",
        train=(REMOTE, "--distribution_strategy=parameter_server"),
    )
    spec = docs[0]["spec"] if kind == "jobset" else docs[0]["spec"]["template"]["spec"]
    assert spec["failurePolicy"] == {
        "maxRestarts": 5,
        "rules": [
            {
                "action": "FailJobSet",
                "name": "deterministic-exit",
                "onJobFailureReasons": ["PodFailurePolicy"],
            }
        ],
    }
    assert spec["network"] == {
        "enableDNSHostnames": True,
        "publishNotReadyAddresses": True,
        "subdomain": NAME,
    }
    # Parameter servers never exit by themselves: the set succeeds without them.
    assert spec["successPolicy"] == {
        "operator": "All",
        "targetReplicatedJobs": ["train", "evaluator"],
    }
    assert [r["name"] for r in spec["replicatedJobs"]] == ["train", "ps", "evaluator"]
    assert {r["replicas"] for r in spec["replicatedJobs"]} == {1}


def test_the_trainjob_runs_its_own_plain_runtime_holding_the_jobset(capsys):
    runtime, job = documents("trainjob", capsys, "--evaluator")
    assert (runtime["apiVersion"], runtime["kind"]) == (
        "trainer.kubeflow.org/v1alpha1",
        "TrainingRuntime",
    )
    assert (job["apiVersion"], job["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    assert runtime["spec"]["mlPolicy"] == {"numNodes": 3}, "the plain policy: no framework's"
    assert job["spec"] == {
        "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime", "name": NAME}
    }
    jobset = documents("jobset", capsys, "--evaluator")[0]
    assert runtime["spec"]["template"]["spec"] == jobset["spec"]


def test_the_indexed_jobs_share_one_headless_service(capsys):
    service, *jobs = documents("indexed-job", capsys, "--evaluator")
    assert [j["metadata"]["name"] for j in jobs] == ["mnist-train", "mnist-evaluator"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"]
    assert [j["spec"]["completions"] for j in jobs] == [3, 1]


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_a_module_runs_through_the_script_entry_point_in_every_kind(kind, capsys):
    program = ("--job-dir=gs://bucket/census", "--train-files=gs://bucket/train.csv")
    docs = documents(kind, capsys, "--module=trainer.task", "--package_path=/app", train=program)
    for pod in jobset_controller.pods(docs):
        assert pod.command[:3] == ("python", "-m", "estimator_dist.script")
        assert pod.command[3:6] == (
            "--module=trainer.task",
            "--package_path=/app",
            "--model_dir=gs://bucket/census",
        )
        assert pod.command[-3:] == ("--", *program)


@pytest.mark.parametrize(
    "kind, extra, expected",
    [
        ("jobset", ("--name=" + "a" * 53, "--noevaluator"), "'" + "a" * 53 + "-train-0-2' (63"),
        ("indexed-job", ("--name=" + "a" * 60, "--noevaluator"), "-train-2' (68"),
        ("indexed-job", ("--name=" + "a" * 60,), "-evaluator-0' (72"),
        ("jobset", ("--env=ESTIMATOR_DIST_PORT=1",), "ESTIMATOR_DIST_*"),
        ("graph", (), "--kind"),
    ],
)
def test_usage_errors_exit_2(kind, extra, expected, capsys):
    args = [f"--kind={kind}", f"--name={NAME}", f"--image={IMAGE}", "--num_workers=3"]
    code, out, err = run([*args, *extra, "--", *TRAIN], capsys)
    if "(63" in expected:  # 63 characters fit; one more does not.
        assert code == 0, err
        code, out, err = run([*args, *extra[1:], "--name=" + "a" * 54, "--", *TRAIN], capsys)
        expected = "(64 characters)"
    assert code == exit_codes.USAGE, err
    assert out == "" and expected in err.splitlines()[0], err


# --- schemas: a document its schema refuses never leaves the command ------------------


@pytest.mark.parametrize(
    "kind, damage, schema",
    [
        ("indexed-job", lambda d: d[1]["spec"].update(backoffLimitPerIndx=1), "Kubernetes 1.33"),
        ("indexed-job", lambda d: d[0]["spec"]["ports"][0].update(port="grpc"), "Kubernetes 1.33"),
        ("jobset", lambda d: d[0]["spec"].update(maxRestarts=1), "JobsetV1alpha2JobSet"),
        ("trainjob", lambda d: d[0]["spec"]["mlPolicy"].update(numNodes="3"), "TrainingRuntime"),
        ("trainjob", lambda d: d[1]["spec"].update(runtime="x"), "TrainerV1alpha1TrainJob"),
        (
            "tfjob",
            lambda d: d[0]["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"].update(x=1),
            "spec.tfReplicaSpecs.Chief.template as a PodTemplate",
        ),
    ],
)
def test_a_document_the_schema_refuses_exits_2_and_prints_nothing(
    kind, damage, schema, capsys, monkeypatch
):
    build = manifest_lib.documents

    def damaged(settings):
        docs = build(settings)
        damage(docs)
        return docs

    monkeypatch.setattr(manifest_lib, "documents", damaged)
    code, out, err = run(
        [f"--kind={kind}", f"--name={NAME}", f"--image={IMAGE}", "--num_workers=2", "--", REMOTE],
        capsys,
    )
    assert code == exit_codes.USAGE, err
    assert out == ""
    assert "is refused by" in err and schema in err and "Nothing was printed" in err, err


@pytest.mark.parametrize("kind", ("tfjob", *NEW_KINDS))
def test_every_kind_passes_its_schemas(kind, capsys):
    extra = ("--evaluator", "--pvc=runs:/mnt/runs", "--gpus_per_worker=1", "--label=team=a")
    extra += ("--env=A=1", "--ttl_secs_after_finished=60", "--active_deadline_secs=600")
    docs = documents(kind, capsys, *extra, train=("--model_dir=/mnt/runs/m", "--batch_size=66"))
    validate.validate(docs)  # As generate() did: here it must pass, with every field set.
    containers = [c for d in docs for c in _containers(d)]
    assert {"nvidia.com/gpu": "1"} in [c.get("resources", {}).get("limits") for c in containers]
    assert all({"name": "A", "value": "1"} in c["env"] for c in containers)


def _containers(value):
    """Every container anywhere in a document."""
    if isinstance(value, list):
        return [c for item in value for c in _containers(item)]
    if not isinstance(value, dict):
        return []
    return [*value.get("containers", []), *_containers(list(value.values()))]


@pytest.mark.multiprocess
@pytest.mark.timeout(120)
def test_each_kind_imports_its_own_sdk_and_no_tensorflow():
    # `-X importtime` lists every module imported; the jobset builds with the Trainer SDK
    # and the Kubernetes client, the indexed-job with the client alone.
    for kind, absent in (("jobset", "kubeflow"), ("indexed-job", "kubeflow_trainer_api")):
        args = [f"--kind={kind}", f"--name={NAME}", f"--image={IMAGE}", "--num_workers=2"]
        command = [
            sys.executable,
            "-X",
            "importtime",
            "-m",
            "estimator_dist.manifest",
            *args,
            "--",
            REMOTE,
        ]
        result = subprocess.run(command, cwd=procs.REPO, capture_output=True, text=True, timeout=90)
        assert result.returncode == 0, procs.report(f"exited {result.returncode}", result.stderr)
        imported = {line.rpartition("|")[2].strip() for line in result.stderr.splitlines()}
        tops = {name.split(".")[0] for name in imported}
        assert "tensorflow" not in tops and "kubernetes" in tops, sorted(tops)
        assert absent not in tops, (kind, absent)
        if kind == "jobset":
            assert "kubeflow_trainer_api" in tops


@pytest.mark.parametrize(
    "kind, module", [("jobset", "kubeflow_trainer_api"), ("indexed-job", "kubernetes")]
)
def test_a_missing_sdk_names_the_extra_to_install(kind, module, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, module, None)
    args = [f"--kind={kind}", f"--name={NAME}", f"--image={IMAGE}", "--num_workers=3"]
    code, out, err = run([*args, "--", *TRAIN], capsys)
    assert code == exit_codes.FAILURE and out == ""
    assert f"--kind={kind}" in err and "pip install 'estimator-dist[kubernetes]'" in err, err
