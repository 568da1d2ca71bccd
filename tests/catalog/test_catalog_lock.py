"""Spec of the catalog's wheel hashes (registry.lock.yaml, `ngcx catalog lock`): what a release may install.

The shipped lock must cover every release that builds here, each layer's set hashed; a release whose pins the
lock does not hold (a bump with no refresh since) neither renders nor builds, in one line saying what to run.
A lock beside a copied catalog is the one that catalog builds with.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ngcx.catalog import load_catalog
from ngcx.catalog.lockdata import is_locked, lock_path, pin_key, release_lock
from ngcx.catalog.refresh import _keep, platforms
from ngcx.core import paths

SHIPPED = paths.registry_file()
NO_HASHES = ("ngcx: error: cuda:24.05 has no wheel hashes in registry.lock.yaml (every pip install runs with "
             "--require-hashes) (run `ngcx catalog lock` to fetch them from the package index)")


@pytest.fixture(autouse=True)
def _own_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NGCX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("NGCX_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.delenv("NGCX_DATA_DIR", raising=False)


def ngcx(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "ngcx", *args], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def one_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ngcx: error: "), proc.stderr
    return lines[0]


def bumped_catalog(tmp_path: Path) -> Path:
    """The shipped catalog with cuda:24.05's cudart bumped to a version no `ngcx catalog lock` has seen."""
    data = yaml.safe_load(SHIPPED.read_text())
    data["images"]["cuda"]["releases"]["24.05"]["pins"] = {"cudart": "nvidia-cuda-runtime-cu12==12.4.99"}
    file = tmp_path / "registry.yaml"
    file.write_text(yaml.safe_dump(data, sort_keys=False))
    return file


def test_shipped_lock_hashes_every_buildable_release() -> None:
    """Every image that builds here has its hashes: each pin, and a framework and runtime set holding the pins."""
    catalog = load_catalog()
    buildable = [r for r in catalog.all_releases() if catalog.image(r.image).buildable]
    assert buildable and all(is_locked(r, catalog.source) for r in buildable)
    for rel in buildable:
        lock = release_lock(rel, catalog.source)
        assert [req for req, _ in lock.stack] == [p.requirement for p in rel.pins]
        names = {req.split("==")[0] for req, _ in lock.runtime}
        assert {"grpcio", "protobuf", "orjson", "pysimdjson", "numpy", "setuptools"} <= names, rel.ref
        assert {pin_key(r) for r in rel.install} <= {pin_key(req) for req, _ in lock.framework}, rel.ref
        for _, hashes in (*lock.stack, *lock.framework, *lock.runtime):
            assert hashes and all(len(h) == 64 and int(h, 16) >= 0 for h in hashes)


def test_release_without_hashes_refuses_to_build(tmp_path: Path) -> None:
    """No hashes for a pin: render and build stop in one line before anything runs (exit 2)."""
    file = bumped_catalog(tmp_path)
    assert one_error(ngcx("render", "cuda:24.05", "--catalog", str(file))) == NO_HASHES
    assert one_error(ngcx("build", "cuda:24.05", "--base", "offline", "--catalog", str(file))) == NO_HASHES
    assert ngcx("render", "pytorch:24.11", "--catalog", str(file)).returncode == 0  # its stack's others still do


def test_lock_beside_a_catalog_is_the_one_it_builds_with(tmp_path: Path) -> None:
    """A copied catalog uses the lock next to it first: its hashes are what the Dockerfile checks."""
    file = tmp_path / "registry.yaml"
    file.write_text(SHIPPED.read_text())
    data = yaml.safe_load(lock_path(SHIPPED).read_text())
    key = "nvidia-cuda-runtime-cu12==12.4.127"
    data["hashes"][key] = ["0" * 64]
    lock_path(file).write_text(yaml.safe_dump(data))
    proc = ngcx("render", "cuda:24.05", "--catalog", str(file))
    assert proc.returncode == 0, proc.stderr
    assert f"pin='{key} --hash=sha256:{'0' * 64}'" in proc.stdout
    lock_path(file).write_text("just: text\n")
    line = one_error(ngcx("render", "cuda:24.05", "--catalog", str(file)))
    assert "not a catalog lock" in line and "ngcx catalog lock" in line


def test_refresh_keeps_linux_and_pure_files_of_the_exact_version() -> None:
    """The hashes pip may accept: every linux wheel (x86_64 and aarch64), pure wheels and the sdist, no other
    platform and no other version."""
    name, version = "nvidia-cuda-runtime-cu12", "12.4.127"
    assert _keep("nvidia_cuda_runtime_cu12-12.4.127-py3-none-manylinux2014_x86_64.whl", name, version)
    assert _keep("nvidia_cuda_runtime_cu12-12.4.127-py3-none-manylinux2014_aarch64.whl", name, version)
    assert not _keep("nvidia_cuda_runtime_cu12-12.4.127-py3-none-win_amd64.whl", name, version)
    assert not _keep("nvidia_cuda_runtime_cu12-12.4.1270-py3-none-manylinux2014_x86_64.whl", name, version)
    assert _keep("orjson-3.10.7.tar.gz", "orjson", "3.10.7")
    assert not _keep("orjson-3.10.7-cp311-cp311-macosx_10_15_x86_64.whl", "orjson", "3.10.7")
    tags = platforms("2.36")
    assert tags[0] == "manylinux_2_36_x86_64" and "manylinux_2_17_x86_64" in tags and "manylinux1_x86_64" in tags
    assert "manylinux_2_37_x86_64" not in tags  # newer than the base's glibc: would not load there
