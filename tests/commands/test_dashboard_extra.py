"""`ngcx dashboard` without the dashboard extra: one line naming what to install, exit 2, no traceback.

What a user notices (issue 46): `pip install ngcx` without `[dashboard]`, then `ngcx dashboard`, ended in
`ModuleNotFoundError: No module named 'uvicorn'`; the cloud SDK extras say in one line what to install.
The extra's modules are made unimportable in the CLI's own process by a meta-path finder that answers
them as Python does for a module that is not installed (ModuleNotFoundError with the module's name).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

WRAPPER = """
import sys

BLOCKED = set(sys.argv[1].split(","))


class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NotInstalled())
from ngcx.main import main

main(sys.argv[2:])
"""


@pytest.mark.parametrize("missing", ["uvicorn", "starlette", "prometheus_client", "uvicorn,starlette"])
def test_dashboard_without_its_extra_is_one_line_and_exit_2(missing: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", WRAPPER, missing, "dashboard", "--port", "0"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "NGCX_STATE_DIR": str(tmp_path / "state")})
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("ngcx: error: ngcx dashboard needs ") and any(m in line for m in missing.split(",")), line
    assert "pip install 'ngcx[dashboard]'" in line, line
    assert done.stdout == ""
