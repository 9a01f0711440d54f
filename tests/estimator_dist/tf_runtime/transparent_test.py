"""A wrapper made by `wrap_like` reads, to TensorFlow and to `inspect`, as its target."""

import functools
import inspect

import pytest
from tensorflow.python.util import function_utils

from estimator_dist.tf_runtime.transparent import wrap_like


def function(mode, params, input_context=None):
    return mode, params, input_context


class Holder:
    def method(self, mode, params):
        return mode, params

    def __call__(self, params, config=None):
        return params, config

    @staticmethod
    def static(mode):
        return mode

    @classmethod
    def klass(cls, params):
        return params


TARGETS = {
    "function": function,
    "bound method": Holder().method,
    "callable object": Holder(),
    "static method": Holder.static,
    "class method": Holder.klass,
    "lambda": lambda params: params,
    "partial, keyword": functools.partial(function, input_context="ctx"),
    "partial, positional": functools.partial(function, "train"),
    "partial of a callable object": functools.partial(Holder(), config="c"),
    "partial, first argument by keyword": functools.partial(function, mode="train"),
}


def _forwarding(target):
    return wrap_like(target, lambda *args, **kwargs: ("wrapped", target(*args, **kwargs)))


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_tensorflow_reads_the_targets_arguments(name):
    target = TARGETS[name]
    assert function_utils.fn_args(_forwarding(target)) == function_utils.fn_args(target)


@pytest.mark.parametrize("name", sorted(name for name in TARGETS if "partial" not in name))
def test_inspect_reads_the_targets_signature(name):
    target = TARGETS[name]
    assert inspect.signature(_forwarding(target)) == inspect.signature(target)


def test_the_wrapper_runs_and_carries_the_targets_name_and_attributes():
    def input_fn(params):
        return params

    input_fn.note = "kept"
    wrapper = _forwarding(input_fn)
    assert wrapper(params=3) == ("wrapped", 3)
    assert (wrapper.__name__, wrapper.note, wrapper.__wrapped__) == ("input_fn", "kept", input_fn)


def test_a_plain_wrapper_reads_differently():
    # The control: without wrap_like, TensorFlow would pass a wrapper nothing it declares.
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)

    assert function_utils.fn_args(wrapper) != function_utils.fn_args(function)
