"""The stacks section compares the same job: only the Python (the venv) differs."""

import doctest

from benchmarks import stacks
from benchmarks.stacks import StackRun


def test_only_the_python_differs_between_stacks():
    commands = [
        stacks.launcher_command(run, f"/{run.stack}/python", "/tmp/m") for run in stacks.runs()
    ]
    mnist_new, mnist_old, resnet_new, resnet_old = commands
    assert (mnist_new[0], mnist_old[0]) == ("/2.21/python", "/2.15/python")
    assert mnist_new[1:] == mnist_old[1:] and resnet_new[1:] == resnet_old[1:]
    assert "--model_fn=mnist_cnn" in mnist_new and "--model_fn=resnet_cifar" in resnet_new
    assert "--batch_size=128" in mnist_new and "--num_workers=2" in mnist_new


def test_section_pairs_each_round_and_reports_both_ratios():
    # A fake measure: TF 2.21 twice as fast and starting in 3/4 of the time, round by round.
    figures = {"2.21": (200.0, 6.0), "2.15": (100.0, 8.0)}

    class Settings:
        rounds, seed = 3, 0

    results = stacks.section(Settings, lambda run: figures[run.stack], ("mnist_cnn",))
    (comparison,) = results["comparisons"]
    assert comparison["throughput"]["samples"] == [2.0, 2.0, 2.0]
    assert comparison["startup"]["median"] == 0.75
    rows = stacks.table(results)
    assert "| mnist_cnn on TF 2.21 | 200 (200-200) | 6.0 (6.0-6.0) |" in rows
    assert rows[-1] == "| mnist_cnn | 2.000 (2.000-2.000) | 0.750 (0.750-0.750) |"


def test_a_missing_venv_says_how_to_build_it():
    try:
        stacks.measure(StackRun("2.15", "mnist_cnn"), {"2.15": "/nowhere/python"})
    except stacks.common.BenchmarkError as error:
        assert "make lint TF=2.15" in str(error)
    else:
        raise AssertionError("a missing venv must fail")


def test_docstring_examples_hold():
    assert doctest.testmod(stacks).failed == 0
