"""Every docstring example of the package runs and shows what it says.

The examples are documentation a user copies; one that no longer runs is a
lie. Examples that need files, a cluster or a long run say `# doctest: +SKIP`.
The entry points (`estimator_dist/<program>.py`) define their flags when
imported and show command lines, not Python; they are left out.
"""

import doctest
import importlib

import pytest

from tests.structure_test import MODULES, folder


@pytest.mark.parametrize("name", sorted(m for m in MODULES if folder(m) != "entry point"))
def test_docstring_examples_hold(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples of {name} fail"
