"""`ManifestSettings` and the TFJob built from it, without the command line."""

import doctest
import json

import pytest
import yaml

from estimator_dist.base.errors import UsageError
from estimator_dist.cluster.tf_config import parse_tf_config
from estimator_dist.config.shape import JobShape
from estimator_dist.kubernetes import job_settings, pod, tfjob
from estimator_dist.kubernetes.job_settings import Mount


def settings(num_workers=3, num_ps=0, evaluator=False, **overrides):
    values = dict(
        name="mnist",
        image="trainer:1",
        model_dir="gs://bucket/run1",
        train_args=("--model_dir=gs://bucket/run1",),
        shape=JobShape(num_workers, num_ps, evaluator),
    )
    values.update(overrides)
    return job_settings.ManifestSettings(**values)


def test_docstring_examples_hold():
    assert doctest.testmod(tfjob).failed == 0


def test_every_task_parses_the_tf_config_the_operator_writes():
    job = settings(evaluator=True, num_ps=2, namespace="team-a")
    for kind, count in tfjob.replicas(job).items():
        for index in range(count):
            cluster = parse_tf_config(json.dumps(tfjob.operator_tf_config(job, kind, index)))
            assert (cluster.task_type, cluster.task_index) == (kind.lower(), index)
            assert cluster.num_workers == 3 and cluster.num_ps == 2
            assert "evaluator" not in cluster.jobs
    chief = tfjob.operator_tf_config(job, tfjob.CHIEF, 0)
    assert chief["cluster"]["worker"][1] == "mnist-worker-1.team-a.svc:2222"
    assert chief["cluster"]["evaluator"] == ["mnist-evaluator-0.team-a.svc:2222"]


@pytest.mark.parametrize(
    "model_dir, mounts",
    [
        ("s3://bucket/run1", ()),
        ("hdfs://namenode/run1", ()),
        ("/mnt/runs", (Mount("runs", "/mnt/runs"),)),
        ("/mnt/runs/a/../b", (Mount("runs", "/mnt/runs"),)),
    ],
)
def test_a_shared_model_dir_is_accepted(model_dir, mounts):
    assert settings(model_dir=model_dir, mounts=mounts).model_dir == model_dir


@pytest.mark.parametrize(
    "model_dir", ["/mnt/runsX/run1", "/mnt/run1", "runs/run1", "/mnt/runs/../x", "file:///x"]
)
def test_a_model_dir_outside_every_mount_is_refused(model_dir):
    with pytest.raises(UsageError, match="under no shared volume"):
        settings(model_dir=model_dir, mounts=(Mount("runs", "/mnt/runs"),))


@pytest.mark.parametrize(
    "text, message",
    [
        ("runs", "expected CLAIM:/mount/path"),
        ("Runs:/mnt/runs", "is not a PersistentVolumeClaim name"),
        ("runs:mnt/runs", "must be an absolute directory"),
        ("runs:/", "must be an absolute directory"),
    ],
)
def test_bad_mounts_are_refused(text, message):
    with pytest.raises(UsageError, match=message):
        Mount.parse(text)


def test_two_claims_at_one_path_are_refused():
    mounts = (Mount.parse("a:/mnt/x"), Mount.parse("b:/mnt/x/"))
    with pytest.raises(UsageError, match="same path"):
        settings(model_dir="/mnt/x/run", mounts=mounts)


@pytest.mark.parametrize(
    "workers, evaluator, longest", [(11, True, 51), (11, False, 54), (1, False, 55)]
)
def test_the_name_leaves_room_for_the_longest_service_name(workers, evaluator, longest):
    settings(name="a" * longest, num_workers=workers, evaluator=evaluator)
    with pytest.raises(UsageError, match=f"use at most {longest} characters"):
        settings(name="a" * (longest + 1), num_workers=workers, evaluator=evaluator)


def test_the_yaml_has_no_empty_fields_and_keeps_the_sdk_order():
    built = pod.serialize(tfjob.build_tfjob(settings(num_workers=1)))
    document = yaml.safe_load(pod.to_yaml([built]))
    assert list(document) == ["apiVersion", "kind", "metadata", "spec"]
    assert document["metadata"] == {"name": "mnist", "namespace": "default"}
    assert list(document["spec"]["tfReplicaSpecs"]) == ["Chief"]
    container = document["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]
    assert container["resources"] == {} and container["volumeMounts"] == []
    assert document["spec"]["runPolicy"] == {"backoffLimit": 3, "cleanPodPolicy": "Running"}
