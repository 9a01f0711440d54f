"""oneDNN is switched by the variable TensorFlow reads at import; cores are split per task."""

import os
import subprocess
import sys

import pytest

from estimator_dist.hardware.cpus import ONEDNN_VARIABLE, configure_onednn, split_cores


@pytest.mark.parametrize(
    "tasks, cores, expected",
    [
        (1, [0, 1], [{0, 1}]),
        (2, [0, 1, 2, 3, 4], [{0, 1, 2}, {3, 4}]),
        (3, [4, 5, 6], [{4}, {5}, {6}]),
        (3, [0, 1], [{0}, {1}, {0}]),
    ],
)
def test_split_cores_gives_each_task_its_own_share(tasks, cores, expected):
    assert split_cores(tasks, cores) == [frozenset(c) for c in expected]


@pytest.mark.parametrize(
    "setting, environ, value",
    [("auto", {}, "1"), ("auto", {ONEDNN_VARIABLE: "0"}, "0"), ("on", {}, "1"), ("off", {}, "0")],
)
def test_configure_onednn_sets_the_variable(setting, environ, value):
    assert configure_onednn(setting, environ) == value
    assert environ[ONEDNN_VARIABLE] == value


def test_fail_with_an_unknown_setting():
    with pytest.raises(ValueError, match="--onednn must be one of auto, on, off, received 'yes'"):
        configure_onednn("yes", {})


def test_fail_when_tensorflow_is_imported_and_the_setting_would_change_nothing(monkeypatch):
    import tensorflow  # noqa: F401  (the point: TensorFlow is in sys.modules)

    monkeypatch.setenv(ONEDNN_VARIABLE, "0")
    with pytest.raises(ValueError, match=f"set {ONEDNN_VARIABLE}=1 in the environment instead"):
        configure_onednn("on")
    assert configure_onednn("off") == "0"  # no change needed: accepted


@pytest.mark.multiprocess
@pytest.mark.parametrize("setting, enabled", [("on", True), ("off", False)])
def test_the_setting_reaches_tensorflow(setting, enabled):
    script = (
        "from estimator_dist.hardware.cpus import configure_onednn, onednn_enabled\n"
        f"configure_onednn({setting!r})\n"
        "print(onednn_enabled())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != ONEDNN_VARIABLE}
    output = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert output.returncode == 0, output.stderr
    assert output.stdout.split()[-1] == str(enabled)
