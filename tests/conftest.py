"""Test isolation: every test gets its own knowledge base file (never ~/.cache)."""

import pytest


@pytest.fixture(autouse=True)
def _isolated_kb(tmp_path, monkeypatch):
    monkeypatch.setenv("INFERLOOM_KB", str(tmp_path / "kb.sqlite"))
