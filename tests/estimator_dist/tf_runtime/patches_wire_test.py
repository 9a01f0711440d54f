"""Gradients all-reduced in bfloat16 or float16 come back float32, rounded.

The strategies are built in graph mode without TF_CONFIG (one worker), as
Estimator builds them, then deep-copied and reconfigured as Estimator's
distribute coordinator does on every task: the cast must survive that. The
multi-worker case runs in `tests/estimator_dist/equivalence_test.py`.
"""

import copy
import json

import numpy as np
import pytest
import tensorflow as tf

from estimator_dist.tf_runtime import patches
from run_config.strategies import StrategyConfig, get_strategy

# Exact in float32 and float16 (10 fraction bits); bfloat16 (7 bits) rounds it to 1.
NEAR_ONE = 1 + 2**-10


# TF_CONFIG is unset for every test (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("patches_installed")


def reduce_like_an_optimizer(wire_dtype, values, reconfigure=True):
    """Batch-reduces float32 gradients as a v1 optimizer does; returns results and dtypes."""
    with tf.Graph().as_default():
        strategy = get_strategy(
            StrategyConfig("multi_worker_mirrored", "RING", gradient_wire_dtype=wire_dtype),
            num_gpus=0,
        )
        if reconfigure:
            strategy = copy.deepcopy(strategy)
            strategy.configure(tf.compat.v1.ConfigProto())
        with strategy.scope():
            variables = [tf.Variable(np.zeros_like(value)) for value in values]
        pairs = [(tf.constant(value), variable) for value, variable in zip(values, variables)]
        reduced = strategy.extended.batch_reduce_to(tf.distribute.ReduceOp.SUM, pairs)
        results = [strategy.experimental_local_results(r)[0] for r in reduced]
        with tf.compat.v1.Session() as session:
            return session.run(results), [r.dtype for r in results]


@pytest.mark.parametrize("reconfigure", [False, True], ids=["as built", "copied+configured"])
def test_bfloat16_rounds_gradients_and_returns_float32(reconfigure):
    (result,), (dtype,) = reduce_like_an_optimizer(
        "bfloat16", [np.float32([NEAR_ONE, 3.0])], reconfigure
    )
    assert dtype == tf.float32
    np.testing.assert_array_equal(result, [1.0, 3.0])


def test_float32_keeps_every_bit():
    (result,), _ = reduce_like_an_optimizer("float32", [np.float32([NEAR_ONE, 3.0])])
    np.testing.assert_array_equal(result, np.float32([NEAR_ONE, 3.0]))


def test_float16_keeps_ten_fraction_bits_and_overflows_above_65504():
    (result,), (dtype,) = reduce_like_an_optimizer("float16", [np.float32([NEAR_ONE, 1e5])])
    assert dtype == tf.float32
    assert result[0] == np.float32(NEAR_ONE)
    assert np.isinf(result[1])  # documented: float16 has no room for it, no loss scaling


def test_other_dtypes_are_not_cast():
    results, dtypes = reduce_like_an_optimizer(
        "bfloat16", [np.float64([NEAR_ONE]), np.float32([NEAR_ONE])]
    )
    assert dtypes == [tf.float64, tf.float32]
    assert results[0][0] == NEAR_ONE and results[1][0] == 1.0


@pytest.mark.parametrize("dtype", ["float64", "int8"])
def test_fail_with_a_dtype_that_is_not_16_bit_float(dtype):
    with tf.Graph().as_default():
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with pytest.raises(ValueError, match="float32, bfloat16, float16"):
            patches.set_gradient_transport(strategy, dtype)


TWO_WORKERS = json.dumps(
    {
        "cluster": {"chief": ["localhost:2222"], "worker": ["localhost:2223"]},
        "task": {"type": "chief", "index": 0},
    }
)


def collectives_built(build, wire_dtype="float32"):
    """Builds a 2-worker strategy's graph (graph mode starts no server); returns its collectives."""
    with tf.Graph().as_default() as graph:
        strategy = get_strategy(
            StrategyConfig("multi_worker_mirrored", "RING", gradient_wire_dtype=wire_dtype),
            num_gpus=0,
        )
        strategy = copy.deepcopy(strategy)  # as Estimator's coordinator does
        with strategy.scope():
            build(strategy)
    return [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]


def gradients_of_two_variables(strategy):
    variables = [tf.Variable(tf.zeros([3])), tf.Variable(tf.zeros([4, 2]))]
    # On the replica's device, as an optimizer's gradients are.
    with tf.device(strategy.extended.worker_devices[0]):
        pairs = [(tf.ones(v.shape), v) for v in variables]
    strategy.extended.batch_reduce_to(tf.distribute.ReduceOp.SUM, pairs)


@pytest.mark.parametrize("wire_dtype, dtype", [("float32", tf.float32), ("bfloat16", tf.bfloat16)])
def test_two_workers_all_reduce_every_gradient_in_one_collective_of_the_wire_dtype(
    monkeypatch, wire_dtype, dtype
):
    monkeypatch.setenv("TF_CONFIG", TWO_WORKERS)
    (collective,) = collectives_built(gradients_of_two_variables, wire_dtype)
    assert collective.get_attr("T") == dtype
    assert collective.inputs[0].shape.num_elements() == 3 + 8
