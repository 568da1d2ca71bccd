"""Spec of the hashes in a project's ngcx.lock: every pin carries its file's sha256, and a lock without is refused.

pip's own `install --dry-run --report` (what `ngcx lock` runs inside the base) is run here for real on a local
wheel, so the report format is pip's, not a copy of it; the project build then installs the lock with
--require-hashes (recipes/project.Dockerfile.j2).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ngcx.core.errors import UserError
from ngcx.project.lock import Lock, parse_lock, pins_from_report


def make_wheel(folder: Path) -> Path:
    """A real, minimal pure wheel (ngcx-lock-probe 1.0): METADATA, WHEEL and RECORD, as PEP 427 lays them out."""
    import zipfile

    wheel = folder / "wheels" / "ngcx_lock_probe-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    info = "ngcx_lock_probe-1.0.dist-info"
    files = {"ngcx_lock_probe/__init__.py": "",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: ngcx-lock-probe\nVersion: 1.0\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in [*files, f"{info}/RECORD"]))
    return wheel


def test_lock_pins_carry_the_sha256_of_the_file_pip_chose(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path)
    report = tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--ignore-installed", "-q",
                    "--no-index", "--find-links", str(wheel.parent), "--report", str(report), "ngcx-lock-probe"],
                   check=True, capture_output=True)
    pins = pins_from_report(json.loads(report.read_text()))
    assert pins == [f"ngcx-lock-probe==1.0 --hash=sha256:{hashlib.sha256(wheel.read_bytes()).hexdigest()}"]


def test_a_package_with_nothing_to_hash_is_one_line() -> None:
    report = {"install": [{"metadata": {"name": "mypkg", "version": "0.1"}, "is_direct": True,
                           "download_info": {"url": "file:///src/mypkg", "dir_info": {}}}]}
    with pytest.raises(UserError, match=r"mypkg 0\.1 \(file:///src/mypkg\) has no sha256 to lock"):
        pins_from_report(report)


def test_a_lock_written_before_hashes_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """check_lock's last rule on a lock whose base and requirements still fit: a pin with no --hash."""
    from ngcx.project import lock as plock

    path = tmp_path / "ngcx.lock"
    path.write_text("# base: onnxruntime:25.08\n# base-image: t\n# base-id: sha256:1\n# base-layers: l\n"
                    "# requirements-sha256: r\nsix==1.17.0\n")
    parsed = parse_lock(path)
    assert parsed == Lock("onnxruntime:25.08", "t", "sha256:1", "l", "r", ("six==1.17.0",))

    class Release:
        ref = "onnxruntime:25.08"

    class Project:
        root, release, file = tmp_path, Release(), tmp_path / "ngcx.yaml"

    class Base:
        id, chain, tag = "sha256:1", "l", "t"

    monkeypatch.setattr(plock, "requirements_sha", lambda project: "r")
    with pytest.raises(UserError) as info:
        plock.check_lock(Project(), Base())
    assert info.value.line() == (f"{path}: six==1.17.0 has no --hash (the build installs with --require-hashes) "
                                 "(run `ngcx lock` again to record every wheel's sha256)")
