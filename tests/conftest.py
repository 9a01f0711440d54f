"""Shared fixtures: the embedded dataset prepared once per test session."""

import pytest


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A TFDS data_dir holding the prepared embedded digits dataset."""
    from input_fns import digits

    path = str(tmp_path_factory.mktemp("tfds"))
    digits.prepare({"data_dir": path})
    return path
