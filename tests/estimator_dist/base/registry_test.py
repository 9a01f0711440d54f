"""Name-to-callable registries with `module:function` paths."""

import os.path

import pytest

from estimator_dist.base.errors import Error, RegistryError, UsageError
from estimator_dist.base.registry import Registry

NOT_CALLABLE = 42


def double(x):
    return 2 * x


def triple(x):
    return 3 * x


def test_register_and_get():
    registry = Registry("model_fn")
    returned = registry.register("double")(double)
    assert returned is double
    assert registry.get("double") is double
    assert "double" in registry
    assert "triple" not in registry


def test_initial_entries_are_registered_and_listed_sorted():
    registry = Registry("model_fn", {"zeta": triple, "alpha": double})
    assert registry.get("alpha") is double
    assert registry.get("zeta") is triple
    assert registry.names() == ["alpha", "zeta"]
    assert list(registry) == ["alpha", "zeta"]


def test_register_as_decorator():
    registry = Registry("input_fn")

    @registry.register("mine")
    def mine():
        return "data"

    assert registry.get("mine")() == "data"


def test_fail_with_duplicate_name():
    registry = Registry("model_fn", {"double": double})
    with pytest.raises(ValueError) as raised:
        registry.register("double")(triple)
    message = str(raised.value)
    assert "model_fn 'double' is already registered" in message
    assert __name__ in message
    assert registry.get("double") is double


def test_fail_with_colon_in_initial_entry():
    with pytest.raises(ValueError, match="must not contain ':'"):
        Registry("model_fn", {"a:b": double})


def test_fail_with_colon_in_name():
    registry = Registry("keras_model")
    with pytest.raises(ValueError) as raised:
        registry.register("pkg:fn")(double)
    assert "keras_model name 'pkg:fn' must not contain ':'" in str(raised.value)
    assert "pkg:fn" not in registry
    assert registry.names() == []


def test_fail_with_unknown_name_lists_registered():
    registry = Registry("model_fn", {"double": double, "triple": triple})
    with pytest.raises(RegistryError) as raised:
        registry.get("quadruple")
    message = str(raised.value)
    assert "Unknown model_fn 'quadruple'" in message
    assert "Registered: double, triple." in message
    assert "'package.module:function'" in message


def test_module_function_path_is_imported():
    registry = Registry("model_fn")
    assert registry.get("os.path:basename") is os.path.basename
    assert registry.get(f"{__name__}:triple")(2) == 6


def test_fail_with_unimportable_module():
    registry = Registry("input_fn")
    with pytest.raises(RegistryError) as raised:
        registry.get("no_such_package_xyz.sub:fn")
    message = str(raised.value)
    assert "Cannot import module 'no_such_package_xyz.sub'" in message
    assert "input_fn 'no_such_package_xyz.sub:fn'" in message
    assert "PYTHONPATH" in message
    assert raised.value.__cause__ is None


def test_fail_with_missing_attribute():
    registry = Registry("model_fn")
    with pytest.raises(RegistryError) as raised:
        registry.get("os.path:no_such_function")
    message = str(raised.value)
    assert "module 'os.path' has nothing named 'no_such_function'" in message
    assert "expected a function" in message


def test_fail_with_attribute_not_callable():
    registry = Registry("model_fn")
    with pytest.raises(RegistryError) as raised:
        registry.get(f"{__name__}:NOT_CALLABLE")
    message = str(raised.value)
    assert f"module {__name__!r} has a int named 'NOT_CALLABLE'" in message
    assert "expected a function" in message


def test_fail_with_empty_attribute():
    with pytest.raises(RegistryError, match="has nothing named ''"):
        Registry("model_fn").get("os.path:")


def test_registry_error_is_a_usage_error():
    assert issubclass(RegistryError, UsageError)
    assert issubclass(RegistryError, Error)
    assert issubclass(RegistryError, ValueError)
    with pytest.raises(UsageError):
        Registry("model_fn").get("missing")


class _Model:
    def model_fn(self, features, labels, mode):
        return self, features

    def __call__(self, features, labels, mode):
        return features


MODEL = _Model()


def test_module_object_attribute_resolves_to_the_bound_method():
    method = Registry("model_fn").get(f"{__name__}:MODEL.model_fn")
    assert method("f", None, "train") == (MODEL, "f")


def test_callable_object_resolves_as_itself():
    assert Registry("model_fn").get(f"{__name__}:MODEL") is MODEL


def test_fail_with_missing_nested_attribute():
    with pytest.raises(RegistryError) as raised:
        Registry("model_fn").get(f"{__name__}:MODEL.no_such_method")
    message = str(raised.value)
    assert "has nothing named 'MODEL.no_such_method'" in message
    assert "module:object.method" in message
