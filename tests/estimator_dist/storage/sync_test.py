"""Checkpoints and coordination files moved to and from a real S3-protocol server (moto's).

A half-uploaded checkpoint (what a chief killed during an upload leaves) is
never the one a task restores; refused credentials, a missing bucket and a
server that does not answer each give their one-line error.
"""

import os

import pytest
import tensorflow as tf

from estimator_dist.base.errors import StorageUnreachableError, UsageError
from estimator_dist.storage import sync
from estimator_dist.storage.remote import NO_BUCKET, Remote, check_access
from tests.s3_server import S3Server

pytestmark = pytest.mark.multiprocess  # The server is a process of its own.


@pytest.fixture(scope="module")
def server():
    with S3Server() as running:
        yield running


@pytest.fixture
def aws(server, monkeypatch):
    for name, value in server.env.items():
        monkeypatch.setenv(name, value)
    return server


def save_checkpoints(directory, steps):
    """Real checkpoints of one variable at `steps`, written as Estimator's Saver writes them."""
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.get_variable("w", initializer=tf.ones([64]))
        saver = tf.compat.v1.train.Saver(max_to_keep=2)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for value in steps:
                session.run(step.assign(value))
                saver.save(session, os.path.join(directory, "model.ckpt"), global_step=value)


def test_the_chief_uploads_each_checkpoint_whole_and_removes_rotated_ones(aws, tmp_path):
    url = "s3://bucket/publish"
    chief = tmp_path / "chief"
    publisher = sync.Publisher(url, str(chief), "chief", poll_secs=0.05)
    publisher.start()
    try:
        save_checkpoints(str(chief), [10])
        assert publisher.flush(60), publisher.failing
        save_checkpoints(str(chief), [20, 30])  # Keeps 2: model.ckpt-10 is rotated away.
        assert publisher.flush(60), publisher.failing
    finally:
        publisher.stop()
    remote = Remote(url)
    latest, kept = sync.parse_state(remote.read(sync.STATE_FILE))
    # model.ckpt-20 is uploaded only if the thread saw it before model.ckpt-30 replaced it.
    assert (latest, set(kept) - {"model.ckpt-20"}) == ("model.ckpt-30", {"model.ckpt-30"})
    assert not [name for name in remote.listing() if name.startswith("model.ckpt-10.")]
    restored = tmp_path / "worker"
    assert sync.restore_latest(remote, str(restored)) == "model.ckpt-30"
    assert tf.train.latest_checkpoint(str(restored)) == str(restored / "model.ckpt-30")
    reader = tf.train.load_checkpoint(str(restored / "model.ckpt-30"))
    assert reader.get_tensor("global_step") == 30


def test_checkpoint_uploads_start_at_most_every_checkpoint_secs_and_a_flush_sends_the_newest(
    aws, tmp_path
):
    url = "s3://bucket/floor"
    chief = tmp_path / "chief"
    remote = Remote(url)
    publisher = sync.Publisher(url, str(chief), "chief", checkpoint_secs=3600)
    save_checkpoints(str(chief), [10])
    publisher.cycle()  # The first upload starts at once.
    assert sync.parse_state(remote.read(sync.STATE_FILE))[0] == "model.ckpt-10"
    save_checkpoints(str(chief), [20])
    publisher.cycle()  # Within checkpoint_secs of the last: left for later.
    assert sync.parse_state(remote.read(sync.STATE_FILE))[0] == "model.ckpt-10"
    assert [name for name, _ in publisher.uploads] == ["model.ckpt-10"]
    publisher.start()
    try:
        assert publisher.flush(60), publisher.failing
    finally:
        publisher.stop()
    assert sync.parse_state(remote.read(sync.STATE_FILE))[0] == "model.ckpt-20"


def test_a_half_uploaded_checkpoint_is_never_restored(aws, tmp_path):
    url = "s3://bucket/half"
    chief = tmp_path / "chief"
    save_checkpoints(str(chief), [10])
    publisher = sync.Publisher(url, str(chief), "chief", poll_secs=0.05)
    publisher.start()
    assert publisher.flush(60), publisher.failing
    publisher.stop()
    save_checkpoints(str(chief), [20])
    remote = Remote(url)
    # What a chief killed during the upload of step 20 leaves: its data, no index, no state.
    for name in sync.local_files(str(chief), "model.ckpt-20"):
        if ".data-" in name:
            remote.put(str(chief / name), name)
    assert sync.restore_latest(remote, str(tmp_path / "restarted")) == "model.ckpt-10"
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(tmp_path / "restarted")))
    assert reader.get_tensor("global_step") == 10


def test_a_restart_follows_the_storage_not_a_newer_local_checkpoint(aws, tmp_path):
    url = "s3://bucket/truth"
    chief = tmp_path / "chief"
    save_checkpoints(str(chief), [10])
    remote = Remote(url)
    for name in sync.local_files(str(chief), "model.ckpt-10"):
        remote.put(str(chief / name), name)
    remote.write(sync.STATE_FILE, sync.state_text("model.ckpt-10", ["model.ckpt-10"]))
    save_checkpoints(str(chief), [20])  # Saved, never uploaded: the other tasks never see it.
    assert sync.restore_latest(remote, str(chief)) == "model.ckpt-10"
    assert tf.train.latest_checkpoint(str(chief)) == str(chief / "model.ckpt-10")
    empty = tmp_path / "empty"
    save_checkpoints(str(empty), [5])
    assert sync.restore_latest(Remote("s3://bucket/nothing"), str(empty)) is None
    assert tf.train.latest_checkpoint(str(empty)) is None


def test_a_checkpoint_rotated_away_during_its_download_gives_way_to_the_newer_one(aws, tmp_path):
    # What an evaluator starting mid-job met: the state named model.ckpt-10, and the chief
    # uploaded model.ckpt-20 and removed model.ckpt-10 before its files were fetched.
    chief = tmp_path / "chief"
    save_checkpoints(str(chief), [10, 20])
    remote = Remote("s3://bucket/rotated")
    for step in (10, 20):
        for name in sync.local_files(str(chief), f"model.ckpt-{step}"):
            remote.put(str(chief / name), name)
    remote.write(sync.STATE_FILE, sync.state_text("model.ckpt-10", ["model.ckpt-10"]))

    class RotatedDuringTheDownload(Remote):
        def get(self, relative, local):
            if relative.startswith("model.ckpt-10."):
                self.write(sync.STATE_FILE, sync.state_text("model.ckpt-20", ["model.ckpt-20"]))
                self.remove(sync.local_files(str(chief), "model.ckpt-10"))
            super().get(relative, local)

    evaluator = tmp_path / "evaluator"
    restored = sync.restore_latest(RotatedDuringTheDownload(remote.url), str(evaluator))
    assert restored == "model.ckpt-20"
    assert tf.train.latest_checkpoint(str(evaluator)) == str(evaluator / "model.ckpt-20")


def test_the_evaluator_downloads_each_new_checkpoint(aws, tmp_path):
    url = "s3://bucket/fetch"
    chief, evaluator = tmp_path / "chief", tmp_path / "evaluator"
    publisher = sync.Publisher(url, str(chief), "chief", poll_secs=0.05)
    fetcher = sync.Fetcher(url, str(evaluator), poll_secs=0.05, keep=2)
    publisher.start()
    fetcher.start()
    try:
        for step in (10, 20, 30):
            save_checkpoints(str(chief), [step])
            assert publisher.flush(60) and fetcher.flush(60), (publisher.failing, fetcher.failing)
            assert tf.train.latest_checkpoint(str(evaluator)) == str(
                evaluator / f"model.ckpt-{step}"
            )
    finally:
        publisher.stop()
        fetcher.stop()
    assert not sync.local_files(str(evaluator), "model.ckpt-10")  # Keeps 2 locally.


def test_coordination_files_travel_both_ways_and_so_do_removals(aws, tmp_path):
    url = "s3://bucket/mirror"
    chief, worker = tmp_path / "chief", tmp_path / "worker"
    (worker / "preemption").mkdir(parents=True)
    (worker / "preemption" / "stale.json").write_text("{}")  # From an earlier attempt: dropped.
    mirrors = [
        sync.Mirror(url, str(d), ["preemption", "last_step.json"], 0.05) for d in (chief, worker)
    ]
    for mirror in mirrors:
        mirror.start()
    try:
        (worker / "preemption" / "request-worker-0.json").write_text('{"step": 5}')
        assert mirrors[1].flush(60) and mirrors[0].flush(60)
        assert (chief / "preemption" / "request-worker-0.json").read_text() == '{"step": 5}'
        assert not (chief / "preemption" / "stale.json").exists()
        (chief / "preemption" / "decision.json").write_text('{"stop_at": 9}')
        (chief / "last_step.json").write_text('{"last_step": 9}')
        os.remove(chief / "preemption" / "request-worker-0.json")
        assert mirrors[0].flush(60) and mirrors[1].flush(60)
        assert (worker / "preemption" / "decision.json").read_text() == '{"stop_at": 9}'
        assert (worker / "last_step.json").read_text() == '{"last_step": 9}'
        assert not (worker / "preemption" / "request-worker-0.json").exists()
    finally:
        for mirror in mirrors:
            mirror.stop()


def test_fail_with_refused_credentials(aws, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(UsageError) as raised:
        check_access("s3://bucket/run1", "chief-0")
    message = str(raised.value)
    assert message.startswith("s3://bucket/run1: the storage refused access (PermissionError: ")
    assert "AWS_ACCESS_KEY_ID" in message and "\n" not in message


def test_fail_with_a_missing_bucket(aws):
    with pytest.raises(UsageError) as raised:
        check_access("s3://no-such-bucket/run1", "chief-0")
    detail = str(raised.value).split("(", 1)[1].rsplit(")", 1)[0]
    assert str(raised.value) == NO_BUCKET.format(
        url="s3://no-such-bucket/run1", bucket="no-such-bucket", detail=detail
    )


def test_fail_with_a_server_that_does_not_answer(aws, monkeypatch):
    import portpicker

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{portpicker.pick_unused_port()}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    with pytest.raises(StorageUnreachableError) as raised:
        check_access("s3://bucket/run1", "chief-0")
    assert str(raised.value).startswith("s3://bucket/run1: the storage cannot be reached (")
    assert raised.value.exit_code == 160


def test_the_launcher_reads_the_step_and_final_metrics_at_the_url(aws, tmp_path):
    from estimator_dist.storage.job import JobResults

    results = JobResults("s3://bucket/launcher", work_dir=str(tmp_path))
    assert results.synced and results.local_dir == str(tmp_path / "s3/bucket/launcher/launcher")
    assert (results.checkpoint_step(), results.final_metrics()) == (0, None)
    remote = Remote("s3://bucket/launcher")
    remote.write(sync.STATE_FILE, sync.state_text("model.ckpt-40", ["model.ckpt-40"]))
    remote.write("eval_metrics.json", b'{"final": true, "metrics": {"global_step": 40}}')
    remote.write("preemption/decision.json", b"{}")
    assert (results.checkpoint_step(), results.final_metrics()) == (40, {"global_step": 40})
    results.remove("preemption")
    assert remote.listing("preemption") == {}
    os.makedirs(os.path.join(results.local_dir, "logs"))
    with open(os.path.join(results.local_dir, "logs", "chief-0.log"), "w") as stream:
        stream.write("a task's log\n")
    results.upload_logs()
    assert remote.read("logs/chief-0.log") == b"a task's log\n"
