"""The *speedup* section's bookkeeping: its runs, rounds, seconds, speed-ups and report.

Measurements are replaced by a function of the run; the section itself runs by
hand (`python -m benchmarks --sections=speedup`), never in CI.
"""

import json

import pytest

from benchmarks import NEVER_STEPS, report, speedup, suite
from benchmarks.speedup import SEEDS, SpeedupRun, report_directory, runs, section, train_args
from benchmarks.suite import Settings, run_suite

#: Global examples/s: 2 workers at the same batch 1.5x one, at twice the batch 2x.
RATES = {(1, 64): 400.0, (2, 64): 600.0, (2, 128): 800.0}


def fake_measure(run):
    return RATES[(run.workers, run.global_batch)]


def test_the_runs_are_the_seeds_configurations_on_the_same_examples():
    for quick in (True, False):
        group = runs(quick)
        assert [run.label() for run in group] == list(SEEDS)
        examples = {run.steps() * run.global_batch for run in group}
        assert examples == {speedup.QUICK_EXAMPLES if quick else speedup.EXAMPLES}
        assert all(0 < run.warmup_steps() < run.steps() for run in group)
    assert [run.steps() for run in runs(False)] == [400, 400, 200]


def test_seeds_speedups_are_the_issues():
    one = SEEDS["1 worker, global batch 64"]
    assert one / SEEDS["2 workers, global batch 64"] == pytest.approx(1.89, abs=0.005)
    assert one / SEEDS["2 workers, global batch 128"] == pytest.approx(2.15, abs=0.005)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"workers": 2, "global_batch": 63}, "global_batch 63 must divide over 2 workers"),
        ({"workers": 1, "global_batch": 64, "examples": 64}, "examples must be at least 2560"),
    ],
)
def test_fail_with_an_impossible_run(fields, message):
    with pytest.raises(ValueError, match=message):
        SpeedupRun(**{"examples": 6400, **fields})


def test_every_task_trains_mobilenet_v2_without_checkpoints_while_timed():
    run = runs(quick=False)[2]
    args = train_args(run, "/tmp/model")
    assert "--keras_model=mobilenet_v2" in args
    assert "--input_fn=synthetic" in args
    params = next(a for a in args if a.startswith("--params="))
    assert "image_shape=96x96x3" in params and "alpha=0.35" in params
    assert "--batch_size=128" in args and "--train_steps=200" in args
    assert f"--save_checkpoints_steps={NEVER_STEPS}" in args
    assert f"--save_summary_steps={NEVER_STEPS}" in args
    # 200 steps less 10 of warm-up, in 10 speed summaries.
    assert "--log_step_count_steps=19" in args


def test_section_gives_seconds_and_speedups_next_to_the_seeds():
    calls = []
    results = section(
        Settings(rounds=3, seed=1), False, lambda run: calls.append(run) or fake_measure(run)
    )
    # Interleaved: every round runs the three configurations before the next round.
    assert all(len({run.label() for run in calls[i : i + 3]}) == 3 for i in range(0, 9, 3))
    rows = {row["label"]: row for row in results["rows"]}
    assert results["examples"] == speedup.EXAMPLES
    assert rows["1 worker, global batch 64"]["seconds"]["median"] == pytest.approx(64.0)
    assert rows["2 workers, global batch 128"]["seconds"]["median"] == pytest.approx(32.0)
    assert rows["2 workers, global batch 64"]["speedup"]["median"] == pytest.approx(1.5)
    assert rows["2 workers, global batch 128"]["speedup"]["samples"] == pytest.approx([2.0] * 3)
    assert rows["2 workers, global batch 128"]["seed_seconds"] == 755.0
    assert rows["2 workers, global batch 64"]["seed_speedup"] == pytest.approx(1622 / 858)
    assert len(results["runs"]) == 3


def test_the_suite_runs_it_and_the_report_prints_the_table(tmp_path, monkeypatch):
    monkeypatch.setattr(speedup, "measure", fake_measure)
    results = run_suite(Settings(sections=("speedup",), rounds=2, quick=True))
    assert "speedup" in suite.SECTIONS
    assert results["speedup"]["examples"] == speedup.QUICK_EXAMPLES
    results["finished"] = "now"
    results = json.loads(json.dumps(results))
    text = open(report.write_report(results, str(tmp_path))).read()
    assert "## MobileNetV2 training time and speed-up (issue 19's table)" in text
    assert "| configuration | seconds here | speed-up here | seeds' seconds |" in text
    assert "| 1 worker, global batch 64 | 9.6 (9.6-9.6) | 1.00 (1.00-1.00) | 1,622 | 1.00 |" in text
    assert "| 2 workers, global batch 128 | 4.8 (4.8-4.8) | 2.00 (2.00-2.00) | 755 | 2.15 |" in text


@pytest.mark.parametrize(
    "sections, given, expected",
    [
        (["speedup"], False, "docs/benchmarks/speedup"),
        (["speedup"], True, "docs/benchmarks"),
        (["speedup", "startup"], False, "docs/benchmarks"),
        (["overhead"], False, "docs/benchmarks"),
    ],
)
def test_a_speedup_run_alone_reports_into_its_own_directory(sections, given, expected):
    assert report_directory(sections, "docs/benchmarks", given) == expected
