"""The package a user installs holds every module of the repository's packages.

`pip install .` (not the editable install the tests run from) builds a wheel
from setup.py; a sub-package missing from it makes every entry point fail with
ImportError on the user's machine, Ray nodes included, while every other test
here passes.
"""

import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from tests.procs import REPO
from tests.structure_test import MODULES


@pytest.mark.multiprocess
def test_the_wheel_holds_every_module(tmp_path):
    # A copy of what setup.py reads: a build/ left in the repository cannot fill the gaps.
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("estimator_dist", "input_fns", "model_fns", "run_config", "requirements"):
        shutil.copytree(pathlib.Path(REPO, name), source / name, ignore=ignore)
    for name in ("setup.py", "README.md"):
        shutil.copy(pathlib.Path(REPO, name), source / name)
    command = [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps"]
    command += ["--no-build-isolation", "--quiet", "--wheel-dir", str(tmp_path)]
    build = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = tmp_path.glob("estimator_dist-*.whl")
    packed = {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".py")}
    expected = {str(path.relative_to(REPO)) for path in MODULES.values()}
    assert not expected - packed, f"missing from the wheel: {sorted(expected - packed)}"
