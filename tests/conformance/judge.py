"""Judge recorded Alibaba Cloud requests against the official API models (cli/clouds/aliyun_models.py).

Why apart from the test: the conformance test judges the whole session's record, and the test that proves a
misspelled parameter fails it judges a record of its own; both read the same JSON lines (one request each:
product, version, action, params; written by tests/emulators/aliyun_rpc.py's record_request).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ngcx.clouds.aliyun_models import check


def requests_in(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def findings(requests: list[dict[str, Any]]) -> list[str]:
    """One line per distinct refused request shape: 'product version Action: Code: message'."""
    found: dict[str, None] = {}
    for request in requests:
        problem = check(request["product"], request["version"], request["action"], request["params"])
        if problem is not None:
            found[f"{request['product']} {request['version']} {request['action']}: {problem.line()}"] = None
    return list(found)
