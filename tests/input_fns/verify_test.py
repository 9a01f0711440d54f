"""Sharding verification: disjoint and complete shards for 2 and 3 workers, every reader.

In-process tests build each worker's pipeline with its own InputContext, as
the strategy does; two end-to-end tests run real workers through the
launcher. Negative controls (a forgotten shard, a missing file, a pipeline
stopped early) show that the check fails when sharding is broken.
"""

import dataclasses
import os

import pytest
import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.task import pitfalls, user_code
from input_fns import csv_input, digits, ids, tfrecord, verify
from input_fns.convert import ConvertConfig, convert, training_params
from tests.input_fns import data
from tests.procs import run_module

TIMEOUT = 240


def check(input_fn, params, workers, directory, reference):
    recorded = verify.simulate(input_fn, params, workers, str(directory))
    return verify.check_sharding(recorded, reference)


READERS = {
    "tfrecord": lambda root, files, n: (
        tfrecord.input_fn,
        data.tfrecord_params(data.write_tfrecords(root, files, n), id_feature="id"),
    ),
    "csv": lambda root, files, n: (
        csv_input.input_fn,
        data.csv_params(data.write_csv(root, files, n), id_feature="id"),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize(
    "files", [6, 5, 1], ids=["files-divisible", "files-not-divisible", "one-file-by-record"]
)
def test_file_readers_shards_are_disjoint_and_complete_for_2_and_3_workers(tmp_path, reader, files):
    input_fn, params = READERS[reader](str(tmp_path / "data"), files, 61)
    reference = verify.reference_ids(input_fn, params)
    assert sorted(reference, key=int) == [str(i) for i in range(61)]
    for workers in (2, 3):
        report = check(input_fn, params, workers, tmp_path / f"ids-{workers}", reference)
        assert report.ok, report.format()
        assert sum(report.read.values()) == 61
        assert all(count > 0 for count in report.read.values()), report.format()


@pytest.mark.slow
def test_content_hashes_identify_records_without_an_id_feature(tmp_path):
    pattern = data.write_tfrecords(str(tmp_path / "data"), 5, 40)
    params = data.tfrecord_params(pattern)
    reference = verify.reference_ids(tfrecord.input_fn, params)
    assert len(set(reference)) == 40
    report = check(tfrecord.input_fn, params, 3, tmp_path / "ids", reference)
    assert report.ok, report.format()


@pytest.mark.slow
def test_tfds_shards_are_disjoint_and_complete(tmp_path, data_dir):
    params = {"data_dir": data_dir}
    reference = verify.reference_ids(digits.input_fn, params)
    assert len(set(reference)) == 1500
    # 4 files: by file over 2 (even) and 3 (uneven) workers, by example over 5.
    expected = {2: {0: 750, 1: 750}, 3: {0: 750, 1: 375, 2: 375}, 5: {i: 300 for i in range(5)}}
    for workers, reads in expected.items():
        report = check(digits.input_fn, params, workers, tmp_path / f"ids-{workers}", reference)
        assert report.ok, report.format()
        assert dict(report.read) == reads


def test_synthetic_shards_are_disjoint_and_complete(tmp_path):
    from input_fns import synthetic

    params = {"num_examples": 50}
    reference = verify.reference_ids(synthetic.input_fn, params)
    report = check(synthetic.input_fn, params, 3, tmp_path / "ids", reference)
    assert report.ok, report.format()
    assert dict(report.read) == {0: 17, 1: 17, 2: 16}


# --- negative controls --------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("reader", ["tfrecord", "csv"])
def test_a_forgotten_shard_is_reported_as_overlapping(tmp_path, reader):
    input_fn, params = READERS[reader](str(tmp_path / "data"), 4, 40)

    def unsharded(mode, input_context=None, params=None):
        return input_fn(mode, None, params)

    recorded = {}
    for pipeline in range(2):
        directory = str(tmp_path / f"ids-{pipeline}")
        (only,) = verify.simulate(unsharded, params, 1, directory).values()
        recorded[pipeline] = dataclasses.replace(only, pipeline_id=pipeline, pipelines=2)
    report = verify.check_sharding(recorded, verify.reference_ids(input_fn, params))
    assert not report.ok
    assert not report.disjoint
    assert len(report.overlapping) == 40
    assert report.missing == ()
    assert "read by more than one pipeline" in report.format()


@pytest.mark.slow
def test_a_missing_file_is_reported_as_missing_examples(tmp_path):
    pattern = data.write_tfrecords(str(tmp_path / "data"), 4, 40)
    params = data.tfrecord_params(pattern, id_feature="id")
    recorded = verify.simulate(tfrecord.input_fn, params, 2, str(tmp_path / "ids"))
    # The reference has a fifth file that the workers did not read.
    data.write_tfrecords(str(tmp_path / "more"), 1, 45)
    reference = verify.reference_ids(
        tfrecord.input_fn, {**params, "files": str(tmp_path / "*" / "train-*.tfrecord")}
    )
    report = verify.check_sharding(recorded, reference)
    assert report.disjoint
    assert not report.complete
    # Ids 0..39 are in both directories, so those are over-counted in the reference.
    assert len(report.missing) == 45
    assert "read by no pipeline" in report.format()


def test_a_pipeline_stopped_early_is_incomplete(tmp_path):
    directory = tmp_path / "ids"
    directory.mkdir()
    (directory / "pipeline-000-of-002.ids").write_text(f"# header\n1\n2\n{ids.END}\n")
    (directory / "pipeline-001-of-002.ids").write_text("# header\n3\n")
    report = verify.check_sharding(ids.read_ids(str(directory)), ["1", "2", "3", "4"])
    assert report.disjoint
    assert report.incomplete == (1,)
    assert report.missing == ("4",)
    assert not report.ok
    assert "train for more steps" in report.format()


def test_without_reference_only_disjointness_is_checked(tmp_path):
    directory = tmp_path / "ids"
    directory.mkdir()
    (directory / "pipeline-000-of-002.ids").write_text(f"# h\n1\n2\n{ids.END}\n")
    (directory / "pipeline-001-of-002.ids").write_text(f"# h\n2\n3\n{ids.END}\n")
    report = verify.check_sharding(ids.read_ids(str(directory)))
    assert report.overlapping == {"2": (0, 1)}
    assert report.reference is None
    assert not report.complete


def test_simulate_fails_for_an_input_fn_that_records_nothing(tmp_path):
    def plain(mode, input_context=None, params=None):
        return tf.data.Dataset.range(10).repeat().batch(2)

    with pytest.raises(UsageError, match="records no ids"):
        verify.simulate(plain, {}, 2, str(tmp_path))


def test_read_ids_fails_without_files_or_with_mixed_jobs(tmp_path):
    with pytest.raises(ValueError, match="No id files"):
        ids.read_ids(str(tmp_path))
    (tmp_path / "pipeline-000-of-002.ids").write_text("# h\n")
    (tmp_path / "pipeline-000-of-003.ids").write_text("# h\n")
    with pytest.raises(ValueError, match=r"\[2, 3\] pipelines"):
        ids.read_ids(str(tmp_path))


# --- the runtime warning ------------------------------------------------------


def test_warning_for_an_input_fn_without_input_context():
    def no_context(mode, params=None):
        return None

    def with_context(mode, input_context=None, params=None):
        return None

    bound = user_code.present_input_fn(no_context, {})
    pitfall = pitfalls.check_input_fn(bound.user_fn, "my.module:no_context", 2)
    assert pitfall.code == "no-input-context" and not pitfall.fatal
    assert "input_fn my.module:no_context takes no `input_context`" in pitfall.message
    assert "2 workers" in pitfall.message
    assert pitfalls.check_input_fn(bound.user_fn, "x", 1) is None
    assert (
        pitfalls.check_input_fn(user_code.present_input_fn(with_context, {}).user_fn, "x", 3)
        is None
    )


# --- real workers through the launcher ----------------------------------------


@pytest.fixture(scope="module")
def digits_tfrecords(tmp_path_factory, data_dir):
    """The embedded digits as 3 TFRecord files per split: uneven over 2 workers."""
    output = str(tmp_path_factory.mktemp("digits_tfrecord"))
    result = convert(ConvertConfig(f"tfds:{digits.NAME}", output, 3, data_dir=data_dir))
    return training_params(result, output)


def launch(tmp_path, train_args):
    model_dir = str(tmp_path / "model")
    args = [
        "--num_workers=2",
        "--noevaluator",
        "--timeout_secs=200",
        "--",
        f"--model_dir={model_dir}",
        "--train_steps=10",
        "--save_checkpoints_steps=10",
        "--batch_size=32",
        *train_args,
    ]
    return run_module("estimator_dist.launch", args, TIMEOUT, model_dir=model_dir)


def params_dict(text):
    from estimator_dist.base.params import parse_params_flag

    return parse_params_flag(text)


@pytest.mark.multiprocess
def test_real_workers_read_disjoint_complete_shards(tmp_path, digits_tfrecords):
    ids_dir = tmp_path / "ids"
    params = f"{digits_tfrecords},id_feature=id,record_read_ids={ids_dir}"
    run = launch(tmp_path, ["--input_fn=tfrecord", f"--params={params}"])
    recorded = ids.read_ids(str(ids_dir))
    assert sorted(recorded) == [0, 1], run.describe()
    reference = verify.reference_ids(tfrecord.input_fn, params_dict(params))
    report = verify.check_sharding(recorded, reference)
    assert report.ok, report.format() + run.describe()
    # 3 files of 500 over 2 workers: the chief reads files 0 and 2.
    assert dict(report.read) == {0: 1000, 1: 500}
    chief_log = open(os.path.join(run.model_dir, "logs", "chief-0.log")).read()
    assert "pipeline 0 of 2; sharding by file (3 files over 2 pipelines)" in chief_log
    assert "takes no `input_context`" not in chief_log


@pytest.mark.multiprocess
def test_real_workers_without_input_context_overlap_and_are_warned(tmp_path, digits_tfrecords):
    ids_dir = tmp_path / "ids"
    params = f"{digits_tfrecords},id_feature=id,record_read_ids={ids_dir}"
    run = launch(
        tmp_path, ["--input_fn=tests.task_inputs:unsharded_tfrecord", f"--params={params}"]
    )
    recorded = {}
    for pipeline, task in enumerate(["chief-0", "worker-0"]):
        (only,) = ids.read_ids(str(ids_dir / task)).values()
        recorded[pipeline] = dataclasses.replace(only, pipeline_id=pipeline, pipelines=2)
    reference = verify.reference_ids(tfrecord.input_fn, params_dict(params))
    report = verify.check_sharding(recorded, reference)
    # Estimator does not auto-shard an input_fn without input_context: both read everything.
    assert len(report.overlapping) == 1500, report.format()
    assert dict(report.read) == {0: 1500, 1: 1500}
    for task in ("chief-0", "worker-0"):
        log = open(os.path.join(run.model_dir, "logs", f"{task}.log")).read()
        assert "input_fn tests.task_inputs:unsharded_tfrecord takes no `input_context`" in log


@pytest.mark.multiprocess
def test_verify_command_simulates_workers(tmp_path):
    pattern = data.write_tfrecords(str(tmp_path / "data"), 3, 30)
    args = [
        "--simulate_workers=2",
        "--input_fn=tfrecord",
        f"--params=files={pattern},features={data.SPEC},id_feature=id",
    ]
    run = run_module("input_fns.verify", args, TIMEOUT)
    assert "Result: OK, the shards are disjoint and together cover the data." in run.output
    assert "pipeline 0: read 20 example(s), whole shard" in run.output
