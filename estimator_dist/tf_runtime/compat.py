"""`tf.estimator` on TensorFlow 2.16 and later: what TensorFlow stopped providing for it.

`tf.estimator` left TensorFlow in 2.16; `tensorflow-estimator` 2.15.0, its last
release, still runs on TensorFlow 2.16-2.21 once TensorFlow provides again what
it imports and registers. Without this layer, `import tensorflow_estimator`
fails on every one of them (`cannot import name 'estimator_training' from
'tensorflow.python.distribute'`). On TensorFlow 2.15, which ships all of it,
the layer does nothing at all: `needed()` is False and neither the environment
nor TensorFlow is touched.

`prepare()` runs when `estimator_dist` is imported (every entry point, the
launcher's tasks, Ray actors and pods all import it first; `model_fns`,
`input_fns` and `run_config` import it too), before TensorFlow is imported. It
imports nothing heavy itself. It sets `TF_USE_LEGACY_KERAS=1` unless the
environment sets the variable already, and has the rest installed right after
TensorFlow's own import, whoever imports it (the package, or a user's program
that only does `import tensorflow as tf` and uses `tf.estimator`). The pieces,
each with the test that shows why it is needed (tests/estimator_dist/tf_runtime/
compat_test.py runs each without it on the 2.21 stack), checked on TensorFlow
2.16.2, 2.18.1, 2.20.0 and 2.21.0:

1. **Legacy Keras** (`TF_USE_LEGACY_KERAS=1`, read by TensorFlow at import and
   at the first use of `tf.keras`). Under Keras 3, `tf.compat.v1.layers` raise,
   the canned estimators find no `DenseFeatures`, and layer names are unique per
   process instead of per graph: the evaluator's graph asks the checkpoint for
   `dense_2/bias`, which training saved as `dense/bias`. tf-keras (Keras 2) is
   what Estimator was written for. A user who set `TF_USE_LEGACY_KERAS=0` keeps
   Keras 3; a checkpoint missing a variable then gets `KERAS_3_MISSING_VARIABLE`
   (`explain_missing_variable`).
2. **The coordinator glue** (`tensorflow.python.distribute.estimator_training`,
   removed in 2.16): `estimator_dist.tf_runtime.coordinator`, registered under
   that name. RunConfig and train_and_evaluate reach TensorFlow's distribute
   coordinator, which 2.21 still ships, only through it.
3. **TPU stand-ins** (`tensorflow.python.tpu.session_support`, `tpu_embedding`,
   `tpu_embedding_gradient`, removed in 2.16): only TPUEstimator uses them, but
   `tensorflow_estimator` imports them. Each name they are asked for is a class
   whose use raises `TPU_REMOVED` (a type check against it is simply False).
4. **The Estimator API's name in `tf_export`** (`ESTIMATOR_API_NAME` and its
   attribute names): every `@estimator_export` decorator of `tensorflow_estimator`
   registers under it at import.
5. **`tf.estimator`, `tf.compat.v1.estimator`, `tf.compat.v2.estimator`**: lazy
   attributes that import the Estimator API on first use, as TensorFlow 2.15's
   own. `tf.compat.v1` is two module objects once a program runs `import
   tensorflow.compat.v1 as tf`, so every such module gets it when it is loaded.

Example:
  >>> import tensorflow as tf
  >>> tf.estimator.RunConfig is tf.compat.v1.estimator.RunConfig
  True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any, Optional, Sequence

#: The variable TensorFlow 2.16+ reads to route `tf.keras` to tf-keras (Keras 2).
LEGACY_KERAS_VARIABLE = "TF_USE_LEGACY_KERAS"
#: The Python versions the package serves (TensorFlow 2.15 on 3.9-3.11, 2.21 on 3.10-3.13).
SUPPORTED_PYTHONS = ((3, 9), (3, 13))

#: The one line for a Python the package cannot serve.
UNSUPPORTED_PYTHON = (
    "estimator-dist: Python {version} is not supported: TensorFlow has wheels for Python 3.9 "
    "to 3.13 only (TensorFlow 2.21 on 3.10-3.13, 2.15 on 3.9-3.11); run it with one of those, "
    "e.g. `python3.12 -m venv .venv && .venv/bin/pip install -e .`."
)
#: What a TPU stand-in raises when TPUEstimator uses it.
TPU_REMOVED = (
    "{name} is not available on TensorFlow {tf_version}: TensorFlow 2.16 removed the TPU "
    "modules TPUEstimator needs. Run TPUEstimator on the TensorFlow 2.15 stack "
    "(pip install -e '.[tf215]', Python 3.9-3.11)."
)
#: One line for a checkpoint that lacks a variable while Keras 3 builds the model.
KERAS_3_MISSING_VARIABLE = (
    "the checkpoint has no variable {variable}, which the model asks for: "
    "TF_USE_LEGACY_KERAS={value} in the environment makes tf.keras Keras 3, whose layer names "
    "are unique per process, not per graph, so a second graph (the evaluator's, an export's) "
    "names its variables differently from the checkpoint. Unset TF_USE_LEGACY_KERAS (the "
    "package sets it to 1, for tf-keras) or set it to 1, and train again."
)

_GLUE = "tensorflow.python.distribute.estimator_training"
_TPU_MODULES = tuple(
    f"tensorflow.python.tpu.{name}"
    for name in ("session_support", "tpu_embedding", "tpu_embedding_gradient")
)
_ESTIMATOR_API = "estimator"
#: The Estimator API modules that `tf.estimator` and `tf.compat.v1.estimator` are.
_API_MODULES = {
    "v1": "tensorflow_estimator.python.estimator.api._v1.estimator",
    "v2": "tensorflow_estimator.python.estimator.api._v2.estimator",
}

_state = {"prepared": False, "installed": False}


def python_supported(version: Sequence[int] = tuple(sys.version_info[:2])) -> bool:
    """Whether the package serves Python `version` (major, minor).

    >>> python_supported((3, 12)), python_supported((3, 14))
    (True, False)
    """
    low, high = SUPPORTED_PYTHONS
    return low <= tuple(version[:2]) <= high


def needed() -> bool:
    """Whether the installed TensorFlow lacks what tensorflow_estimator imports (2.16+).

    Read from TensorFlow's files, without importing it; False when TensorFlow
    is not installed.
    """
    spec = importlib.util.find_spec("tensorflow")
    if spec is None or not spec.submodule_search_locations:
        return False
    return not any(
        os.path.exists(os.path.join(location, "python", "distribute", "estimator_training.py"))
        for location in spec.submodule_search_locations
    )


def prepare() -> None:
    """Readies the layer before TensorFlow is imported; idempotent; nothing on TF 2.15.

    Raises:
      SystemExit: with `UNSUPPORTED_PYTHON`, on a Python the package cannot serve.
    """
    if _state["prepared"]:
        return
    if not python_supported():
        raise SystemExit(UNSUPPORTED_PYTHON.format(version=sys.version.split()[0]))
    _state["prepared"] = True
    if not needed():
        return
    os.environ.setdefault(LEGACY_KERAS_VARIABLE, "1")
    sys.meta_path.insert(0, _Finder())
    if "tensorflow" in sys.modules:
        # Imported before the package: install now, and give every compat module its attribute.
        install()
        for name in list(sys.modules):
            _add_estimator_attribute(name)


def installed() -> bool:
    """Whether the layer is in effect in this process (never on TensorFlow 2.15)."""
    return _state["installed"]


def legacy_keras() -> bool:
    """Whether `tf.keras` is Keras 2 here: TensorFlow 2.15, or 2.16+ with tf-keras chosen."""
    if not needed():
        return True
    return os.environ.get(LEGACY_KERAS_VARIABLE) in ("true", "True", "1")


def install() -> None:
    """Installs pieces 2-4 into an imported TensorFlow; idempotent."""
    if _state["installed"]:
        return
    _state["installed"] = True
    from estimator_dist.tf_runtime import coordinator

    _register(_GLUE, coordinator)
    for name in _TPU_MODULES:
        if name not in sys.modules:
            _register(name, _tpu_stand_in(name))
    from tensorflow.python.util import tf_export

    if not hasattr(tf_export, "ESTIMATOR_API_NAME"):
        tf_export.ESTIMATOR_API_NAME = _ESTIMATOR_API
        attributes = tf_export._Attributes
        tf_export.API_ATTRS[_ESTIMATOR_API] = attributes(
            "_estimator_api_names", "_estimator_api_constants"
        )
        tf_export.API_ATTRS_V1[_ESTIMATOR_API] = attributes(
            "_estimator_api_names_v1", "_estimator_api_constants_v1"
        )


def _register(name: str, module: types.ModuleType) -> None:
    """Makes `module` importable as `name`, and an attribute of its package."""
    package, _, attribute = name.rpartition(".")
    sys.modules[name] = module
    setattr(importlib.import_module(package), attribute, module)


def _tpu_stand_in(name: str) -> types.ModuleType:
    module = types.ModuleType(name, f"Stands in for {name}, removed in TensorFlow 2.16.")

    def stand_in(attribute: str) -> type:
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        qualified = f"{name}.{attribute}"

        def refuse(*args: Any, **kwargs: Any) -> None:
            import tensorflow as tf

            raise NotImplementedError(TPU_REMOVED.format(name=qualified, tf_version=tf.__version__))

        stand = type(attribute, (), {"__init__": refuse, "__module__": name})
        setattr(module, attribute, stand)
        return stand

    module.__getattr__ = stand_in
    return module


def _api_version(name: str) -> Optional[str]:
    """`v1`/`v2` for a module of TensorFlow's API that gets an `estimator` attribute."""
    if name == "tensorflow":
        return "v2"
    if name.startswith("tensorflow.") and name.rsplit(".", 2)[-2:-1] == ["compat"]:
        version = name.rsplit(".", 1)[-1]
        return version if version in _API_MODULES else None
    return None


def _add_estimator_attribute(name: str) -> None:
    version = _api_version(name)
    module = sys.modules.get(name)
    if version is None or module is None or _ESTIMATOR_API in vars(module):
        return
    from tensorflow.python.util.lazy_loader import LazyLoader

    # Imported on first use, into the module's own namespace, as TensorFlow 2.15 did.
    setattr(module, _ESTIMATOR_API, LazyLoader(_ESTIMATOR_API, vars(module), _API_MODULES[version]))


class _Finder(importlib.abc.MetaPathFinder):
    """Finds TensorFlow's API modules as usual, and finishes each after it executes."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if _api_version(fullname) is None:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Loader(spec.loader)
        return spec


class _Loader(importlib.abc.Loader):
    """TensorFlow's loader for one API module, then the layer's part of that module."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        if module.__name__ == "tensorflow":
            install()
        _add_estimator_attribute(module.__name__)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


# --- Keras 3 forced by the user --------------------------------------------------------


def explain_missing_variable(error: BaseException) -> Optional[str]:
    """`KERAS_3_MISSING_VARIABLE` for a checkpoint that lacks a variable under Keras 3.

    None when Keras 2 builds the model (the error means something else then) or
    the error names no missing variable.
    """
    if legacy_keras():
        return None
    message = str(getattr(error, "message", error))
    variable = _missing_variable(message)
    if variable is None:
        return None
    return KERAS_3_MISSING_VARIABLE.format(
        variable=variable, value=os.environ.get(LEGACY_KERAS_VARIABLE, "")
    )


def _missing_variable(message: str) -> Optional[str]:
    """The variable in TensorFlow's "Key <name> not found in checkpoint" message."""
    marker = " not found in checkpoint"
    start = message.find("Key ")
    end = message.find(marker, start)
    if start < 0 or end < 0:
        return None
    return message[start + len("Key ") : end].strip()
