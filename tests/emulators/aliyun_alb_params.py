"""ALB's request parameters (2020-06-16): how each is checked, its defaults, and the shapes of errors, tags and pages.

Why apart from aliyun_alb.py: the rules a request must pass (IllegalParam.<Name>, ranges, choices, tags,
NextToken paging, HealthCheckConfig.* and ConnectionDrainConfig.*) are pure functions of the parameters,
shared by every ALB action and changed on their own (aliyun_rpc.py checks the gateway's side: signature,
common parameters); aliyun_alb.py keeps the state and the data plane.
"""

from __future__ import annotations

import secrets
import string
import uuid
from collections.abc import Mapping
from typing import Any

from .aliyun_rpc import ApiError, as_bool, as_int, indexed, missing, repeated

HEALTH_CODES = ("http_2xx", "http_3xx", "http_4xx", "http_5xx")
HEALTH_INTS = {"HealthCheckInterval": (1, 50), "HealthCheckTimeout": (1, 300), "HealthyThreshold": (2, 10),
               "UnhealthyThreshold": (2, 10)}
HEALTH_DEFAULTS = {"HealthCheckEnabled": True, "HealthCheckPath": "/", "HealthCheckProtocol": "HTTP",
                   "HealthCheckMethod": "GET", "HealthCheckInterval": 2, "HealthCheckTimeout": 5, "HealthyThreshold": 3,
                   "UnhealthyThreshold": 3, "HealthCheckCodes": ["http_2xx"], "HealthCheckHttpVersion": "HTTP1.1"}


def new_id(prefix: str) -> str:
    return prefix + "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(18))


def job(**fields: str) -> dict[str, str]:
    return {**fields, "JobId": str(uuid.uuid4())}


def illegal(name: str, why: str = "") -> ApiError:
    return bad(f"IllegalParam.{name}", f"The param of {name} is illegal. {why}".rstrip())


def bad(code: str, message: str) -> ApiError:
    return ApiError(400, code, message)


def not_found(kind: str, resource_id: str) -> ApiError:
    return ApiError(404, f"ResourceNotFound.{kind}", f"The specified resource {kind} [{resource_id}] is not found.")


def choice(params: Mapping[str, str], name: str, allowed: tuple[str, ...], default: str = "") -> str:
    value = params.get(name) or default
    if value not in allowed:
        raise missing(name) if not value else illegal(name, f"Expected one of {', '.join(allowed)}.")
    return value


def paged(items: list[Any], params: Mapping[str, str], key: str) -> dict[str, Any]:
    """NextToken/MaxResults paging (1..100, default 20); the token is the offset of the next page."""
    size, token = as_int(params, "MaxResults", 20, 1, 100), params.get("NextToken", "")
    if token and not token.isdigit():
        raise illegal("NextToken")
    start, end = int(token or 0), int(token or 0) + size
    return {key: items[start:end], "MaxResults": size, "TotalCount": len(items),
            "NextToken": str(end) if end < len(items) else ""}


def parse_tags(params: Mapping[str, str]) -> dict[str, str]:
    tags = {tag.get("Key", ""): tag.get("Value", "") for tag in indexed(params, "Tag")}
    if any(not key or len(key) > 128 or key.startswith(("aliyun", "acs:")) or "://" in key for key in tags):
        raise illegal("Tag.Key", "At most 128 characters, not starting with aliyun or acs:.")
    if len(tags) > 20:
        raise illegal("Tag", "At most 20 tags.")
    return tags


def tags_match(tags: Mapping[str, str], params: Mapping[str, str]) -> bool:
    return all(want.get("Key") in tags and ("Value" not in want or tags[want["Key"]] == want["Value"])
               for want in indexed(params, "Tag"))


def tag_view(tags: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"Key": key, "Value": value} for key, value in tags.items()]


def health_config(params: Mapping[str, str], now: Mapping[str, Any]) -> dict[str, Any]:
    """`now` (a HealthCheckConfig as ListServerGroups shows it) changed by the HealthCheckConfig.* parameters."""
    p, h = "HealthCheckConfig.", dict(now)
    h["HealthCheckEnabled"] = as_bool(params, p + "HealthCheckEnabled", h["HealthCheckEnabled"])
    h["HealthCheckPath"] = params.get(p + "HealthCheckPath", h["HealthCheckPath"])
    if not h["HealthCheckPath"].startswith("/") or len(h["HealthCheckPath"]) > 80:
        raise illegal(p + "HealthCheckPath", "1..80 characters starting with /.")
    h["HealthCheckProtocol"] = choice(params, p + "HealthCheckProtocol", ("HTTP", "HTTPS"), h["HealthCheckProtocol"])
    for name, (low, high) in HEALTH_INTS.items():
        h[name] = as_int(params, p + name, h[name], low, high)
    codes = repeated(params, p + "HealthCheckCodes") or repeated(params, p + "HealthCheckHttpCodes")
    if any(code not in HEALTH_CODES for code in codes):
        raise illegal(p + "HealthCheckCodes", f"Expected {', '.join(HEALTH_CODES)}.")
    h["HealthCheckCodes"] = list(dict.fromkeys(codes)) or h["HealthCheckCodes"]
    return h


def drain_config(params: Mapping[str, str], now: tuple[bool, int]) -> tuple[bool, int]:
    return (as_bool(params, "ConnectionDrainConfig.ConnectionDrainEnabled", now[0]),
            as_int(params, "ConnectionDrainConfig.ConnectionDrainTimeout", now[1], 0, 900))
