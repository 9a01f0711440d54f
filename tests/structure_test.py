"""The package's rooms and the rules between them, read from the imports.

Each folder is one concern, stacked from the foundation up (`LAYERS`); a module
imports its own folder and the folders below it, never one above. The three
libraries sit beside each other: each imports only the foundation and itself,
so a user who wants `model_fns` gets neither the driver nor the launcher. The
entry points (`estimator_dist/<program>.py`, run with `python -m`) sit on top
and may import any folder. Imports inside functions count too.
"""

import ast
import pathlib

import pytest

from tests.procs import REPO

ROOT = pathlib.Path(REPO)
PACKAGES = ("estimator_dist", "input_fns", "model_fns", "run_config")
LIBRARIES = ("input_fns", "model_fns", "run_config")
#: The folders from the foundation up; each may import only itself and those before it.
LAYERS = (
    "estimator_dist.tf_runtime",
    "estimator_dist.base",
    "estimator_dist.report",
    "estimator_dist.hardware",
    "estimator_dist.cluster",
    LIBRARIES,
    "estimator_dist.storage",
    "estimator_dist.config",
    "estimator_dist.guards",
    "estimator_dist.task",
    "estimator_dist.serving",
    "estimator_dist.programs",
    "estimator_dist.kubernetes",
    "estimator_dist.launcher",
)
ENTRY_POINTS = len(LAYERS)


def modules():
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            yield name.removesuffix(".__init__"), path


MODULES = dict(modules())


def project_imports(path):
    """Every module of the project that `path` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from package import module` imports the module; any other name, the package.
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            if not all(name in MODULES for name in names):
                names.append(node.module)
        else:
            continue
        for name in names:
            if name.split(".")[0] not in PACKAGES:
                continue
            if name not in MODULES and name.rpartition(".")[0] in MODULES:
                name = name.rpartition(".")[0]  # `from package import name`
            found.add(name)
    return found


def folder(module):
    """The room a module lives in: a library, a folder of estimator_dist, or an entry point."""
    parts = module.split(".")
    if parts[0] in LIBRARIES:
        return parts[0]
    if len(parts) > 1 and ".".join(parts[:2]) in LAYERS:
        return ".".join(parts[:2])
    return "entry point"


def layer(module):
    room = folder(module)
    if room in LIBRARIES:
        return LAYERS.index(LIBRARIES)
    return LAYERS.index(room) if room in LAYERS else ENTRY_POINTS


def may_import(module, imported):
    if folder(module) == folder(imported):
        return True
    if folder(module) in LIBRARIES and folder(imported) in LIBRARIES:
        return False  # The libraries stay independent of one another.
    return layer(imported) < layer(module)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_import_points_up(module):
    upward = sorted(i for i in project_imports(MODULES[module]) if not may_import(module, i))
    assert not upward, f"{module} ({folder(module)}) imports {upward}"


def test_every_module_lives_in_a_room():
    # A new folder must be placed in LAYERS; only the programs sit at the top level.
    top_level = {m for m in MODULES if folder(m) == "entry point"}
    assert top_level == {
        "estimator_dist",
        *(f"estimator_dist.{name}" for name in ("check", "flag_reference", "launch", "manifest")),
        *(f"estimator_dist.{name}" for name in ("predict", "script", "train")),
    }


#: Modules of TensorFlow that are not its public API: reached only from `tf_runtime`.
PRIVATE_TENSORFLOW = ("tensorflow.python", "tensorflow.core", "tensorflow_estimator.python")
#: The room that touches TensorFlow's internals.
TF_RUNTIME = "estimator_dist.tf_runtime"


def private_tensorflow_imports(path):
    """The private TensorFlow modules `path` imports, at any depth of its code."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {name for name in names if name.startswith(PRIVATE_TENSORFLOW)}
    return found


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not m.startswith(TF_RUNTIME)))
def test_tensorflows_internals_are_reached_only_from_their_room(module):
    private = sorted(private_tensorflow_imports(MODULES[module]))
    assert not private, f"{module} imports {private}: move that use into {TF_RUNTIME}"


def mutual_pairs(imports):
    """The pairs of modules that import each other, given each module's imports."""
    return sorted(
        (a, b) for a, found in imports.items() for b in found if a < b and a in imports.get(b, ())
    )


def test_no_two_modules_import_each_other():
    pairs = mutual_pairs({module: project_imports(path) for module, path in MODULES.items()})
    assert not pairs, f"modules importing each other: {pairs}"


def declared_flags(path):
    """(flag, class) for every setting declared in a class body of `path` (`setting(...)`)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            call = getattr(item, "value", None)
            is_setting = isinstance(call, ast.Call) and getattr(call.func, "id", "") == "setting"
            if isinstance(item, ast.AnnAssign) and is_setting:
                named = [k.value.value for k in call.keywords if k.arg == "flag"]
                found.append((named[0] if named else item.target.id, node.name))
    return found


def duplicated_flags(declarations):
    """The flags declared by more than one class, with those classes."""
    classes = {}
    for flag, owner in declarations:
        classes.setdefault(flag, []).append(owner)
    return {flag: owners for flag, owners in classes.items() if len(owners) > 1}


def test_each_setting_is_declared_once():
    # A setting every kind of job takes lives in one class nested where it is needed
    # (`estimator_dist.config`): its flag, default and help cannot drift apart.
    declarations = [found for path in MODULES.values() for found in declared_flags(path)]
    assert len(declarations) > 60
    assert not duplicated_flags(declarations)


def test_the_checks_can_fail():
    # The controls: the driver imported by a library, the launcher by the task, one
    # library by another, and an entry point by a folder are each caught.
    assert not may_import("input_fns.convert", "estimator_dist.task.driver")
    assert not may_import("estimator_dist.task.driver", "estimator_dist.launcher.supervise")
    assert not may_import("input_fns.tfrecord", "model_fns.canned")
    assert not may_import("estimator_dist.launcher.restarts", "estimator_dist.launch")
    assert may_import("estimator_dist.launch", "estimator_dist.launcher.ray.engine")
    assert may_import("estimator_dist.task.driver", "run_config.strategies")
    assert mutual_pairs({"a": {"b"}, "b": {"a", "c"}, "c": set()}) == [("a", "b")]
    source = pathlib.Path(__file__).with_name("structure_check_example.txt")
    assert private_tensorflow_imports(source) == {"tensorflow.python.util"}
    assert duplicated_flags(declared_flags(source)) == {"model_dir": ["Job", "Script"]}


def test_the_readme_stays_a_front_page():
    # What a user needs first; the reference lives in docs/.
    size = len((ROOT / "README.md").read_bytes())
    assert size <= 12_000, f"README.md is {size:,} bytes; move reference material to docs/"
