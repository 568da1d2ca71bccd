"""The GPU tests from a plain checkout on a GPU host, where ngcx is not installed (the lent GPU machine has torch
and no network for `pip install`): `ngcx_runtime` is imported from runtime/ through a folder on the import path
that holds one link, ngcx_runtime -> runtime/, for this process and (PYTHONPATH) for every server it starts.
Where ngcx is installed (`pip install -e .`) the installed package is used and nothing is added."""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"

if importlib.util.find_spec("ngcx_runtime") is None:
    shim = Path(tempfile.gettempdir()) / "ngcx-gpu-tests-path"
    shim.mkdir(exist_ok=True)
    link = shim / "ngcx_runtime"
    if not link.exists():
        link.symlink_to(RUNTIME)
    sys.path.insert(0, str(shim))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), os.environ.get("PYTHONPATH", "")) if p)
