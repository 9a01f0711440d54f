"""Sparse gradients reach MultiWorkerMirroredStrategy's all-reduce dense, in any model.

Unit tests build the strategy in graph mode without TF_CONFIG (one worker),
as Estimator builds it, and reduce gradients as the optimizers do
(`extended.batch_reduce_to`). The 2-worker tests start two real worker
processes on free loopback ports (`sparse_worker`), whose batches hold
numbers of distinct ids that differ between the workers and from step to
step: without `tf_runtime.patches` they fail with "Shape mismatch in the
collective instance".
"""

import contextlib
import copy
import json
import time

import numpy as np
import portpicker
import pytest
import tensorflow as tf
from tensorflow.python.distribute.values import PerReplica

from estimator_dist.cluster.tf_config import make_local_cluster
from estimator_dist.tf_runtime import patches
from run_config.strategies import StrategyConfig, get_strategy
from tests.estimator_dist.tf_runtime import sparse_worker
from tests.procs import Background

# Exact in float32; bfloat16 (7 fraction bits) rounds it to 1.
NEAR_ONE = 1 + 2**-10
TABLE = [5, 2]
SUM = tf.distribute.ReduceOp.SUM


# TF_CONFIG is unset for every test (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("patches_installed")


def built_strategy(wire_dtype="float32", reconfigure=False):
    strategy = get_strategy(
        StrategyConfig("multi_worker_mirrored", "RING", gradient_wire_dtype=wire_dtype),
        num_gpus=0,
    )
    if reconfigure:  # as Estimator's distribute coordinator does on every task
        strategy = copy.deepcopy(strategy)
        strategy.configure(tf.compat.v1.ConfigProto())
    return strategy


def sparse_gradient(strategy, rows, value=1.0):
    """An embedding-like gradient: `value` in each of `rows` (a row twice sums)."""
    with tf.device(strategy.extended.worker_devices[0]):
        return tf.IndexedSlices(
            tf.fill([len(rows), TABLE[1]], value),
            tf.constant(rows, tf.int64),
            # Known only when the graph runs, as a resource variable's shape in
            # a real gradient is.
            tf.compat.v1.placeholder_with_default(tf.constant(TABLE, tf.int64), [2]),
        )


def reduce_in_session(strategy, make_pairs):
    """Batch-reduces `make_pairs(strategy, variables)` as an optimizer does."""
    with strategy.scope():
        variables = [tf.Variable(tf.zeros(TABLE)), tf.Variable(tf.zeros([2]))]
    reduced = strategy.extended.batch_reduce_to(SUM, make_pairs(strategy, variables))
    results = [strategy.experimental_local_results(r)[0] for r in reduced]
    with tf.compat.v1.Session() as session:
        return results, session.run(results)


def sparse_and_dense(strategy, variables, wrap=lambda value: value):
    with tf.device(strategy.extended.worker_devices[0]):
        dense = tf.constant([NEAR_ONE, 3.0])
    sparse = sparse_gradient(strategy, [1, 3, 1], NEAR_ONE)
    return [(wrap(sparse), variables[0]), (wrap(dense), variables[1])]


# A bare value per worker, as merge calls regroup one replica's gradient, or a
# PerReplica with one value per local replica (several GPUs per worker).
WRAPS = {"value": lambda value: value, "per replica": lambda value: PerReplica((value,))}


@pytest.mark.parametrize("wrap", WRAPS)
@pytest.mark.parametrize("reconfigure", [False, True], ids=["as built", "copied+configured"])
def test_sparse_gradients_come_back_dense_with_the_variables_shape(reconfigure, wrap):
    def pairs(strategy, variables):
        return sparse_and_dense(strategy, variables, WRAPS[wrap])

    with tf.Graph().as_default():
        strategy = built_strategy(reconfigure=reconfigure)
        (sparse, dense), (sparse_value, dense_value) = reduce_in_session(strategy, pairs)
    assert isinstance(sparse, tf.Tensor) and sparse.shape == TABLE
    expected = np.zeros(TABLE, np.float32)
    expected[1], expected[3] = 2 * np.float32(NEAR_ONE), NEAR_ONE
    np.testing.assert_array_equal(sparse_value, expected)
    np.testing.assert_array_equal(dense_value, np.float32([NEAR_ONE, 3.0]))


def test_a_strategy_not_opted_in_keeps_the_gradient_sparse():
    # The control: what a strategy the package did not build returns.
    with tf.Graph().as_default():
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        (sparse, _), _ = reduce_in_session(strategy, sparse_and_dense)
    assert isinstance(sparse, tf.IndexedSlices)


def test_uninstalled_the_gradient_stays_sparse():
    with tf.Graph().as_default():
        strategy = built_strategy()
        patches.uninstall()
        (sparse, _), _ = reduce_in_session(strategy, sparse_and_dense)
    assert isinstance(sparse, tf.IndexedSlices)


def test_installing_twice_densifies_once():
    patches.install()
    with tf.Graph().as_default() as graph:
        strategy = copy.deepcopy(built_strategy())
        reduce_in_session(strategy, sparse_and_dense)
    assert [op.type for op in graph.get_operations()].count("UnsortedSegmentSum") == 1


def test_sparse_gradients_made_dense_cross_in_the_wire_dtype_too():
    with tf.Graph().as_default():
        strategy = copy.deepcopy(built_strategy("bfloat16"))
        (sparse, dense), (sparse_value, dense_value) = reduce_in_session(strategy, sparse_and_dense)
    assert sparse.dtype == dense.dtype == tf.float32 and isinstance(sparse, tf.Tensor)
    np.testing.assert_array_equal(dense_value, [1.0, 3.0])
    assert sparse_value[3, 0] == 1.0  # NEAR_ONE, rounded by bfloat16


def test_fail_with_a_strategy_other_than_multi_worker_mirrored():
    with tf.Graph().as_default():
        with pytest.raises(TypeError, match="MultiWorkerMirroredStrategy only, received Mirrored"):
            patches.set_gradient_transport(tf.distribute.MirroredStrategy(["/cpu:0"]))


def test_fail_before_install_names_the_call_to_make():
    patches.uninstall()
    with tf.Graph().as_default():
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with pytest.raises(RuntimeError, match=r"patches.install\(\) must run"):
            patches.set_gradient_transport(strategy)


TWO_WORKERS = json.dumps(
    {
        "cluster": {"chief": ["localhost:2222"], "worker": ["localhost:2223"]},
        "task": {"type": "chief", "index": 0},
    }
)


@pytest.mark.multiprocess
def test_two_workers_pack_the_dense_sparse_gradient_with_the_others(monkeypatch):
    # Building the graph starts no server. One all-reduce carries both
    # gradients, the table at its full, static size; nothing is gathered.
    monkeypatch.setenv("TF_CONFIG", TWO_WORKERS)
    with tf.Graph().as_default() as graph:
        strategy = copy.deepcopy(built_strategy())
        with strategy.scope():
            variables = [tf.Variable(tf.zeros(TABLE)), tf.Variable(tf.zeros([2]))]
            with tf.device(strategy.extended.worker_devices[0]):
                pairs = [(sparse_gradient(strategy, [0, 4]), variables[0])]
                pairs.append((tf.ones([2]), variables[1]))
            strategy.extended.batch_reduce_to(SUM, pairs)
    types = [op.type for op in graph.get_operations()]
    assert "CollectiveGatherV2" not in types
    (collective,) = [op for op in graph.get_operations() if op.type == "CollectiveReduceV2"]
    assert collective.inputs[0].shape.num_elements() == np.prod(TABLE) + 2


# A 2-worker job took 4 to 13 s on 2 shared cores (imports, graph building,
# 5 steps); the timeout only bounds a hung job.
TIMEOUT = 90
STEPS = 5


def run_two_workers(model, model_dir):
    """Runs chief and worker of `sparse_worker` at once; fails with both outputs."""
    ports = [portpicker.pick_unused_port() for _ in range(2)]
    cluster = make_local_cluster(2, ports=ports)
    args = [model, str(model_dir), str(STEPS)]
    deadline = time.monotonic() + TIMEOUT
    with contextlib.ExitStack() as stack:
        tasks = {
            task.role: stack.enter_context(
                Background(
                    "tests.estimator_dist.tf_runtime.sparse_worker",
                    args,
                    env={"TF_CONFIG": task.to_json()},
                )
            )
            for task in cluster.tasks
        }
        # A task that fails leaves its peer waiting forever: stop at the first failure.
        while time.monotonic() < deadline:
            codes = [task.process.poll() for task in tasks.values()]
            if None not in codes or any(code for code in codes if code is not None):
                break
            time.sleep(0.2)
    # Leaving the stack killed every process group; now collect all output.
    codes = {role: task.wait(timeout=10) for role, task in tasks.items()}
    if any(codes.values()):
        logs = "\n".join(
            f"===== {role} (exit {codes[role]}) =====\n{task.output}"
            for role, task in tasks.items()
        )
        raise AssertionError(f"the 2-worker {model} job failed or hung for {TIMEOUT} s:\n{logs}")


def checkpoint(model_dir):
    path = tf.train.latest_checkpoint(str(model_dir))
    assert path, f"the chief wrote no checkpoint in {model_dir}"
    return tf.train.load_checkpoint(path)


@pytest.mark.multiprocess
def test_two_workers_train_a_model_fn_with_embedding_lookup(tmp_path):
    run_two_workers("embedding_lookup", tmp_path)
    reader = checkpoint(tmp_path)
    assert reader.get_tensor("global_step") == STEPS
    # The table started at zero. The chief read ids 0-4 only: rows 5 and 6
    # moved with the worker's gradients, rows of ids nobody read did not.
    chief, worker = (max(counts) for counts in sparse_worker.UNIQUE_IDS)
    assert chief < worker
    moved = np.flatnonzero(np.abs(reader.get_tensor("table")).sum(axis=1))
    assert moved.tolist() == list(range(worker))


@pytest.mark.multiprocess
@pytest.mark.parametrize("model", ["canned_v1", "canned_v2"])
def test_two_workers_train_a_canned_estimator_on_sparse_columns(model, tmp_path):
    run_two_workers(model, tmp_path)
    assert checkpoint(tmp_path).get_tensor("global_step") == STEPS
