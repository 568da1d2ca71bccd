"""Alibaba Cloud RPC protocol for the ECS emulator: signature v1, request checks, replies, the gateway.

Why a module of its own: the signature, the common-parameter checks and the error bodies are
what aliyun-python-sdk-core actually talks to, independent of any ECS state. Keeping them here
lets aliyun_ecs.py read as the cloud's behaviour and lets the §1 test vector (reference/cloud-apis.md)
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
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qsl, quote, urlsplit
from xml.sax.saxutils import escape

from .aliyun_models_check import model_problem, record_request, recordable

TIMESTAMP_SKEW_S = 15 * 60
COMMON_REQUIRED = ("AccessKeyId", "Signature", "SignatureMethod", "SignatureVersion", "SignatureNonce",
                   "Timestamp", "Version", "Action")
# Parameters that take no part in "the same request" for ClientToken idempotency: they change on
# every send (the SDK re-signs each retry with a fresh nonce and timestamp).
VOLATILE_PARAMS = frozenset({"Signature", "SignatureNonce", "Timestamp", "SignatureType", "SignatureMethod",
                             "SignatureVersion", "Format", "AccessKeyId", "SecurityToken"})

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
    "MissingSecurityToken": "SecurityToken is mandatory for temporary access keys.",
    "InvalidSecurityToken.Expired": "Specified SecurityToken is expired.",
    "InvalidSecurityToken.Malformed": "Specified SecurityToken is malformed.",
    "InvalidSecurityToken.MismatchWithAccessKey": "Specified SecurityToken mismatch with the AccessKey.",
    "Forbidden.RAM": "User not authorized to operate on the specified resource, or this API doesn't support RAM.",
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


# (AccessKeyId, SecurityToken) -> the secret of a temporary (STS) key, None when the key is not one;
# raises the InvalidSecurityToken.* / MissingSecurityToken ApiError when the token does not fit the key.
TemporaryKeys = Callable[[str, str], str | None]


def verify(method: str, params: Mapping[str, str], access_keys: Mapping[str, str], nonces: NonceStore,
           lock: threading.Lock | threading.RLock, now: float | None = None,
           temporary_keys: TemporaryKeys | None = None) -> None:
    """Raise the ApiError the real gateway answers for a request that is not properly signed.

    Order: mandatory common parameters, access key (a temporary one only with its SecurityToken),
    signature method/version, signature, timestamp window, nonce (recorded only for requests whose
    signature verified).
    """
    for name in COMMON_REQUIRED:
        if not params.get(name):
            raise ApiError(400, "MissingParameter",
                           f'The input parameter "{name}" that is mandatory for processing this request '
                           "is not supplied.")
    secret = access_keys.get(params["AccessKeyId"])
    if secret is None and temporary_keys is not None:
        secret = temporary_keys(params["AccessKeyId"], params.get("SecurityToken", ""))
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


Handler = Callable[[str, dict[str, str], str], Reply]     # (method, params, User-Agent) -> reply


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
        if url.path not in ("", "/"):      # a ROA path (aliyun_roa.py), else 404
            reply = self.server.other_path(self.command, url.path, url.query, {k.lower(): v for k, v in
                                                                                self.headers.items()})
        else:
            params = parse_request(url.query, body, self.headers.get("Content-Type", ""))
            reply = self.server.handler(self.command, params, self.headers.get("User-Agent", ""))
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", reply.content_type)
            self.send_header("Content-Length", str(len(reply.body)))
            self.send_header("x-acs-request-id", reply.request_id)
            self.end_headers()
            self.wfile.write(reply.body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client died waiting (a test's kill -9): the cloud did the work, nobody hears back

    do_GET = do_POST = _serve

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: request lines carry signatures, and tests read their own assertions, not logs."""


class RpcServer(ThreadingHTTPServer):
    """A threaded HTTP server on 127.0.0.1 that hands (method, params) to one handler."""

    daemon_threads = True

    def __init__(self, handler: Handler, other_path: Callable[[str, str, str, dict[str, str]], Reply]) -> None:
        super().__init__(("127.0.0.1", 0), _RpcHandler)
        self.handler = handler
        self.other_path = other_path     # (method, path, query, lower-cased headers) -> reply


# --- the gateway: dispatch, ClientToken, faults, holds ----------------------------------------

Action = Callable[[dict[str, str]], dict[str, Any]]


@dataclass
class Fault:
    code: str
    http_status: int
    remaining: int
    after_effect: bool


class RpcService:
    """An Alibaba Cloud RPC endpoint on 127.0.0.1: signature checks, dispatch on (Version, Action),
    ClientToken replays, and the faults tests inject. Subclasses fill `actions` and `products`.

    One RLock guards all state: actions run under it (they only touch memory; slow work goes to
    `_spawn`ed workers), except those in `unlocked`, which take it themselves.
    """

    products: dict[str, tuple[str, str]] = {}   # Version -> (product code, HostId) for error bodies
    idempotent: frozenset[str] = frozenset()     # actions whose ClientToken replays the first answer
    unlocked: frozenset[str] = frozenset()
    regionless: frozenset[str] = frozenset()     # actions that accept any RegionId

    def __init__(self, access_keys: Mapping[str, str], region: str) -> None:
        self.access_keys = dict(access_keys)
        self.region = region
        self.actions: dict[str, dict[str, Action]] = {}
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.temporary_keys: TemporaryKeys | None = None   # STS keys, set by a service that issues them
        self._lock = threading.RLock()
        self._nonces = NonceStore()
        self._idempotency: dict[tuple[str, str], tuple[dict[str, str], dict[str, Any]]] = {}
        self._faults: dict[str, list[Fault]] = {}
        self._holds: dict[str, threading.Event] = {}
        self._performed: Counter[str] = Counter()
        self._closing = threading.Event()
        self._workers: list[threading.Thread] = []
        self._server: RpcServer | None = None

    # --- lifecycle ---

    def start(self) -> Self:
        """Bind a free loopback port and serve in a daemon thread."""
        if self._server is None:
            self._server = RpcServer(self._handle, self._other_path)
            threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                             name=type(self).__name__, daemon=True).start()
        return self

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError(f"{type(self).__name__}.start() first")
        return self._server.server_address[1]

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        """Stop serving and let the workers finish (they stand down early once closing is set)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._closing.set()
        for worker in list(self._workers):
            worker.join(timeout=120)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- fault injection and inspection (tests) ---

    def fail_next(self, action: str, code: str, http_status: int, times: int = 1, after_effect: bool = False) -> None:
        """The next `times` calls of `action` answer this error; with after_effect the call is
        carried out first (the cloud did it, the answer got lost)."""
        with self._lock:
            self._faults.setdefault(action, []).append(Fault(code, http_status, times, after_effect))

    def refuse(self, action: str, code: str | None, http_status: int = 403) -> None:
        """Every call of `action` answers this error from now on (a permanent refusal: a RAM user without the
        permission, an endpoint without the API); code None lifts it (issue 47 item 6)."""
        with self._lock:
            self._faults[action] = [] if code is None else [Fault(code, http_status, 1 << 62, False)]

    def hold(self, action: str, event: threading.Event) -> None:
        """After carrying out `action`, answer only once `event` is set (a client can die meanwhile)."""
        with self._lock:
            self._holds[action] = event

    def performed(self, action: str) -> int:
        """How many calls of `action` were carried out (ClientToken replays and refusals excluded)."""
        with self._lock:
            return self._performed[action]

    # --- request path ---

    def _not_found(self) -> Reply:
        return self._error_reply(ApiError(404, "InvalidAction.NotFound"), new_request_id(), "XML", "")

    def _other_path(self, method: str, path: str, query: str, headers: dict[str, str]) -> Reply:
        """A request to a path other than / (ROA style): none here; aliyun_roa.RoaGateway serves some."""
        return self._not_found()

    def _error_reply(self, error: ApiError, request_id: str, fmt: str, version: str) -> Reply:
        product, host = self.products.get(version) or next(iter(self.products.values()), ("", ""))
        body, content_type = render(error_payload(error, request_id, host, product), fmt, "Error")
        return Reply(error.http_status, body, content_type, request_id)

    def _handle(self, method: str, params: dict[str, str], agent: str = "") -> Reply:
        request_id = new_request_id()
        action, version = params.get("Action", ""), params.get("Version", "")
        fmt = params.get("Format") or "XML"
        with self._lock:
            self.calls.append((action, recordable(params)))
        try:
            verify(method, params, self.access_keys, self._nonces, self._lock, temporary_keys=self.temporary_keys)
            product = (self.products.get(version) or ("", ""))[0].lower()
            if product:
                record_request(product, params, agent)
                refused = model_problem(product, version, action, params)
                if refused is not None:
                    raise ApiError(refused.status, refused.code, refused.message)
            handler = self._lookup(version, action)
            region = params.get("RegionId", "")
            if region and region != self.region and action not in self.regionless:
                raise ApiError(404, "InvalidRegionId.NotFound", f"The specified RegionId {region} does not exist.")
            payload = self._perform(action, handler, params)
        except ApiError as error:
            return self._error_reply(error, request_id, fmt, version)
        body, content_type = render({"RequestId": request_id, **payload}, fmt, f"{action}Response")
        return Reply(200, body, content_type, request_id)

    def _lookup(self, version: str, action: str) -> Action:
        actions = self.actions.get(version)
        if actions is None:
            raise ApiError(400, "InvalidVersion", "Specified parameter Version is not valid.")
        if action not in actions:
            raise ApiError(404, "InvalidAction.NotFound")
        return actions[action]

    def _take_fault(self, action: str) -> Fault | None:
        with self._lock:
            queue = self._faults.get(action) or []
            if not queue:
                return None
            fault = queue[0]
            fault.remaining -= 1
            if fault.remaining <= 0:
                queue.pop(0)
            return fault

    def _perform(self, action: str, handler: Action, params: dict[str, str]) -> dict[str, Any]:
        fault = self._take_fault(action)
        if fault is not None and not fault.after_effect:
            raise ApiError(fault.http_status, fault.code)
        try:
            payload = self._run_handler(action, handler, params)
        except ApiError:
            if fault is not None:
                raise ApiError(fault.http_status, fault.code) from None
            raise
        self._wait_hold(action)
        if fault is not None:
            raise ApiError(fault.http_status, fault.code)
        return payload

    def _run_handler(self, action: str, handler: Action, params: dict[str, str]) -> dict[str, Any]:
        if action in self.unlocked:
            payload = handler(params)
            with self._lock:
                self._performed[action] += 1
            return payload
        token = params.get("ClientToken", "") if action in self.idempotent else ""
        if len(token) > 64 or not token.isascii():
            raise invalid("ClientToken", "At most 64 ASCII characters.")
        fingerprint = {k: v for k, v in params.items() if k not in VOLATILE_PARAMS}
        with self._lock:
            if token and (action, token) in self._idempotency:
                first, payload = self._idempotency[(action, token)]
                if first != fingerprint:
                    raise ApiError(400, "IdempotentParameterMismatch")
                return payload
            payload = handler(params)
            if token:
                self._idempotency[(action, token)] = (fingerprint, payload)
            self._performed[action] += 1
            return payload

    def _wait_hold(self, action: str) -> None:
        with self._lock:
            event = self._holds.get(action)
        while event is not None and not event.wait(0.05) and not self._closing.is_set():
            pass

    # --- workers ---

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        """Slow work runs off the request thread so the API answers at once, as the cloud does."""
        worker = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._workers = [w for w in self._workers if w.is_alive()] + [worker]
        worker.start()

    def _sleep_until(self, deadline: float) -> bool:
        """Wait for a transition's end; False when the service is closing."""
        return not self._closing.wait(max(0.0, deadline - time.monotonic()))
