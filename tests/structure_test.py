"""The package's layers, read from its imports: nothing points up, and modules stay small.

Layer 0 is `estimator_dist.base` (errors, exit codes, registry, params,
TF_CONFIG, pitfalls, the TensorFlow workarounds, the command-line helper);
layer 1 the libraries `input_fns`, `model_fns` and `run_config`, which import
only layer 0 and themselves; layer 2 the rest of `estimator_dist` (driver,
launcher, command-line programs). Imports inside functions count too.
"""

import ast
import pathlib

import pytest

from tests.procs import REPO

ROOT = pathlib.Path(REPO)
PACKAGES = ("estimator_dist", "input_fns", "model_fns", "run_config")
BASE = "estimator_dist.base"
#: "About 400 lines": the limit a newcomer can read a module in.
MAX_LINES = 420


def modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            yield name.removesuffix(".__init__"), path


def project_imports(path):
    """Every module of the project that `path` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found.update(name for name in names if name.split(".")[0] in PACKAGES)
    return found


def layer(module):
    if module == BASE or module.startswith(BASE + "."):
        return 0
    return 2 if module.split(".")[0] == "estimator_dist" else 1


def package(module):
    return BASE if layer(module) == 0 else module.split(".")[0]


MODULES = dict(modules())


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_points_up(module):
    upward = []
    for imported in project_imports(MODULES[module]):
        if imported not in MODULES and imported.rpartition(".")[0] in MODULES:
            imported = imported.rpartition(".")[0]  # `from package import name`
        same_package = package(imported) == package(module)
        if layer(imported) > layer(module) or (
            layer(imported) == layer(module) == 1 and not same_package
        ):
            upward.append(imported)
    assert not upward, f"{module} (layer {layer(module)}) imports {sorted(upward)}"


def test_the_checks_can_fail():
    # The control: a layer-1 module importing the driver is caught.
    assert layer("estimator_dist.driver") > layer("input_fns.convert")
    assert layer("estimator_dist.base.errors") < layer("run_config.strategies")
    assert package("input_fns.tfrecord") != package("model_fns.canned")


@pytest.mark.parametrize("module", sorted(MODULES))
def test_modules_stay_readable(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines <= MAX_LINES, f"{module} has {lines} lines; split it by job (limit {MAX_LINES})"


def test_the_readme_stays_a_front_page():
    # What a user needs first; the reference lives in docs/.
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 12_000, f"README.md is {size:,} bytes; move reference material to docs/"
