"""Fixtures for the runtime tests: an isolated plan cache per test, the shared model builders."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # `import models` from every test here


@pytest.fixture(autouse=True)
def plan_cache(tmp_path, monkeypatch) -> Path:
    """Each test gets its own optimize cache so cache hits are the test's own doing."""
    cache = tmp_path / "plan-cache"
    monkeypatch.setenv("NGCX_RUNTIME_CACHE", str(cache))
    return cache
