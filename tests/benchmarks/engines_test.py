"""The engines section compares the same job: only the engine flags differ."""

import doctest

from benchmarks import engines
from benchmarks.engines import EngineRun


def _split(args):
    cut = args.index("--")
    return args[:cut], args[cut + 1 :]


def test_every_contender_runs_the_same_training_flags():
    trainings = [
        _split(engines.launcher_args(run, "127.0.0.1:6379", "/tmp/m"))[1] for run in engines.runs()
    ]
    assert trainings[0] == trainings[1] == trainings[2]
    assert "--model_dir=/tmp/m" in trainings[0] and "--batch_size=128" in trainings[0]


def test_only_the_engine_flags_differ():
    local, unpinned, ray = (
        _split(engines.launcher_args(run, "10.0.0.1:6379", "/tmp/m"))[0] for run in engines.runs()
    )
    assert local[:2] == ["--engine=local", "--pin_cores"]
    assert unpinned[:2] == ["--engine=local", "--nopin_cores"]
    assert ray[:2] == ["--engine=ray", "--ray_address=10.0.0.1:6379"]
    assert (
        local[2:]
        == unpinned[2:]
        == ray[2:]
        == ["--num_workers=2", "--noevaluator", "--max_restarts=0"]
    )


def test_table_shows_each_comparison_with_its_goal():
    results = {
        "comparisons": [
            {
                "name": "ray / local",
                "target": 0.98,
                "median": 0.99,
                "min": 0.95,
                "max": 1.02,
                "samples": [0.95, 0.99, 1.02],
            },
        ]
    }
    row = engines.table(results)[-1]
    assert row == "| ray / local | >= 0.98 | 0.990 (0.950-1.020) | 3 |"


def test_docstring_examples_hold():
    assert doctest.testmod(engines).failed == 0
    assert EngineRun("ray", pin_cores=False).label() == "ray"
