"""The suite's bookkeeping: settings, groups and pairing, start-up parsing, the report.

Measurements are replaced by a function of the configuration, so these tests
check what the suite does with figures, not the figures; the suite itself
runs by hand (`make bench`), never in CI.
"""

import json
import os
import re
import tempfile

import pytest

from benchmarks import contenders, options_table, report, scaling_model, suite
from benchmarks.contenders import Config
from benchmarks.groups import run_groups
from benchmarks.startup_section import parse_startup
from benchmarks.suite import SECTIONS, Settings, run_suite, save
from estimator_dist.hardware import cpus


def fake_measure(config):
    # One worker: 10,000 examples/s; each more worker adds 8,000 (efficiency 0.9),
    # 9,000 at 512 per worker (0.95), or 10,000 for separate jobs (efficiency 1).
    base = 10_000 if config.model == "mnist_cnn" else 300
    if config.contender == "independent":
        return base * config.workers
    if config.per_worker_batch == 512:
        return base * (1 + 0.9 * (config.workers - 1))
    return base * (1 + 0.8 * (config.workers - 1)) * (1.1 if config.contender == "package" else 1)


def test_fail_with_unknown_section_or_no_rounds():
    with pytest.raises(ValueError, match="unknown sections \\['bogus'\\]"):
        Settings(sections=("bogus",))
    with pytest.raises(ValueError, match="rounds must be at least 1"):
        Settings(rounds=0)
    with pytest.raises(ValueError, match="scaling models must be some of mnist_cnn, resnet_cifar"):
        Settings(scaling_models=("vgg",))
    with pytest.raises(ValueError, match="scaling communications must be some of RING, AUTO"):
        Settings(scaling_communications=("NCCL",))


def test_every_config_gets_one_sample_per_round_in_round_order():
    groups = [[Config(workers=1), Config(workers=2)], [Config(contender="handwritten")]]
    calls = []
    samples = run_groups(groups, Settings(rounds=3), lambda c: calls.append(c) or len(calls))
    assert len(calls) == 9
    assert [len(group) for group in samples] == [2, 1]
    for group in samples:
        for values in group.values():
            assert len(values) == 3 and values == sorted(values)


def test_a_config_in_two_groups_is_measured_in_each():
    shared = Config(workers=3)
    groups = [[Config(workers=1), shared], [Config(workers=2), shared]]
    samples = run_groups(groups, Settings(rounds=2), lambda c: 1.0)
    assert len(samples[0][shared]) == len(samples[1][shared]) == 2


def test_group_members_run_back_to_back():
    groups = [
        [Config(workers=n) for n in (1, 2, 3)],
        [Config(contender="keras", workers=n) for n in (1, 2)],
    ]
    calls = []
    run_groups(groups, Settings(rounds=2, seed=5), lambda c: calls.append(c.contender) or 1.0)
    runs = "".join("p" if c == "package" else "k" for c in calls)
    assert re.fullmatch("(pppkk|kkppp){2}", runs), runs


def test_parse_startup_reads_the_launcher_and_every_task():
    output = "\n".join(
        [
            "[chief] I1123 startup.py:107] estimator_dist: task chief-0 start-up 9.8 s: "
            "imports 4.3 s, pre-flight 1.3 s, first step 0.3 s",
            "[worker-0] I1123 estimator_dist: task worker-0 start-up 9.5 s: imports 4.0 s",
            "[launcher] first training step 12.4 s after the launcher started",
        ]
    )
    parsed = parse_startup(output)
    assert parsed["first_step"] == 12.4
    assert parsed["tasks"]["chief-0"] == {
        "total": 9.8,
        "phases": {"imports": 4.3, "pre-flight": 1.3, "first step": 0.3},
    }
    assert parsed["tasks"]["worker-0"]["phases"] == {"imports": 4.0}


def test_report_from_measured_sections_has_targets_tables_and_plots(tmp_path):
    sections = ("overhead", "alternatives", "scaling", "options")
    settings = Settings(sections=sections, rounds=2, quick=True)
    saved = []
    results = run_suite(settings, fake_measure, on_section=lambda r: saved.append(list(r)))
    done = [[key for key in keys if key in SECTIONS] for keys in saved]
    assert done == [list(sections[: n + 1]) for n in range(len(sections))]
    path = str(tmp_path / "results.json")
    save(results, path)
    with open(path) as stream:
        results = json.load(stream)
    efficiency = results["scaling"]["curves"][0]["efficiency"]
    assert [e["median"] for e in efficiency] == pytest.approx([1.0, 0.9, 0.8667], abs=1e-3)
    comparison = results["overhead"]["comparisons"][0]
    assert comparison["name"] == "package / handwritten"
    assert comparison["median"] == pytest.approx(1.1)
    readme = report.write_report(results, str(tmp_path))
    text = open(readme).read()
    assert (
        "| package / handwritten (throughput ratio), 2 workers x 64 | >= 0.98 | "
        "1.10 (1.10-1.10), 2 rounds | yes |"
    ) in text
    assert "## The package's own cost per step" in text
    assert "| package / keras" in text
    # The SIGTERM watch's cost, measured against the package with it off in the same rounds.
    assert "| preemption watch on / off (throughput ratio), 2 workers x 64 | >= 0.98 | 1.00" in text
    assert "weak-scaling efficiency, mnist_cnn, 2 workers x 64, defaults | >= 0.9 | 0.90" in text
    # References (separate jobs, a larger batch) are never the best option at 64 per worker.
    assert "hardware limit | >=" not in text
    assert "per_worker_batch=512 | >=" not in text
    assert "(the cores' own limit) | reference | 1.00" in text
    assert "(8x the examples per synchronisation) | reference | 0.95" in text
    assert os.path.exists(tmp_path / "scaling_mnist_cnn.png")
    assert "![scaling_mnist_cnn.png](scaling_mnist_cnn.png)" in text


def test_the_overhead_section_runs_at_least_10_interleaved_rounds():
    calls = []
    results = run_suite(
        Settings(sections=("overhead", "alternatives"), rounds=3),
        lambda config: calls.append(config) or fake_measure(config),
    )
    overhead = results["overhead"]
    assert overhead["rounds"] == suite.OVERHEAD_ROUNDS == 10
    assert [c["name"] for c in overhead["comparisons"]] == [
        "package / handwritten",
        "preemption watch on / off",
    ]
    assert all(len(c["samples"]) == 10 for c in overhead["comparisons"])
    # Interleaved: each round runs all three once before the next round starts.
    first = [c.label() for c in calls[:30]]
    assert all(len(set(first[i : i + 3])) == 3 for i in range(0, 30, 3))
    # The alternatives keep their 3 rounds and leave the 64-per-worker hand-written run out.
    assert all(len(run["samples"]) == 3 for run in results["alternatives"]["runs"])
    assert "package / handwritten" not in [
        c["name"] for c in results["alternatives"]["comparisons"] if c["per_worker_batch"] == 64
    ]


def test_the_overhead_section_names_the_cpu_its_ratio_was_measured_on(tmp_path, monkeypatch):
    # A CPU with AVX-512 BF16 but no AMX: the flags recorded are the ones TensorFlow's kernels
    # depend on, in a fixed order, whatever else the CPU lists.
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: Test CPU 9000\nflags\t\t: sse fma avx512_bf16 avx2 avx512f\n")
    monkeypatch.setattr(cpus, "CPUINFO", str(cpuinfo))
    monkeypatch.setattr(cpus.cpu_flags, "__defaults__", (str(cpuinfo),))
    results = run_suite(Settings(sections=("overhead",), rounds=1, quick=True), fake_measure)
    assert results["overhead"]["machine"]["cpu_flags"] == ["avx2", "fma", "avx512f", "avx512_bf16"]
    text = open(report.write_report(results, str(tmp_path))).read()
    assert "avx2 fma avx512f avx512_bf16" in text.splitlines()[2]


def test_each_worker_gets_one_core_of_its_own_round_robin(monkeypatch):
    monkeypatch.setattr(contenders, "allowed_cores", lambda: [4, 5, 6, 7])
    assert contenders.one_core_each(1) == [{4}]
    assert contenders.one_core_each(3) == [{4}, {5}, {6}]
    monkeypatch.setattr(contenders, "allowed_cores", lambda: [0, 1])
    assert contenders.one_core_each(3) == [{0}, {1}, {0}]


@pytest.mark.multiprocess
def test_measure_runs_a_real_job_and_removes_its_files(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    examples_per_second = contenders.measure(Config(workers=1, steps_factor=0.02), timeout=300)

    assert examples_per_second > 0
    assert os.listdir(tmp_path) == []


def test_options_check_feeds_each_option_into_the_scaling_model():
    ring = scaling_model.Network("ring", latency=1e-4, bandwidth=1e9)
    sizes = [1, 1 << 10, 1 << 18, 1 << 20]
    nbytes = [4 * size for size in sizes]
    per_size = [{"median": scaling_model.ring_allreduce_seconds(ring, 2, b)} for b in nbytes]
    results = run_suite(Settings(sections=("options",), rounds=1, quick=True), fake_measure)
    results["collectives"] = {
        "sizes": sizes,
        "bytes": nbytes,
        "allreduce": {"RING float32": per_size},
    }

    checks = {row["option"]: row for row in report.options_check(results)}

    assert set(checks) == {
        "defaults",
        "gradient_wire_dtype=bfloat16",
        "gradient_accumulation_steps=8",
        options_table.MICRO_BATCHES_8,
        options_table.LARGER_BATCH,
    }
    gradient = report.GRADIENT_BYTES["mnist_cnn"]
    defaults = checks["defaults"]
    assert defaults["compute_ms"] == pytest.approx(64 / 11_000 * 1e3)
    assert defaults["predicted"] == pytest.approx(
        scaling_model.efficiency(64 / 11_000, ring, 2, gradient), rel=1e-3
    )
    assert checks["gradient_accumulation_steps=8"]["accumulation"] == 8
    assert checks["gradient_accumulation_steps=8"]["predicted"] > defaults["predicted"]
    # No bfloat16 fit in these results: the float32 ring carries half the bytes.
    assert checks["gradient_wire_dtype=bfloat16"]["allreduce_ms"] == pytest.approx(
        scaling_model.ring_allreduce_seconds(ring, 2, gradient / 2) * 1e3, rel=1e-3
    )
    assert checks[options_table.LARGER_BATCH]["compute_ms"] == pytest.approx(512 / 10_000 * 1e3)
    assert defaults["measured"] == pytest.approx(0.9)
