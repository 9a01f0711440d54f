"""Shared input pipeline pieces: sharding rule, batch sizes, model inputs, file lists."""

import dataclasses

import pytest
import tensorflow as tf

from estimator_dist.base.errors import UsageError
from estimator_dist.base.params import INPUT_KEYS
from input_fns import REGISTERED, pipeline
from tests.input_fns.data import context


@pytest.mark.parametrize(
    "files, pipelines, by_file, text",
    [
        (4, 1, False, "none (one input pipeline)"),
        (4, 2, True, "by file (4 files over 2 pipelines)"),
        (3, 3, True, "by file (3 files over 3 pipelines)"),
        (2, 3, False, "by example (2 file(s) < 3 pipelines)"),
    ],
)
def test_decide_sharding(files, pipelines, by_file, text):
    sharding = pipeline.decide_sharding(files, context(pipelines, pipelines - 1))
    assert sharding.by_file is by_file
    assert sharding.by_example is (pipelines > 1 and not by_file)
    assert sharding.describe() == text


def test_no_context_is_one_pipeline():
    assert pipeline.decide_sharding(7, None) == pipeline.Sharding(1, 0, False, 7)


@pytest.mark.parametrize("pipelines", [2, 3, 5])
def test_keep_position_gives_every_record_to_exactly_one_pipeline(pipelines):
    positions = tf.range(20, dtype=tf.int64)
    owners = []
    for file_index in range(3):
        kept = [
            pipeline.keep_position(
                positions,
                tf.constant(file_index, tf.int64),
                pipeline.Sharding(pipelines, pipeline_id, False, 3),
            ).numpy()
            for pipeline_id in range(pipelines)
        ]
        owners.append(sum(mask.astype(int) for mask in kept))
    assert all((counts == 1).all() for counts in owners)


def test_batch_sizes():
    assert pipeline.batch_sizes(64, None) == (64, 64)
    assert pipeline.batch_sizes(64, tf.distribute.InputContext(2, 0, 4)) == (32, 16)
    with pytest.raises(ValueError, match="63"):
        pipeline.batch_sizes(63, context(2, 0))


def test_to_model_inputs_scales_images_and_casts_labels():
    features, label = pipeline.to_model_inputs(
        {
            "image": tf.constant([[255, 0]], tf.uint8),
            "x": tf.constant([1.5]),
            "label": tf.constant([3], tf.int64),
            "id": tf.constant([9], tf.int64),
        },
        "label",
        drop=("id",),
    )
    assert set(features) == {"image", "x"}
    assert features["image"].dtype == tf.float32
    assert features["image"].numpy().tolist() == [[1.0, 0.0]]
    assert label.dtype == tf.int32


def test_fail_with_unknown_label_key():
    with pytest.raises(UsageError, match="label_key='y' is not a feature; the data has a, b"):
        pipeline.to_model_inputs({"a": tf.constant(1), "b": tf.constant(2)}, "y")


def test_list_files_is_sorted_and_fails_when_empty(tmp_path):
    for name in ("b.csv", "a.csv", "c.txt"):
        (tmp_path / name).write_text("x")
    assert pipeline.list_files(str(tmp_path / "*.csv"), "files") == (
        str(tmp_path / "a.csv"),
        str(tmp_path / "b.csv"),
    )
    with pytest.raises(UsageError, match="files='.*/none-\\*' matches no file"):
        pipeline.list_files(str(tmp_path / "none-*"), "files")


@pytest.mark.parametrize(
    "values, fragment",
    [
        ({"batch_size": 0}, "batch_size must be at least 1"),
        ({"shuffle_buffer": 0}, "shuffle_buffer must be at least 1"),
        ({"label_key": ""}, "label_key must name a feature"),
        ({"record_read_ids": ""}, "record_read_ids must be a directory"),
    ],
)
def test_fail_with_invalid_pipeline_params(values, fragment):
    with pytest.raises(ValueError, match=fragment):
        pipeline.PipelineParams(**values)


@pytest.mark.parametrize("name", sorted(REGISTERED))
def test_every_registered_input_param_is_a_shared_key(name):
    # Model functions reject unknown --params keys unless every input may carry them.
    fields = {field.name for field in dataclasses.fields(REGISTERED[name].parameters)}
    assert fields and fields <= INPUT_KEYS
