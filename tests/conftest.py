"""Test-wide settings: the persistent plan cache lives in each test's own directory."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def private_plan_cache(tmp_path, monkeypatch):
    """No test reads plans another test (or the user) stored, and none writes to ~/.cache."""
    monkeypatch.setenv("AUTOSTREAM_PLAN_CACHE", str(tmp_path / "plans"))
