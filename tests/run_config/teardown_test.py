"""Input iterators without autotuning, so that a training session closes at once.

The race itself (a model thread sleeping out up to 60 s when its iterator is
destroyed) takes a minute of training to show and is timing-dependent, so
these tests check the cause is removed: the graph Estimator builds for
distributed input carries autotune-off options on every per-replica dataset.
"""

import pytest
import tensorflow as tf
from tensorflow.core.framework import dataset_options_pb2

from estimator_dist.driver import bind_input_fn
from run_config.strategies import StrategyConfig, get_strategy
from run_config.teardown import without_autotune


@pytest.fixture(autouse=True)
def no_tf_config(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)


def autotune_settings(graph):
    """`autotune.enabled` of every OptionsDataset op in `graph` that sets it."""
    found = []
    for op in graph.get_operations():
        if op.type == "OptionsDataset":
            options = dataset_options_pb2.Options.FromString(op.get_attr("serialized_options"))
            if options.autotune_options.HasField("enabled"):
                found.append(options.autotune_options.enabled)
    return found


def test_without_autotune_turns_it_off_only_when_unset():
    assert without_autotune(tf.data.Dataset.range(3)).options().autotune.enabled is False
    chosen = tf.data.Options()
    chosen.autotune.enabled = True
    kept = tf.data.Dataset.range(3).with_options(chosen)
    assert without_autotune(kept).options().autotune.enabled is True
    features_and_labels = ({"x": tf.constant([1.0])}, tf.constant([0]))
    assert without_autotune(features_and_labels) is features_and_labels


def test_bound_input_fns_return_datasets_without_autotune():
    def input_fn(mode, input_context=None):
        return tf.data.Dataset.range(4).batch(2)

    dataset = bind_input_fn(input_fn, {})("train", None)

    assert dataset.options().autotune.enabled is False
    assert list(dataset.as_numpy_iterator())[0].tolist() == [0, 1]


@pytest.mark.parametrize("name", ["multi_worker_mirrored", "mirrored"])
def test_per_replica_datasets_of_distributed_input_have_autotune_off(name):
    def input_fn(input_context):
        return tf.data.Dataset.range(8).batch(2)

    with tf.Graph().as_default() as graph:
        strategy = get_strategy(StrategyConfig(name, "RING"), num_gpus=0)
        iterator = strategy.make_input_fn_iterator(input_fn)
        element = iterator.get_next()
        with tf.compat.v1.Session() as session:
            session.run(iterator.initializer)
            first = session.run(strategy.experimental_local_results(element))

    # The input_fn's own dataset is left as it is; each replica's is built without.
    assert autotune_settings(graph) == [False] * strategy.num_replicas_in_sync
    assert first[0].tolist() == [0, 1]
