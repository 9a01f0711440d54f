"""Checkpoints that are always usable: real checkpoints, cut short or partial, are moved aside."""

import os
import shutil

import pytest
import tensorflow as tf

from estimator_dist.cluster.tf_config import ClusterConfig
from estimator_dist.guards import checkpoints
from estimator_dist.guards.checkpoints import problem, settle
from estimator_dist.tf_runtime import patches


def save_checkpoints(model_dir, steps):
    """Saves a real checkpoint (TensorFlow's V2 format, as Estimator writes) at each step."""
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.get_variable("kernel", shape=[64, 256], initializer=tf.ones_initializer())
        saver = tf.compat.v1.train.Saver(sharded=True, max_to_keep=10)
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for value in steps:
                session.run(step.assign(value))
                saver.save(session, os.path.join(model_dir, "model.ckpt"), global_step=value)


def data_file(model_dir, step):
    return os.path.join(model_dir, f"model.ckpt-{step}.data-00000-of-00001")


def cut_short(path):
    os.truncate(path, os.path.getsize(path) // 2)


def flip_a_byte(path):
    with open(path, "r+b") as stream:
        stream.seek(os.path.getsize(path) // 2)
        byte = stream.read(1)
        stream.seek(-1, os.SEEK_CUR)
        stream.write(bytes([byte[0] ^ 0xFF]))


@pytest.fixture
def model_dir(tmp_path):
    save_checkpoints(str(tmp_path), [100, 200, 300])
    return str(tmp_path)


def test_a_whole_checkpoint_has_no_problem(model_dir):
    assert problem(os.path.join(model_dir, "model.ckpt-300")) is None


@pytest.mark.parametrize(
    "damage, tag",
    [
        (lambda d: cut_short(data_file(d, 300)), "cut-short"),
        (lambda d: os.remove(data_file(d, 300)), "no-data"),
        (lambda d: os.remove(os.path.join(d, "model.ckpt-300.index")), "no-index"),
        (lambda d: open(os.path.join(d, "model.ckpt-300.index"), "wb").close(), "unreadable-index"),
        (lambda d: flip_a_byte(data_file(d, 300)), "corrupt-data"),
    ],
    ids=["data cut short", "data missing", "index missing", "index empty", "a byte flipped"],
)
def test_a_damaged_latest_checkpoint_is_moved_aside_and_the_previous_one_restored(
    model_dir, caplog, damage, tag
):
    damage(model_dir)
    assert problem(os.path.join(model_dir, "model.ckpt-300"))[0] == tag

    settled = settle(model_dir)

    assert settled.step == 200 and [s.tag for s in settled.skipped] == [tag]
    assert tf.train.latest_checkpoint(model_dir) == os.path.join(model_dir, "model.ckpt-200")
    state = tf.train.get_checkpoint_state(model_dir)
    assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
        "model.ckpt-100",
        "model.ckpt-200",
    ]
    aside = os.path.join(model_dir, "corrupt", f"model.ckpt-300.{tag}")
    assert os.listdir(aside) and not [n for n in os.listdir(model_dir) if "ckpt-300" in n]
    lines = [r.getMessage() for r in caplog.records if "skipped checkpoint" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith(
        "estimator_dist: skipped checkpoint model.ckpt-300 ("
    ), lines
    assert lines[0].endswith(f"moved to {model_dir}/corrupt/; resuming from model.ckpt-200.")


def test_the_cut_short_line_names_the_file_and_its_size(model_dir):
    cut_short(data_file(model_dir, 300))
    size = os.path.getsize(data_file(model_dir, 300))
    reason = problem(os.path.join(model_dir, "model.ckpt-300"))[1]
    assert f"model.ckpt-300.data-00000-of-00001 has {size:,} bytes" in reason, reason


def test_several_damaged_checkpoints_are_skipped_newest_first(model_dir):
    cut_short(data_file(model_dir, 300))
    os.remove(os.path.join(model_dir, "model.ckpt-200.index"))
    settled = settle(model_dir)
    assert settled.step == 100
    assert [(os.path.basename(s.prefix), s.tag) for s in settled.skipped] == [
        ("model.ckpt-300", "cut-short"),
        ("model.ckpt-200", "no-index"),
    ]
    # A later damage of the same step does not overwrite what was kept aside.
    save_checkpoints(model_dir, [300])
    cut_short(data_file(model_dir, 300))
    settle(model_dir)
    assert sorted(os.listdir(os.path.join(model_dir, "corrupt"))) == [
        "model.ckpt-200.no-index",
        "model.ckpt-300.cut-short",
        "model.ckpt-300.cut-short.2",
    ]


def test_with_no_usable_checkpoint_training_starts_afresh(model_dir):
    for step in (100, 200, 300):
        cut_short(data_file(model_dir, step))
    settled = settle(model_dir)
    assert settled.latest is None and settled.step == 0 and len(settled.skipped) == 3
    assert tf.train.latest_checkpoint(model_dir) is None
    assert "resuming from step 0 (none is left)" in checkpoints.describe(settled, model_dir)


def test_whole_checkpoints_and_a_missing_model_dir_are_left_alone(model_dir, tmp_path, caplog):
    before = sorted(os.listdir(model_dir))
    assert settle(model_dir).step == 300
    assert sorted(os.listdir(model_dir)) == before
    assert settle(str(tmp_path / "not-yet")).latest is None
    assert not [r for r in caplog.records if "estimator_dist:" in r.getMessage()]


def test_leftover_temp_directories_of_an_unfinished_save_are_removed(model_dir):
    temp = os.path.join(model_dir, "model.ckpt-400_temp")
    os.makedirs(temp)
    open(os.path.join(temp, "part-00000-of-00001.data-00000-of-00001"), "w").close()
    settled = settle(model_dir)
    assert settled.removed_temps == ("model.ckpt-400_temp",) and not os.path.exists(temp)
    assert settled.step == 300
    assert checkpoints.describe(settled, model_dir) == (
        "estimator_dist: removed model.ckpt-400_temp (left by a save that never finished)."
    )


@pytest.mark.parametrize("damaged", [False, True])
def test_an_unreadable_state_file_falls_back_to_the_files_and_is_written_again(model_dir, damaged):
    with open(os.path.join(model_dir, "checkpoint"), "w") as stream:
        stream.write("model_checkpoint_path: \x00garbage {{")
    if damaged:
        cut_short(data_file(model_dir, 300))
    step = 200 if damaged else 300
    assert settle(model_dir).step == step
    assert tf.train.latest_checkpoint(model_dir).endswith(f"model.ckpt-{step}")


def test_a_model_dir_without_a_state_file_is_left_to_start_afresh(model_dir):
    os.remove(os.path.join(model_dir, "checkpoint"))
    cut_short(data_file(model_dir, 300))
    assert settle(model_dir).latest is None
    assert not os.path.exists(os.path.join(model_dir, "corrupt"))


def test_the_evaluator_waits_for_the_chief_and_only_the_chief_settles(model_dir):
    cut_short(data_file(model_dir, 300))
    latest = os.path.join(model_dir, "model.ckpt-300")
    # Nobody moves it aside: after its timeout the evaluator goes on with what it found.
    assert checkpoints.wait_until_usable(model_dir, timeout=0) == latest
    worker = ClusterConfig({"chief": ["h:1"], "worker": ["h:2"]}, "worker", 0)
    checkpoints.settle_for_task(worker, model_dir, timeout=0)
    assert tf.train.latest_checkpoint(model_dir) == latest
    checkpoints.settle_for_task(ClusterConfig(), model_dir, timeout=0)  # A single process.
    assert checkpoints.wait_until_usable(model_dir, timeout=0).endswith("model.ckpt-200")


def session_at(model_dir):
    """Creates and closes a training session over `model_dir` with Estimator's saver hook."""
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.get_variable("kernel", shape=[64, 256], initializer=tf.ones_initializer())
        saver = tf.compat.v1.train.CheckpointSaverHook(model_dir, save_steps=100)
        creator = tf.compat.v1.train.ChiefSessionCreator(checkpoint_dir=model_dir)
        with tf.compat.v1.train.MonitoredSession(creator, hooks=[saver]) as session:
            return int(session.run(tf.compat.v1.train.get_global_step()))


@pytest.mark.parametrize("patched", [True, False], ids=["patched", "TensorFlow as is"])
def test_a_restored_checkpoint_is_not_saved_again_on_session_creation(model_dir, patched):
    index = os.path.join(model_dir, "model.ckpt-300.index")
    before = os.stat(index)
    if patched:
        patches.install()
    try:
        assert session_at(model_dir) == 300
    finally:
        patches.uninstall()
    after = os.stat(index)
    rewritten = (after.st_ino, after.st_mtime_ns) != (before.st_ino, before.st_mtime_ns)
    # The control shows the save that raced a restoring worker; the patch removes it.
    assert rewritten is not patched


def test_a_fresh_start_still_saves_its_first_step(tmp_path, patches_installed):
    assert session_at(str(tmp_path)) == 0
    assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model.ckpt-0")


def test_a_model_dir_copied_elsewhere_is_checked_where_it_is(model_dir, tmp_path_factory):
    # TensorFlow's Saver lists absolute paths: those of the original directory.
    copy = str(tmp_path_factory.mktemp("copy") / "run")
    shutil.copytree(model_dir, copy)
    cut_short(data_file(copy, 300))
    settled = settle(copy)
    assert settled.latest == os.path.join(copy, "model.ckpt-200")
    assert problem(os.path.join(model_dir, "model.ckpt-300")) is None  # The original untouched.
