"""The wire under the AWS test double: a threaded HTTP proxy in front of moto, the two protocols boto3
speaks to EC2 / ECR / SSM, AWS's error shapes, and XML edits that touch only what they must.

Why a proxy and not a patched moto: boto3 must talk HTTP to a real server, exactly as the product
does in production, and moto's own behaviour must reach it unchanged wherever moto is right. So
every request goes to moto byte for byte (headers, SigV4 signature, body) and every answer comes
back byte for byte, except where aws_ec2.Ec2Emulator deliberately answers itself (idempotency
replays, injected faults) or edits an answer (instance states, addresses). An edited XML answer is
re-serialized by ElementTree in EC2's default namespace; an unedited one is never re-serialized.

Protocols (botocore's service models):
- "query": EC2 (protocol `ec2`): form-encoded POST, `Action=...&Version=...`; errors are
  `<Response><Errors><Error><Code/><Message/></Error></Errors><RequestID/></Response>`.
- "json": ECR, SSM (awsJson1.1): POST with `X-Amz-Target: Prefix.Action`; errors are
  `{"__type": Code, "message": ...}` plus the `x-amzn-ErrorType` header.

Credentials: long-term keys (`access_keys`) and the session credentials the instance metadata
service hands out (SessionCredential: an ASIA key id, its secret, a session token that must come
back in `X-Amz-Security-Token`, an expiry), checked as AWS checks them (check_signature).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import json
import re
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qsl, urlencode, urlsplit

EC2_VERSION = "2016-11-15"
EC2_NS = "http://ec2.amazonaws.com/doc/2016-11-15"
IAM_VERSION = "2010-05-08"
UPSTREAM_TIMEOUT_S = 120
# Headers that describe one hop, not the message: never copied from one connection to the next.
HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
                        "upgrade", "content-length", "host"})
_CREDENTIAL = re.compile(r"Credential=[^/,\s]+/\d{8}/([a-z0-9-]+)/([a-z0-9-]+)/aws4_request")
_AUTHORIZATION = re.compile(r"AWS4-HMAC-SHA256 Credential=([^/,\s]+)/(\d{8})/([a-z0-9-]+)/([a-z0-9-]+)/aws4_request,"
                            r"\s*SignedHeaders=([a-z0-9;-]+),\s*Signature=([0-9a-f]{64})$")
SIGV4_SKEW_S = 15 * 60


class AwsError(Exception):
    """One error answer as AWS gives it: HTTP status, error code, message."""

    def __init__(self, http_status: int, code: str, message: str) -> None:
        super().__init__(f"{http_status} {code}: {message}")
        self.http_status = http_status
        self.code = code
        self.message = message


# --- messages ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WireRequest:
    """One request as boto3 sent it, plus what the harness reads from it (never sent upstream)."""

    method: str
    path: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    protocol: str                 # "query" (EC2), "json" (ECR, SSM) or "other"
    action: str                   # "RunInstances", "GetAuthorizationToken", ... ("" when unknown)
    params: dict[str, str]        # query protocol: the form fields (and URL query)
    document: Any                 # json protocol: the decoded body
    region: str                   # from the SigV4 credential scope (the client's region)
    service: str                  # from the SigV4 credential scope ("ec2", "ecr", "ssm")

    def header(self, name: str, default: str = "") -> str:
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), default)


@dataclass(frozen=True)
class WireResponse:
    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    def header(self, name: str, default: str = "") -> str:
        wanted = name.lower()
        return next((value for key, value in self.headers if key.lower() == wanted), default)

    def with_body(self, body: bytes) -> WireResponse:
        """The same answer with another body (Content-Length is always recomputed when sent)."""
        return replace(self, body=body)


def parse_request(method: str, target: str, headers: tuple[tuple[str, str], ...], body: bytes,
                  default_region: str) -> WireRequest:
    """Classify a request by protocol and read its action and parameters (the bytes stay as they are)."""
    url = urlsplit(target)
    lookup = {key.lower(): value for key, value in headers}
    scope = _CREDENTIAL.search(lookup.get("authorization", ""))
    region, service = (scope.group(1), scope.group(2)) if scope else (default_region, "")
    amz_target = lookup.get("x-amz-target", "")
    if amz_target:
        try:
            document = json.loads(body or b"{}")
        except ValueError:
            document = None
        return WireRequest(method, target, headers, body, "json", amz_target.rpartition(".")[2], {}, document,
                           region, service)
    params = dict(parse_qsl(url.query, keep_blank_values=True))
    if body and "application/x-www-form-urlencoded" in lookup.get("content-type", "").lower():
        params.update(parse_qsl(body.decode("utf-8", "replace"), keep_blank_values=True))
    protocol = "query" if params.get("Action") else "other"
    return WireRequest(method, target, headers, body, protocol, params.get("Action", ""), params, None,
                       region, service)


def new_request_id() -> str:
    return str(uuid.uuid4())


# Query services whose errors are <ErrorResponse xmlns=...><Error><Type/><Code/><Message/></Error><RequestId/>
ERROR_RESPONSE_NAMESPACES = {"elasticloadbalancing": "http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/",
                             "autoscaling": "http://autoscaling.amazonaws.com/doc/2011-01-01/"}


def error_response(request: WireRequest, error: AwsError) -> WireResponse:
    """The error in the shape the request's protocol expects (botocore parses each its own way)."""
    request_id = new_request_id()
    if request.protocol == "json":
        body = json.dumps({"__type": error.code, "message": error.message}).encode()
        headers = (("Content-Type", "application/x-amz-json-1.1"), ("x-amzn-RequestId", request_id),
                   ("x-amzn-ErrorType", error.code))
        return WireResponse(error.http_status, headers, body)
    if request.service in ERROR_RESPONSE_NAMESPACES:
        root = ET.Element("ErrorResponse", xmlns=ERROR_RESPONSE_NAMESPACES[request.service])
        fields = ET.SubElement(root, "Error")
        for name, text in (("Type", "Sender" if error.http_status < 500 else "Receiver"), ("Code", error.code),
                           ("Message", error.message)):
            ET.SubElement(fields, name).text = text
        ET.SubElement(root, "RequestId").text = request_id
        return WireResponse(error.http_status, (("Content-Type", "text/xml"),), ET.tostring(root))
    root = ET.Element("Response")
    errors = ET.SubElement(ET.SubElement(root, "Errors"), "Error")
    ET.SubElement(errors, "Code").text = error.code
    ET.SubElement(errors, "Message").text = error.message
    ET.SubElement(root, "RequestID").text = request_id
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode")).encode()
    return WireResponse(error.http_status, (("Content-Type", "text/xml;charset=UTF-8"),), body)


# --- SigV4 (only where the test asks for it: moto itself accepts any credentials) -------------------

# What each service answers for a credential problem: (HTTP status, code, message) per problem.
_EC2_AUTH = {"missing": (401, "AuthFailure", "AWS was not able to validate the provided access credentials"),
             "unknown": (401, "AuthFailure", "AWS was not able to validate the provided access credentials"),
             "signature": (401, "AuthFailure", "AWS was not able to validate the provided access credentials"),
             "expired": (400, "RequestExpired", "Request has expired."),
             "token-expired": (400, "RequestExpired", "Request has expired.")}
_JSON_AUTH = {"missing": (400, "MissingAuthenticationTokenException", "Missing Authentication Token"),
              "unknown": (400, "UnrecognizedClientException", "The security token included in the request is invalid."),
              "signature": (400, "InvalidSignatureException",
                            "The request signature we calculated does not match the signature you provided. Check "
                            "your AWS Secret Access Key and signing method. Consult the service documentation for "
                            "details."),
              "expired": (400, "InvalidSignatureException", "Signature expired."),
              "token-expired": (400, "ExpiredTokenException", "The security token included in the request is expired")}
_QUERY_AUTH = {"missing": (403, "MissingAuthenticationToken", "Request is missing Authentication Token"),
               "unknown": (403, "InvalidClientTokenId", "The security token included in the request is invalid."),
               "signature": (403, "SignatureDoesNotMatch",
                             "The request signature we calculated does not match the signature you provided. Check "
                             "your AWS Secret Access Key and signing method. Consult the service documentation for "
                             "details."),
               "expired": (403, "SignatureDoesNotMatch", "Signature expired."),
               "token-expired": (403, "ExpiredToken", "The security token included in the request is expired")}


def _auth_error(request: WireRequest, problem: str) -> AwsError:
    """EC2 says AuthFailure; the JSON services (ECR, SSM) and the other query ones (STS) their own codes."""
    if request.protocol == "json":
        return AwsError(*_JSON_AUTH[problem])
    return AwsError(*(_EC2_AUTH if request.service in ("ec2", "") else _QUERY_AUTH)[problem])


def canonical_request(request: WireRequest, signed_headers: list[str]) -> str:
    """SigV4's canonical request, rebuilt from what arrived (the headers the client says it signed)."""
    url = urlsplit(request.path)
    pairs = sorted(pair.partition("=")[::2] for pair in url.query.split("&") if pair)
    query = "&".join(f"{key}={value}" for key, value in pairs)
    lines = []
    for name in signed_headers:
        values = [" ".join(v.split()) for k, v in request.headers if k.lower() == name]
        lines.append(f"{name}:{','.join(values)}")
    payload = request.header("X-Amz-Content-SHA256") or hashlib.sha256(request.body).hexdigest()
    return "\n".join([request.method.upper(), url.path or "/", query, "\n".join(lines) + "\n",
                      ";".join(signed_headers), payload])


def _signing_key(secret: str, day: str, region: str, service: str) -> bytes:
    key = ("AWS4" + secret).encode()
    for part in (day, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


@dataclass(frozen=True)
class SessionCredential:
    """Temporary credentials as STS issues them (here: the metadata service, for an instance's role).

    A request signed with `access_key_id` is valid only with `X-Amz-Security-Token: token` and before
    `expires` (epoch seconds); role and instance_id say whose they are (the caller of a request).
    """

    access_key_id: str
    secret: str = field(repr=False)
    token: str = field(repr=False)
    expires: float
    role: str = ""
    instance_id: str = ""
    issued: float = 0.0


def access_key_of(request: WireRequest) -> str:
    """The access key id a request is signed with ("" when it carries no SigV4 Authorization)."""
    match = _AUTHORIZATION.match(request.header("Authorization"))
    return match.group(1) if match is not None else ""


def _secret_for(request: WireRequest, key_id: str, access_keys: Mapping[str, str],
                sessions: Mapping[str, SessionCredential], now: float) -> str:
    """The secret to verify with; a session key counts only with its own, unexpired token (AWS treats
    an ASIA key without its token as an unknown key)."""
    session = sessions.get(key_id)
    if session is None:
        secret = access_keys.get(key_id)
        if secret is None:
            raise _auth_error(request, "unknown")
        return secret
    if not hmac.compare_digest(request.header("X-Amz-Security-Token").encode(), session.token.encode()):
        raise _auth_error(request, "unknown")
    if session.expires <= now:
        raise _auth_error(request, "token-expired")
    return session.secret


def check_signature(request: WireRequest, access_keys: Mapping[str, str], now: float | None = None,
                    sessions: Mapping[str, SessionCredential] | None = None) -> None:
    """Raise the error the service answers when the request is not signed (SigV4) by a key in access_keys
    or by session credentials in `sessions` (which also need their token, unexpired).

    Messages name no secret: a test can print them.
    """
    match = _AUTHORIZATION.match(request.header("Authorization"))
    if match is None:
        raise _auth_error(request, "missing")
    key_id, day, region, service, signed, signature = match.groups()
    clock = time.time() if now is None else now
    secret = _secret_for(request, key_id, access_keys, sessions or {}, clock)
    amz_date = request.header("X-Amz-Date")
    try:
        sent = datetime.strptime(amz_date, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        raise _auth_error(request, "signature") from None
    if abs(clock - sent) > SIGV4_SKEW_S:
        raise _auth_error(request, "expired")
    canonical = canonical_request(request, signed.split(";"))
    string_to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, f"{day}/{region}/{service}/aws4_request",
                                hashlib.sha256(canonical.encode()).hexdigest()])
    expected = hmac.new(_signing_key(secret, day, region, service), string_to_sign.encode(),
                        hashlib.sha256).hexdigest()
    if not amz_date.startswith(day) or not hmac.compare_digest(expected, signature):
        raise _auth_error(request, "signature")


# --- XML -----------------------------------------------------------------------------------------

def local(tag: str) -> str:
    """`{namespace}name` -> `name`."""
    return tag.rpartition("}")[2]


def parse_xml(body: bytes) -> ET.Element | None:
    """The answer's root element, or None when it is not XML (moto's own answers are trusted input)."""
    try:
        return ET.fromstring(body)
    except ET.ParseError:
        return None


def xml_bytes(root: ET.Element) -> bytes:
    """Serialize an edited answer, keeping its default namespace (botocore matches on local names)."""
    namespace = root.tag[1:].partition("}")[0] if root.tag.startswith("{") else ""
    text = ET.tostring(root, encoding="unicode", default_namespace=namespace or None)
    return ('<?xml version="1.0" encoding="UTF-8"?>\n' + text).encode()


def child(element: ET.Element | None, name: str) -> ET.Element | None:
    """The first child named `name` (None when there is none, or no element to look in)."""
    return next((c for c in element if local(c.tag) == name), None) if element is not None else None


def child_text(element: ET.Element | None, name: str) -> str:
    found = child(element, name)
    return (found.text or "") if found is not None else ""


def members(element: ET.Element | None, name: str) -> list[ET.Element]:
    """The <member> children of element's <name> (the query protocol's list encoding: ELB, Auto Scaling)."""
    found = child(element, name)
    return [c for c in found if local(c.tag) == "member"] if found is not None else []


def path(element: ET.Element, *names: str) -> ET.Element | None:
    """child(child(element, a), b) ... or None where a step is missing."""
    current: ET.Element | None = element
    for name in names:
        if current is None:
            return None
        current = child(current, name)
    return current


def items(element: ET.Element | None, set_name: str) -> list[ET.Element]:
    """The <item> children of element's <set_name> (EC2's list encoding)."""
    found = child(element, set_name) if element is not None else None
    return [c for c in found if local(c.tag) == "item"] if found is not None else []


def walk_with_parents(element: ET.Element) -> Iterator[tuple[ET.Element, ET.Element]]:
    """(parent, child) for every element below `element`, depth first."""
    for sub in list(element):
        yield element, sub
        yield from walk_with_parents(sub)


# --- upstream (moto) -----------------------------------------------------------------------------

class Upstream:
    """moto's server on loopback; one short-lived connection per request (loopback makes them cheap)."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def send(self, method: str, target: str, headers: tuple[tuple[str, str], ...], body: bytes) -> WireResponse:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=UPSTREAM_TIMEOUT_S)
        try:
            conn.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            conn.putheader("Host", f"{self.host}:{self.port}")
            for key, value in headers:
                if key.lower() not in HOP_BY_HOP:
                    conn.putheader(key, value)
            conn.putheader("Content-Length", str(len(body)))
            conn.putheader("Connection", "close")
            conn.endheaders(body)
            answer = conn.getresponse()
            data = answer.read()
            kept = tuple((k, v) for k, v in answer.getheaders() if k.lower() not in HOP_BY_HOP)
            return WireResponse(answer.status, kept, data)
        finally:
            conn.close()

    def forward(self, request: WireRequest) -> WireResponse:
        return self.send(request.method, request.path, request.headers, request.body)

    def query(self, service: str, region: str, action: str, version: str, params: Mapping[str, str]) -> WireResponse:
        """The harness's own query-protocol call (not a client's): a form POST whose credential scope names
        the region and the service.

        moto does not check signatures; it reads the region (and the service) from the scope.
        """
        body = urlencode({"Action": action, "Version": version, **params}).encode()
        headers = (("Content-Type", "application/x-www-form-urlencoded; charset=utf-8"),
                   ("Authorization", f"AWS4-HMAC-SHA256 Credential=harness/20260101/{region}/{service}/aws4_request, "
                                     "SignedHeaders=host, Signature=0"))
        return self.send("POST", "/", headers, body)

    def ec2(self, region: str, action: str, params: Mapping[str, str]) -> WireResponse:
        return self.query("ec2", region, action, EC2_VERSION, params)

    def iam(self, action: str, params: Mapping[str, str]) -> WireResponse:
        """IAM is global: moto keeps one IAM per account, whatever the region."""
        return self.query("iam", "us-east-1", action, IAM_VERSION, params)

    def reset(self) -> None:
        """moto's state is per process: start every emulator from an empty cloud."""
        answer = self.send("POST", "/moto-api/reset", (), b"")
        if not answer.ok:
            raise RuntimeError(f"moto reset answered {answer.status}")


# --- the proxy -----------------------------------------------------------------------------------

Handler = Callable[[WireRequest], WireResponse]


class _ProxyHandler(BaseHTTPRequestHandler):
    server: ProxyServer
    protocol_version = "HTTP/1.1"   # keep-alive, as botocore's connection pool expects

    def _read_body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while (size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)) > 0:
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                pass
            return b"".join(chunks)
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _serve(self) -> None:
        body = self._read_body()
        headers = tuple(self.headers.items())
        request = parse_request(self.command, self.path, headers, body, self.server.default_region)
        try:
            answer = self.server.handler(request)
        except Exception as exc:  # a harness bug: a 500 for the client, the cause kept for the test
            self.server.record_error(request, exc)
            answer = error_response(request, AwsError(500, "InternalError", "An internal error has occurred."))
        try:
            self.send_response(answer.status)
            for key, value in answer.headers:
                if key.lower() not in HOP_BY_HOP:
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(answer.body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(answer.body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client died waiting: the cloud did the work, nobody hears

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = do_PATCH = _serve

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: tests read their own assertions, not request logs."""


class ProxyServer(ThreadingHTTPServer):
    """A threaded HTTP server on 127.0.0.1 that hands each parsed request to one handler."""

    daemon_threads = True

    def __init__(self, handler: Handler, default_region: str) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.handler = handler
        self.default_region = default_region
        self.errors: list[str] = []
        self._errors_lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def record_error(self, request: WireRequest, exc: Exception) -> None:
        with self._errors_lock:
            self.errors.append(f"{request.action or request.path}: {type(exc).__name__}: {exc}"[:500])

    def start(self) -> Self:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="aws-proxy", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread is not None:
            with contextlib.suppress(RuntimeError):
                self._thread.join(5)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"
