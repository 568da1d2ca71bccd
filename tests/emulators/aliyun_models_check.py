"""The official API models at the emulators' gateways: the check every Alibaba Cloud emulator answers with, and
the record of every request the conformance test judges (issue 47).

Why a module of its own: the RPC gateway (aliyun_rpc.py) and the ROA one (aliyun_roa.py) both check and record,
with the very checker the CLI runs before sending (ngcx.clouds.aliyun_models), so the emulators refuse exactly
what the models refuse: an unknown action (404 InvalidAction.NotFound), an unknown parameter (400
InvalidParameter), a missing required one (400 MissingParameter), a JSON-style value that does not parse.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping

from ngcx.clouds.aliyun_models import Problem, check


def recordable(params: Mapping[str, str]) -> dict[str, str]:
    """A request as `calls` keeps it: no Signature, and a SecurityToken only as a marker (it is a secret:
    tests search everything for leaked tokens, the emulator's own record must not be a false hit)."""
    kept = {k: v for k, v in params.items() if k != "Signature"}
    if "SecurityToken" in kept:
        kept["SecurityToken"] = "(redacted)"
    return kept


# --- the official models (issue 47) ------------------------------------------------------------

REQUEST_LOG_ENV = "NGCX_ALIYUN_REQUEST_LOG"   # a file every gateway appends each request to (tests/conformance)
MODEL_CHECK_ENV = "NGCX_ALIYUN_MODEL_CHECK"   # "off": answer without the model check (the conformance run
                                              # judges the record itself, so one wrong name does not hide the next)


def model_problem(product: str, version: str, action: str, params: Mapping[str, str]) -> Problem | None:
    """The error the real gateway answers for a request its API model refuses (an unknown action or
    parameter, a missing required one, a JSON-style value that does not parse), from the same models the
    CLI checks before sending (cli/clouds/aliyun_models.py)."""
    if os.environ.get(MODEL_CHECK_ENV) == "off":
        return None
    return check(product, version, action, dict(params))


def record_request(product: str, params: Mapping[str, str], agent: str = "") -> None:
    """Append the request (no Signature, SecurityToken redacted) as one JSON line to $NGCX_ALIYUN_REQUEST_LOG;
    `sender` is "ngcx" for ngcx's own requests (the CLI's SDK client and the host's role login name
    themselves in their User-Agent), else "test" (a test's hand-made request, possibly wrong on purpose)."""
    path = os.environ.get(REQUEST_LOG_ENV)
    if not path:
        return
    line = json.dumps({"product": product, "version": params.get("Version", ""), "action": params.get("Action", ""),
                       "sender": "ngcx" if "ngcx" in agent else "test", "params": recordable(params)})
    with _LOG_LOCK, open(path, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")


_LOG_LOCK = threading.Lock()
