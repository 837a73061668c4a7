import tempfile

import pytest


@pytest.fixture(autouse=True)
def verify_temporary_files_in_a_test_folder(tmp_path_factory, monkeypatch):
    """verify keeps each run's logs in a folder of the system's temporary directory: in tests,
    one pytest removes, apart from the trees under test."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path_factory.mktemp("system-temp")))
