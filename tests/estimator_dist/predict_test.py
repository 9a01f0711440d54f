"""Finding the SavedModel to predict with; the end-to-end run is in equivalence_test.py."""

import pytest

from estimator_dist.base.errors import UsageError
from estimator_dist.predict import find_saved_model


def _export(directory):
    directory.mkdir(parents=True)
    (directory / "saved_model.pb").write_bytes(b"")
    return str(directory)


def test_a_saved_model_directory_is_used_as_it_is(tmp_path):
    assert find_saved_model(_export(tmp_path / "m")) == str(tmp_path / "m")


def test_the_newest_timestamped_export_is_chosen(tmp_path):
    _export(tmp_path / "exports" / "999")
    newest = _export(tmp_path / "exports" / "1000")
    (tmp_path / "exports" / "1001").mkdir()  # an export still being written
    assert find_saved_model(str(tmp_path / "exports")) == newest


def test_a_model_dir_gives_its_best_export_before_its_latest(tmp_path):
    _export(tmp_path / "model" / "export" / "latest" / "2000")
    best = _export(tmp_path / "model" / "export" / "best" / "1000")
    assert find_saved_model(str(tmp_path / "model")) == best


def test_fail_with_a_directory_without_saved_model(tmp_path):
    with pytest.raises(UsageError, match="holds no SavedModel") as raised:
        find_saved_model(str(tmp_path))
    assert f"--export_dir={tmp_path}" in str(raised.value)
