"""RAM policy documents: what RAM accepts as a policy or a trust policy, and how a statement matches.

Why apart from aliyun_ram.py: the document rules (JSON, Version "1", Effect / Action / Resource or
Principal) and RAM's wildcard matching are pure functions of a document, used when a role or policy is
created and when STS keys are checked against a role's policies; no state, no actions. The checks take
the stricter reading where RAM's documentation leaves one open (see aliyun_ram.py's docstring).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from .aliyun_rpc import ApiError

ECS_SERVICE = "ecs.aliyuncs.com"
DOCUMENT_LIMIT = 6144


def _malformed(why: str) -> ApiError:
    return ApiError(400, "MalformedPolicyDocument", f"The policy document is malformed: {why}")


def as_list(value: Any) -> list[Any]:
    """Action/Resource/Principal members may be one string or a list of them."""
    return value if isinstance(value, list) else [value]


def _check_strings(statement: Mapping[str, Any], key: str) -> None:
    values = as_list(statement.get(key))
    if not values or not all(isinstance(v, str) and v for v in values):
        raise _malformed(f'"{key}" must be a non-empty string or list of strings.')


def _check_statement(statement: Any, trust: bool) -> None:
    if not isinstance(statement, dict):
        raise _malformed("each Statement must be an object.")
    if statement.get("Effect") not in ("Allow", "Deny"):
        raise _malformed('"Effect" must be Allow or Deny.')
    _check_strings(statement, "Action")
    if trust:
        if not isinstance(statement.get("Principal"), dict) or not statement["Principal"]:
            raise _malformed('a trust policy statement needs a "Principal" object.')
    else:
        _check_strings(statement, "Resource")


def parse_document(text: str, name: str, trust: bool = False) -> dict[str, Any]:
    """A policy (or, with `trust`, an AssumeRolePolicyDocument) as RAM accepts it: a JSON object with
    Version "1" and a non-empty Statement list; each statement has Effect, Action and Resource
    (trust: Principal)."""
    if len(text) > DOCUMENT_LIMIT:
        raise ApiError(400, f"InvalidParameter.{name}.Length", f'The parameter - "{name}" beyond the length limit.')
    try:
        document = json.loads(text)
    except ValueError:
        raise _malformed("it is not valid JSON.") from None
    if not isinstance(document, dict) or document.get("Version") != "1":
        raise _malformed('it must be a JSON object with "Version": "1".')
    statements = document.get("Statement")
    if not isinstance(statements, list) or not statements:
        raise _malformed('"Statement" must be a non-empty list.')
    for statement in statements:
        _check_statement(statement, trust)
    return document


def wildcard(pattern: str, value: str, ignore_case: bool = False) -> bool:
    """RAM's matching: `*` is any run of characters, `?` any one; actions compare case-insensitively."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    flags = (re.IGNORECASE | re.DOTALL) if ignore_case else re.DOTALL
    return re.fullmatch(regex, value, flags) is not None


def statement_matches(statement: Mapping[str, Any], action: str, resource: str) -> bool:
    return (any(wildcard(a, action, ignore_case=True) for a in as_list(statement["Action"]))
            and any(wildcard(r, resource) for r in as_list(statement["Resource"])))


def trusts_ecs(document: Mapping[str, Any]) -> bool:
    """Whether ECS may assume the role: an Allow of sts:AssumeRole for the ecs.aliyuncs.com service."""
    for statement in document["Statement"]:
        services = as_list(statement["Principal"].get("Service", []))
        if (statement["Effect"] == "Allow" and ECS_SERVICE in services
                and any(wildcard(a, "sts:AssumeRole", ignore_case=True) for a in as_list(statement["Action"]))):
            return True
    return False
