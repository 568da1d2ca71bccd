"""Alibaba Cloud RPC protocol pieces for the ECS emulator: signature v1, request checks, replies.

Why a module of its own: the signature, the common-parameter checks and the error bodies are
what aliyun-python-sdk-core actually talks to, independent of any ECS state. Keeping them here
lets aliyun_ecs.py read as the cloud's behaviour and lets the §1 test vector (docs/cloud-apis.md)
be checked against exactly the code the server runs.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit
from xml.sax.saxutils import escape

TIMESTAMP_SKEW_S = 15 * 60
COMMON_REQUIRED = ("AccessKeyId", "Signature", "SignatureMethod", "SignatureVersion", "SignatureNonce",
                   "Timestamp", "Version", "Action")
# Parameters that take no part in "the same request" for ClientToken idempotency: they change on
# every send (the SDK re-signs each retry with a fresh nonce and timestamp).
VOLATILE_PARAMS = frozenset({"Signature", "SignatureNonce", "Timestamp", "SignatureType", "SignatureMethod",
                             "SignatureVersion", "Format", "AccessKeyId"})

MESSAGES = {
    "InvalidAccessKeyId.NotFound": "Specified access key is not found.",
    "SignatureDoesNotMatch": "Specified signature is not matched with our calculation.",
    "InvalidSignatureMethod": "Specified signature method is not valid.",
    "InvalidTimeStamp.Format": "Specified time stamp or date value is not well formatted.",
    "InvalidTimeStamp.Expired": "Specified time stamp or date value is expired.",
    "SignatureNonceUsed": "Specified signature nonce was used already.",
    "InvalidAction.NotFound": "Specified api is not found, please check your url and method.",
    "Throttling": "Request was denied due to flow control.",
    "Throttling.User": "Request was denied due to user flow control.",
    "Throttling.Api": "Request was denied due to api flow control.",
    "InternalError": "The request processing has failed due to some unknown error, exception or failure.",
    "ServiceUnavailable": "The request has failed due to a temporary failure of the server.",
    "OperationDenied.NoStock": "The requested resource is sold out in the specified zone; try other types of "
                               "resources or other regions and zones.",
    "IncorrectInstanceStatus": "The current status of the resource does not support this operation.",
    "IdempotentParameterMismatch": "The specified parameters are different from before with the same ClientToken.",
}


class ApiError(Exception):
    """One error answer: HTTP status + Code + Message, rendered as the real gateway does."""

    def __init__(self, http_status: int, code: str, message: str | None = None) -> None:
        super().__init__(f"{http_status} {code}")
        self.http_status = http_status
        self.code = code
        self.message = message or MESSAGES.get(code, f"The request failed: {code}.")


def missing(name: str) -> ApiError:
    """The error for an absent mandatory action parameter (`Missing{Name}`)."""
    return ApiError(400, f"Missing{name.replace('.', '')}",
                    f'The input parameter "{name}" that is mandatory for processing this request is not supplied.')


def invalid(name: str, why: str = "") -> ApiError:
    """400 InvalidParameter naming the parameter (and why, when it helps the caller)."""
    return ApiError(400, "InvalidParameter", f'The specified parameter "{name}" is not valid. {why}'.rstrip())


# --- signature v1 (cloud-apis.md §1) ---------------------------------------------------------

def percent_encode(value: str) -> str:
    """RFC 3986 encoding as Alibaba Cloud signs it: only A-Z a-z 0-9 - _ . ~ stay literal."""
    return quote(str(value), safe="-_.~")


def string_to_sign(method: str, params: Mapping[str, str]) -> str:
    """METHOD&%2F&pe(sorted canonical query), every parameter but Signature (query and body alike)."""
    canonical = "&".join(f"{percent_encode(k)}={percent_encode(v)}"
                         for k, v in sorted(params.items()) if k != "Signature")
    return f"{method.upper()}&%2F&{percent_encode(canonical)}"


def sign(sts: str, secret: str) -> str:
    """Base64(HMAC-SHA1(secret + '&', StringToSign)): the trailing '&' is part of the key."""
    digest = hmac.new((secret + "&").encode(), sts.encode(), hashlib.sha1).digest()
    return base64.b64encode(digest).decode()


def signed_query(method: str, params: Mapping[str, str], secret: str) -> str:
    """A ready query string for `params` plus their Signature (what a hand-written client sends)."""
    full = dict(params)
    full["Signature"] = sign(string_to_sign(method, full), secret)
    return "&".join(f"{percent_encode(k)}={percent_encode(v)}" for k, v in full.items())


# --- common-parameter checks -----------------------------------------------------------------

class NonceStore:
    """SignatureNonces seen within the replay window; not thread-safe (callers hold their lock)."""

    def __init__(self, window_s: float = 2 * TIMESTAMP_SKEW_S) -> None:
        self._seen: dict[tuple[str, str], float] = {}
        self._window_s = window_s

    def use(self, access_key_id: str, nonce: str, now: float) -> bool:
        """Record the nonce; False when it was already used (a replayed request)."""
        self._seen = {key: at for key, at in self._seen.items() if now - at < self._window_s}
        if (access_key_id, nonce) in self._seen:
            return False
        self._seen[(access_key_id, nonce)] = now
        return True


def parse_timestamp(value: str) -> float:
    """UTC ISO 8601 `YYYY-MM-DDThh:mm:ssZ` (fractions tolerated) -> epoch seconds."""
    for fmt in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S.%fZ"):
        try:
            return datetime.strptime(value, fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    raise ApiError(400, "InvalidTimeStamp.Format")


def verify(method: str, params: Mapping[str, str], access_keys: Mapping[str, str], nonces: NonceStore,
           lock: threading.Lock | threading.RLock, now: float | None = None) -> None:
    """Raise the ApiError the real gateway answers for a request that is not properly signed.

    Order: mandatory common parameters, access key, signature method/version, signature,
    timestamp window, nonce (recorded only for requests whose signature verified).
    """
    for name in COMMON_REQUIRED:
        if not params.get(name):
            raise ApiError(400, "MissingParameter",
                           f'The input parameter "{name}" that is mandatory for processing this request '
                           "is not supplied.")
    secret = access_keys.get(params["AccessKeyId"])
    if secret is None:
        raise ApiError(404, "InvalidAccessKeyId.NotFound")
    if params["SignatureMethod"] != "HMAC-SHA1":
        raise ApiError(400, "InvalidSignatureMethod")
    if params["SignatureVersion"] != "1.0":
        raise invalid("SignatureVersion", "Only 1.0 is supported.")
    sts = string_to_sign(method, params)
    if not hmac.compare_digest(sign(sts, secret), params["Signature"]):
        # The SDK compares Message.split(':')[1] with its own StringToSign to say "wrong secret".
        raise ApiError(400, "SignatureDoesNotMatch",
                       f"{MESSAGES['SignatureDoesNotMatch']} server string to sign is:{sts}")
    now = time.time() if now is None else now
    if abs(now - parse_timestamp(params["Timestamp"])) > TIMESTAMP_SKEW_S:
        raise ApiError(400, "InvalidTimeStamp.Expired")
    with lock:
        if not nonces.use(params["AccessKeyId"], params["SignatureNonce"], now):
            raise ApiError(400, "SignatureNonceUsed")


# --- action parameters -----------------------------------------------------------------------

def required(params: Mapping[str, str], name: str) -> str:
    value = params.get(name, "")
    if value == "":
        raise missing(name)
    return value


def as_bool(params: Mapping[str, str], name: str, default: bool = False) -> bool:
    """The SDK sends Python booleans as 'True'/'False'; hand-written clients send 'true'."""
    value = params.get(name, "")
    if value == "":
        return default
    if value.lower() not in ("true", "false"):
        raise invalid(name, "Expected true or false.")
    return value.lower() == "true"


def as_int(params: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    value = params.get(name, "")
    if value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise invalid(name, "Expected an integer.") from None
    if not low <= number <= high:
        raise invalid(name, f"Expected {low}..{high}.")
    return number


def repeated(params: Mapping[str, str], prefix: str) -> list[str]:
    """`InstanceId.1`, `InstanceId.2`, ... in index order (the SDK's RepeatList)."""
    found = [(int(key[len(prefix) + 1:]), value) for key, value in params.items()
             if key.startswith(prefix + ".") and key[len(prefix) + 1:].isdigit()]
    return [value for _, value in sorted(found)]


def indexed(params: Mapping[str, str], prefix: str) -> list[dict[str, str]]:
    """`Tag.1.Key`/`Tag.1.Value` ... -> [{'Key': .., 'Value': ..}, ...] in index order."""
    groups: dict[int, dict[str, str]] = {}
    for key, value in params.items():
        parts = key.split(".")
        if len(parts) == 3 and parts[0] == prefix and parts[1].isdigit():
            groups.setdefault(int(parts[1]), {})[parts[2]] = value
    return [groups[index] for index in sorted(groups)]


def json_list(params: Mapping[str, str], name: str, limit: int = 100) -> list[str] | None:
    """A JSON-array-string parameter such as DescribeInstances.InstanceIds (None when absent)."""
    value = params.get(name, "")
    if value == "":
        return None
    try:
        items = json.loads(value)
    except ValueError:
        raise invalid(name, "Expected a JSON array of strings.") from None
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items) or len(items) > limit:
        raise invalid(name, f"Expected a JSON array of at most {limit} strings.")
    return items


def decode_base64(value: str) -> bytes | None:
    """Strict base64 (None when it is not): UserData and CommandContent must be exact."""
    try:
        return base64.b64decode(value.encode(), validate=True)
    except (binascii.Error, ValueError):
        return None


def page(items: list[Any], params: Mapping[str, str], default_size: int = 10) -> tuple[list[Any], dict[str, int]]:
    """PageNumber/PageSize paging (max 100) -> (this page, the TotalCount/PageNumber/PageSize fields)."""
    number = as_int(params, "PageNumber", 1, 1, 1_000_000)
    size = as_int(params, "PageSize", default_size, 1, 100)
    start = (number - 1) * size
    return items[start:start + size], {"TotalCount": len(items), "PageNumber": number, "PageSize": size}


# --- replies ---------------------------------------------------------------------------------

def new_request_id() -> str:
    return str(uuid.uuid4()).upper()


def iso_now(minutes: bool = False) -> str:
    """UTC times as ECS prints them (instances use minute precision: 2024-05-01T08:30Z)."""
    return time.strftime("%Y-%m-%dT%H:%MZ" if minutes else "%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _xml(name: str, value: Any) -> str:
    if isinstance(value, dict):
        return f"<{name}>{''.join(_xml(key, item) for key, item in value.items())}</{name}>"
    if isinstance(value, list):
        return "".join(_xml(name, item) for item in value)
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return f"<{name}>{escape(text)}</{name}>"


def render(payload: Mapping[str, Any], fmt: str, root: str) -> tuple[bytes, str]:
    """JSON when Format=JSON (the SDK forces it), else XML under `root`, as the gateway answers."""
    if fmt.upper() == "JSON":
        return json.dumps(payload).encode(), "application/json;charset=utf-8"
    return f'<?xml version="1.0" encoding="UTF-8"?>{_xml(root, dict(payload))}'.encode(), "text/xml;charset=utf-8"


def error_payload(error: ApiError, request_id: str, host_id: str, product: str) -> dict[str, str]:
    return {"RequestId": request_id, "HostId": host_id, "Code": error.code, "Message": error.message,
            "Recommend": f"https://api.aliyun.com/troubleshoot?q={error.code}&product={product}&requestId={request_id}"}


# --- HTTP ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str
    request_id: str


Handler = Callable[[str, dict[str, str]], Reply]


def parse_request(query: str, body: bytes, content_type: str) -> dict[str, str]:
    """Query and form body merged (the SDK signs both); empty values kept (SignatureType=)."""
    params = dict(parse_qsl(query, keep_blank_values=True))
    if body and "application/x-www-form-urlencoded" in content_type.lower():
        params.update(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    return params


class _RpcHandler(BaseHTTPRequestHandler):
    server: RpcServer

    def _serve(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if url.path not in ("", "/"):
            reply = self.server.not_found()
        else:
            params = parse_request(url.query, body, self.headers.get("Content-Type", ""))
            reply = self.server.handler(self.command, params)
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.send_header("x-acs-request-id", reply.request_id)
        self.end_headers()
        self.wfile.write(reply.body)

    do_GET = do_POST = _serve

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: request lines carry signatures, and tests read their own assertions, not logs."""


class RpcServer(ThreadingHTTPServer):
    """A threaded HTTP server on 127.0.0.1 that hands (method, params) to one handler."""

    daemon_threads = True

    def __init__(self, handler: Handler, not_found: Callable[[], Reply]) -> None:
        super().__init__(("127.0.0.1", 0), _RpcHandler)
        self.handler = handler
        self.not_found = not_found
