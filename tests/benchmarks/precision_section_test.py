"""The *precision* section's groups, ratios and table, with measurements replaced by a function."""

import pytest

from benchmarks import precision_section, report
from benchmarks.contenders import Config, package_args
from benchmarks.suite import Settings, run_suite

CALLS = []


def fake_measure(config):
    """bfloat16 3x float32 in the package, 2x in Keras; 2 workers at 1.6x one worker.

    A config measured a second time (in the group against Keras) runs at half speed.
    """
    speed = {"mnist_cnn": 4000.0, "resnet_cifar": 100.0, "mobilenet_v2": 50.0}[config.model]
    speed /= 2 if config in CALLS else 1
    CALLS.append(config)
    speed *= 1 + 0.6 * (config.workers - 1)
    if dict(config.flags).get("mixed_precision") == "bfloat16":
        speed *= 3 if config.contender == "package" else 2
    return speed


def test_every_comparison_pairs_bfloat16_with_its_reference_in_each_round(tmp_path):
    CALLS.clear()
    results = run_suite(Settings(sections=("precision",), rounds=1, quick=True), fake_measure)
    comparisons = results["precision"]["comparisons"]
    measured = {(c["name"], c["model"], c["workers"]): c for c in comparisons}
    for model in ("mnist_cnn", "resnet_cifar", "mobilenet_v2"):
        for workers in (1, 2):
            ratio = measured["bfloat16 / float32", model, workers]
            assert ratio["samples"] == pytest.approx([3.0])
    assert measured["bfloat16 / float32", "resnet_cifar", 2]["target"] == 2.0
    assert measured["bfloat16 / float32", "mnist_cnn", 1]["target"] is None
    keras = measured["package / keras, bfloat16", "mnist_cnn", 2]
    assert keras["target"] == 1.5
    assert "keras" in keras["denominator"] and "mixed_precision=bfloat16" in keras["denominator"]
    efficiency = {(e["model"], e["precision"]): e for e in results["precision"]["efficiency"]}
    assert efficiency["mnist_cnn", "bfloat16"]["efficiency"]["median"] == pytest.approx(0.8)
    text = open(report.write_report(results, str(tmp_path))).read()
    assert "## Mixed precision: bfloat16 against float32 and Keras (issue 27)" in text
    assert "## Targets" not in text, "no section run has a row of the targets table"
    assert "| bfloat16 / float32 | resnet_cifar | 2 | 3.00 (3.00-3.00) | >= 2.0 |" in text
    # The efficiency pairs the bfloat16 / float32 groups' runs, not the later one against Keras.
    assert "| mnist_cnn | bfloat16 | 12,000 | 19,200 | 0.80 (0.80-0.80) |" in text


def test_quick_runs_a_fifth_of_the_steps_and_the_package_alone_trains_mobilenet():
    quick = precision_section.groups(quick=True)
    assert {c.steps_factor for group in quick for c in group} == {0.2}
    mobilenet = quick[4][0]
    assert mobilenet.model == "mobilenet_v2"
    args = package_args(mobilenet, "/m", 100, 20)
    assert "--keras_model=mobilenet_v2" in args and "--mixed_precision=bfloat16" in args
    with pytest.raises(ValueError, match="mobilenet_v2 is trained by the package only"):
        Config("keras", model="mobilenet_v2")
