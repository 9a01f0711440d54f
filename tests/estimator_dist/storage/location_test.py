"""Where a task works and where the job's results live: every case, and each refusal."""

import pytest

from estimator_dist.base.errors import UsageError
from estimator_dist.config.train_args import job_from_args
from estimator_dist.storage.location import NOT_A_URL, TWO_URLS, WORK_DIR_ENV, is_url, place


def test_a_local_or_gs_model_dir_is_written_directly():
    for model_dir in ("/shared/run1", "relative/run1", "gs://bucket/run1", "hdfs://nn/run1"):
        placement = place(model_dir, None)
        assert not placement.synced
        assert placement.local_dir("worker-0") == model_dir


def test_an_s3_model_dir_gives_each_task_a_directory_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setenv(WORK_DIR_ENV, str(tmp_path))
    placement = place("s3://bucket/runs/1/", None)
    assert placement.url == "s3://bucket/runs/1"
    dirs = {role: placement.local_dir(role) for role in ("chief-0", "worker-0", "evaluator-0")}
    assert dirs["chief-0"] == str(tmp_path / "s3" / "bucket" / "runs" / "1" / "chief-0")
    assert len(set(dirs.values())) == 3  # No two tasks share a directory: no shared file system.
    assert not any("s3:" in path for path in dirs.values())


def test_storage_keeps_model_dir_as_the_local_directory_of_every_task():
    placement = place("/data/run1", "az://container/run1/")
    assert placement.url == "az://container/run1"
    assert placement.local_dir("chief-0") == placement.local_dir("worker-3") == "/data/run1"


def test_fail_with_storage_that_is_not_a_url():
    with pytest.raises(UsageError) as raised:
        place("/data/run1", "/mnt/bucket")
    assert str(raised.value) == NOT_A_URL.format(storage="/mnt/bucket")


def test_fail_with_storage_and_a_url_model_dir():
    with pytest.raises(UsageError) as raised:
        place("s3://b/run1", "s3://b/run2")
    assert str(raised.value) == TWO_URLS.format(storage="s3://b/run2", model_dir="s3://b/run1")


def test_the_job_refuses_a_bad_storage_flag_as_a_usage_error():
    with pytest.raises(UsageError, match="is not a URL"):
        job_from_args(["--model_dir=/tmp/run1", "--storage=bucket/run1"])
    job = job_from_args(["--model_dir=/tmp/run1", "--storage=s3://bucket/run1"])
    assert job.storage == "s3://bucket/run1"


@pytest.mark.parametrize(
    "path, expected",
    [("s3://b/k", True), ("gs://b", True), ("/tmp/x", False), ("C:/x", False), ("", False)],
)
def test_is_url(path, expected):
    assert is_url(path) is expected
