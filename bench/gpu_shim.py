"""Make `ngcx_runtime` importable from a plain checkout (the lent GPU machine has no install).

Why: the package directory is runtime/ but its import name is ngcx_runtime (pyproject's
package-dir mapping); an uninstalled checkout needs this one mapping, nothing else.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def ensure_ngcx_runtime() -> None:
    try:
        import ngcx_runtime  # noqa: F401

        return
    except ImportError:
        pass
    spec = importlib.util.spec_from_file_location(
        "ngcx_runtime", REPO / "runtime" / "__init__.py", submodule_search_locations=[str(REPO / "runtime")]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["ngcx_runtime"] = module
    spec.loader.exec_module(module)
