"""bench/suites/trust.py: the "before" build really runs the commit before the wheel hashes.

Why: the build figure compares HEAD with commit BEFORE through a git worktree put first on PYTHONPATH; if the
venv's editable install of HEAD won instead, both rows would time the same code and the ratio would say nothing.
The suite itself (pushes of a 2 GB image, six --no-cache builds) is far too slow for a test.
"""

from __future__ import annotations

import os
from pathlib import Path

import bench_samples  # noqa: F401  (puts the repo root on sys.path: bench/ is not installed)
import pytest

from bench.suites import SUITES, trust


def test_the_suite_is_registered_as_trust() -> None:
    assert SUITES["trust"] is trust.run


def test_the_before_worktree_is_what_imports_and_head_is_refused(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        tree, shim = trust._worktree(tmp_path)
        loaded = trust._check_loads(tree, {**env, "PYTHONPATH": str(shim)})
        assert loaded == ["cli/__init__.py", "runtime/__init__.py"]
        assert not (tree / "cli" / "trust").exists()         # 0e48917 predates cli/trust/ (issue 48)
        with pytest.raises(RuntimeError, match="PYTHONPATH did not win"):
            trust._check_loads(tree, env)                    # without it the venv's editable HEAD loads
    finally:
        trust._drop_worktree(tmp_path)
    assert not (tmp_path / f"ngcx-{trust.BEFORE}").exists()
