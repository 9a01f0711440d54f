"""The all-reduce benchmark on a real two-worker cluster.

Each worker times its own runs, but every run is a collective that needs the
peer's matching run: the workers must agree on how many runs each size gets,
and none may exit while a peer still fetches from it. Giving the two workers
different time budgets makes their own counts differ for certain; without
the agreement the one that stops first leaves the other hanging (caught by
the timeout) or failing with "Socket closed".
"""

import json
import os
import tempfile

import pytest

from benchmarks import allreduce, common

pytestmark = pytest.mark.multiprocess

SIZES = [1, 256, 4096]


def test_workers_with_different_budgets_agree_and_both_finish(tmp_path):
    outputs = [str(tmp_path / f"result-{i}.json") for i in range(2)]
    commands = [
        common.python_module(
            "benchmarks.allreduce",
            f"--sizes={','.join(map(str, SIZES))}",
            f"--seconds={seconds}",
            f"--child_output={output}",
            f"--child_peers={','.join(outputs)}",
        )
        for seconds, output in zip([0.1, 1.0], outputs)
    ]
    envs = [{"TF_CONFIG": tf_config} for tf_config in common.tf_configs(2)]

    common.run_tasks(commands, envs, [None, None], str(tmp_path / "logs"), timeout=60)

    for output in outputs:
        with open(output, encoding="utf-8") as stream:
            seconds = {int(size): value for size, value in json.load(stream).items()}
        assert sorted(seconds) == SIZES
        assert all(0 < value < 1 for value in seconds.values())


def test_benchmark_returns_the_chiefs_time_per_size_and_leaves_no_files(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    seconds = allreduce.benchmark([1, 1024], workers=2, seconds=0.2)

    assert sorted(seconds) == [1, 1024]
    assert all(0 < value < 1 for value in seconds.values())
    assert os.listdir(tmp_path) == []


def test_floor_copies_each_size_over_loopback():
    seconds = allreduce.measure_floor([1, 1 << 20], seconds=0.05)

    assert sorted(seconds) == [1, 1 << 20]
    assert 0 < seconds[1] < seconds[1 << 20]
