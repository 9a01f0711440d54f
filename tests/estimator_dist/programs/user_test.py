"""The model_dir a program's estimator gets on a cluster (`user.shared_model_dir`)."""

import os

import tensorflow as tf

from estimator_dist.programs.user import shared_model_dir


def test_each_estimator_without_a_model_dir_gets_a_shared_directory_of_its_own():
    # Plain TensorFlow gives each a new temporary directory: they never share checkpoints.
    handed_out = {}
    first, second = {}, {}
    assert shared_model_dir(first, "/job", set(), "an Estimator", handed_out) == "/job"
    assert shared_model_dir(second, "/job", set(), "an Estimator", handed_out) == os.path.join(
        "/job", "estimator-2"
    )
    assert (first["model_dir"], second["model_dir"]) == ("/job", "/job/estimator-2")


def test_estimators_given_one_temporary_directory_share_one_directory(tmp_path):
    made = str(tmp_path / "tmpabc")
    handed_out, temporary = {}, {made}
    other = {"model_dir": None}
    shared_model_dir(other, "/job", temporary, "an Estimator", handed_out)
    again = [{"model_dir": made}, {"model_dir": made}]
    given = [shared_model_dir(a, "/job", temporary, "an Estimator", handed_out) for a in again]
    assert given == ["/job/estimator-2", "/job/estimator-2"]


def test_a_directory_the_program_chose_is_left_alone_and_takes_no_turn():
    handed_out = {}
    chosen = {"model_dir": "/data/run1"}
    assert shared_model_dir(chosen, "/job", set(), "an Estimator", handed_out) == "/data/run1"
    assert chosen == {"model_dir": "/data/run1"} and handed_out == {}
    assert shared_model_dir({}, "/job", set(), "an Estimator", handed_out) == "/job"


def test_a_run_config_naming_a_temporary_directory_is_given_the_shared_one(tmp_path):
    made = str(tmp_path / "tmpabc")
    arguments = {"config": tf.estimator.RunConfig(model_dir=made)}
    shared_model_dir(arguments, "/job", {made}, "an Estimator", {})
    assert arguments["config"].model_dir == "/job" and arguments["model_dir"] == "/job"


def test_one_process_without_a_job_directory_leaves_the_call_its_own():
    arguments = {}
    assert shared_model_dir(arguments, None, set(), "an Estimator", {}) is None
    assert arguments == {}
