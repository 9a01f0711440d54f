"""Synchronous 2-worker training equals 1-worker training with the same global batch.

Two workers with per-worker batch B/2 over real RING collectives must reach
the weights one worker reaches with batch B, to float tolerance. A negative
control (one worker with batch B/2, what a forgotten shard or a per-worker
batch mistaken for the global one gives) must be far off, and training must
have moved the weights well beyond the tolerance, so the test can fail.
"""

import numpy as np
import tensorflow as tf

from tests.procs import run_module

TOLERANCE = 1e-5
STEPS = 50
GLOBAL_BATCH = 32
TIMEOUT = 240


def common_args(model_dir, data_dir, batch):
    return [
        f"--model_dir={model_dir}",
        f"--data_dir={data_dir}",
        "--input_fn=tests.task_inputs:example_sharded",
        f"--batch_size={batch}",
        f"--train_steps={STEPS}",
        f"--save_checkpoints_steps={STEPS}",
        "--eval_steps=1",
        "--learning_rate=0.1",
        "--params=optimizer=sgd",
    ]


def weights(model_dir, step=None):
    path = tf.train.latest_checkpoint(model_dir)
    if step is not None:
        path = path.rsplit("-", 1)[0] + f"-{step}"
    reader = tf.train.load_checkpoint(path)
    return {
        name: reader.get_tensor(name)
        for name, _ in tf.train.list_variables(path)
        if name.startswith("mnist_cnn/")
    }


def max_difference(a, b):
    assert a.keys() == b.keys() and a, (sorted(a), sorted(b))
    return max(float(np.max(np.abs(a[name] - b[name]))) for name in a)


def test_two_workers_equal_one_worker_with_the_same_global_batch(tmp_path, data_dir):
    one, two, control = (str(tmp_path / name) for name in ("one", "two", "control"))
    run_module(
        "estimator_dist.train", common_args(one, data_dir, GLOBAL_BATCH), TIMEOUT, model_dir=one
    )
    run_module(
        "estimator_dist.launch",
        [
            "--num_workers=2",
            "--noevaluator",
            "--timeout_secs=200",
            "--",
            "--communication=RING",
            *common_args(two, data_dir, GLOBAL_BATCH),
        ],
        TIMEOUT,
        model_dir=two,
    )
    run_module(
        "estimator_dist.train",
        common_args(control, data_dir, GLOBAL_BATCH // 2),
        TIMEOUT,
        model_dir=control,
    )

    one_worker, two_workers = weights(one), weights(two)
    difference = max_difference(one_worker, two_workers)
    print(
        f"max |w(2 workers, batch {GLOBAL_BATCH // 2} each) - w(1 worker, batch "
        f"{GLOBAL_BATCH})| after {STEPS} steps: {difference:.3g}"
    )
    assert difference <= TOLERANCE

    moved = max_difference(one_worker, weights(one, step=0))
    assert moved > 1000 * TOLERANCE, f"training barely moved the weights ({moved})"
    assert max_difference(weights(control), two_workers) > 100 * TOLERANCE
