"""The ECS metadata service (100.100.100.200 on ECS): an instance reads its RAM role's STS credentials there,
and a spot instance its reclaim notice (instance/spot/termination-time: the UTC time of its release while it
is being reclaimed, 404 otherwise, as ECS documents it for preemptible instances; the emulator answers it
from aliyun_ess_spot.py's reclaim).

Why apart from aliyun_ram.py: it is its own server on its own port (the machines reach it, not the
SDK), with its own protocol (plain GET, or the security-hardening token mode) and its own caller
identification: the TCP source address, which must be the private IP of exactly one Running instance
(several instances on one IP, as paper backends may make, answer 404 like an unknown caller). It only
asks RAM for the credentials (Ram.instance_credentials) and EcsEmulator who is calling.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

from .aliyun_ram import Ram

METADATA_TTL_RANGE = (1, 21600)


@dataclass(frozen=True)
class Answer:
    status: int
    body: str
    content_type: str = "text/plain"


NOT_FOUND = Answer(404, "Not Found")
CREDENTIALS_PATH = "/latest/meta-data/ram/security-credentials/"
TOKEN_PATH = "/latest/api/token"
TOKEN_HEADER = "X-aliyun-ecs-metadata-token"
TTL_HEADER = "X-aliyun-ecs-metadata-token-ttl-seconds"
TERMINATION_PATH = "/latest/meta-data/instance/spot/termination-time"

# ip -> (instance id, attached role name or "") of the Running instance there, None when none (or several)
Identify = Callable[[str], tuple[str, str] | None]


class MetadataService:
    """What 100.100.100.200 answers, minus the HTTP: both access modes, normal (plain GET) and
    security hardening (PUT /latest/api/token with X-aliyun-ecs-metadata-token-ttl-seconds 1..21600,
    then GETs with X-aliyun-ecs-metadata-token; a request with X-Forwarded-For gets no token, 403; a
    wrong or expired token 401). The caller is the instance whose private IP it connects from."""

    def __init__(self, identify: Identify, ram: Ram, region: str,
                 termination: Callable[[str], str | None] = lambda instance_id: None) -> None:
        """`termination`: instance id -> its spot release time while it is being reclaimed, else None."""
        self.identify, self.ram, self.region, self.termination = identify, ram, region, termination
        self._tokens: dict[str, tuple[str, float]] = {}     # token -> (instance id, monotonic deadline)
        self._lock = threading.Lock()

    def put(self, ip: str, path: str, headers: Mapping[str, str]) -> Answer:
        caller = self.identify(ip)
        if caller is None:
            return NOT_FOUND
        if _path(path) != TOKEN_PATH:
            return Answer(405, "Method Not Allowed")
        if headers.get("X-Forwarded-For") is not None:
            return Answer(403, "Forbidden")
        ttl = _small_int(headers.get(TTL_HEADER, ""))
        low, high = METADATA_TTL_RANGE
        if ttl is None or not low <= ttl <= high:
            return Answer(400, "Missing or Invalid Parameters")
        token = secrets.token_urlsafe(32)
        now = time.monotonic()
        with self._lock:
            self._tokens = {t: held for t, held in self._tokens.items() if held[1] > now}
            self._tokens[token] = (caller[0], now + ttl)
        return Answer(200, token)

    def get(self, ip: str, path: str, headers: Mapping[str, str]) -> Answer:
        caller = self.identify(ip)
        if caller is None:
            return NOT_FOUND
        token = headers.get(TOKEN_HEADER)
        if token is not None and not self._token_valid(token, caller[0]):
            return Answer(401, "Unauthorized")
        return self._item(_path(path), *caller)

    def _token_valid(self, token: str, instance_id: str) -> bool:
        with self._lock:
            held = self._tokens.get(token)
        return held is not None and held[0] == instance_id and held[1] > time.monotonic()

    def _item(self, path: str, instance_id: str, role: str) -> Answer:
        if path == "/latest/meta-data/instance-id":
            return Answer(200, instance_id)
        if path == "/latest/meta-data/region-id":
            return Answer(200, self.region)
        if path == TERMINATION_PATH:
            when = self.termination(instance_id)
            return Answer(200, when) if when else NOT_FOUND
        if path in (CREDENTIALS_PATH, CREDENTIALS_PATH.rstrip("/")):
            return Answer(200, role) if role else NOT_FOUND
        if path.startswith(CREDENTIALS_PATH) and role and path[len(CREDENTIALS_PATH):] == role:
            credential = self.ram.instance_credentials(instance_id, role)
            if credential is not None:
                return Answer(200, json.dumps(credential.metadata(), indent=2), "application/json")
        return NOT_FOUND


def _path(raw: str) -> str:
    """The request target's path, percent-decoded (the query, if any, is not part of the item)."""
    return unquote(raw.partition("?")[0].partition("#")[0], errors="replace")


def _small_int(text: str) -> int | None:
    """A header's non-negative integer; None for anything else (unicode digits and 4300-digit numbers
    included: int() raises on those, and an odd header must be a 4xx, never a dropped connection)."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 9 else None


class _MetadataHandler(BaseHTTPRequestHandler):
    server: MetadataServer
    timeout = 10          # a caller that announces a body and never sends it does not hold a thread forever

    def do_GET(self) -> None:
        self._reply(self.server.service.get(self.client_address[0], self.path, self.headers))

    def do_PUT(self) -> None:
        self._discard_body()
        self._reply(self.server.service.put(self.client_address[0], self.path, self.headers))

    def __getattr__(self, name: str) -> Any:
        """Any other method (do_POST, do_DELETE, do_FOO...) is 405, not the base class's 501."""
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    def _not_allowed(self) -> None:
        self._reply(Answer(405, "Method Not Allowed"), allow="GET, PUT")

    def _discard_body(self) -> None:
        length = _small_int(self.headers.get("Content-Length", "0"))
        if length:
            self.rfile.read(min(length, 1 << 16))

    def _reply(self, answer: Answer, allow: str = "") -> None:
        body = answer.body.encode()
        try:
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(body)))
            if allow:
                self.send_header("Allow", allow)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller went away; nothing to tell it

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: the answers carry credentials."""


class MetadataServer(ThreadingHTTPServer):
    """The metadata service on (host, free port), plain HTTP, served by a daemon thread until close()."""

    daemon_threads = True

    def __init__(self, host: str, service: MetadataService) -> None:
        super().__init__((host, 0), _MetadataHandler)
        self.service = service
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.1}, name="EcsMetadata",
                         daemon=True).start()

    @property
    def address(self) -> str:
        host, port = self.server_address[:2]
        return f"{host}:{port}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()
