"""Who may call which route: the one place every transport asks before it runs one.

Why one place: the server has four front doors onto the same models: the hand-written HTTP/1.1
transport (transport.py), uvicorn (asgi.py, `--transport uvicorn`), the gRPC service
(grpc_service.py, `--grpc-port`) and the metrics port (metrics.py, `--metrics-port`). A rule
written into each of them would be written four times and drift; here each door names the call
(its API category, its peer, its headers or gRPC metadata) and Policy.check says yes, or raises
the ProtocolError that door answers with (HTTP status, or the gRPC code for it).

The categories are Triton's (`--http-restricted-api` / `--grpc-restricted-protocol`): health,
metadata, inference, shared memory, statistics (with Prometheus metrics), model repository. An
HTTP request's category comes from the route table here (resolve: which route a method and path
are, or the 404 / 405 they get), the same table the transports dispatch by, and a gRPC call's
from GRPC_CATEGORIES, so a route cannot be served one way and classified another.

The rules (AccessConfig holds a server's settings; serve.py's flags and their environment defaults):
- bearer keys (--auth-key-sha256, --auth-keys-file; keys.py holds the hashes, the header parser and
  the file's reload): with keys configured, every call but HEALTH needs `Authorization: Bearer
  <key>` (gRPC metadata `authorization`), else 401 with `WWW-Authenticate: Bearer
  realm="ngcx-runtime"` (gRPC UNAUTHENTICATED) and a line that names no key or hash. HEALTH
  (/v2/health/live, /ready, /v2/models/NAME[/versions/V]/ready, gRPC ServerLive, ServerReady,
  ModelReady) stays keyless for load balancers and docker health checks; a model's readiness
  therefore also tells a keyless peer whether a model of that name exists, as on Triton. No key
  configured at all: open, as a standalone development server (serve says so at start unless it
  is bound to loopback). An empty keys file accepts no key: locked, never open.
- unknown paths: with keys configured, a request no route answers (404) or answers with another
  method (405) gets the 401 first (route_call), so a peer without a key learns nothing about
  which routes exist; only a path that resolves to HEALTH is answered without one.
- model control (repository load / unload; the index is MODEL_REPOSITORY like any other call):
  off by default (--model-control-mode none, Triton's default: 403, gRPC PERMISSION_DENIED, with
  how to turn it on; --load-model at start still loads). `explicit` needs an admin key
  (--admin-key-sha256, --admin-keys-file): none or a wrong one is 401, a normal key 403. An admin
  key is accepted wherever a normal key is. A server that is one of several processes sharing a
  port (serve --mps / --processes) still refuses control with 400: a load would reach only the
  process a client happens to hit.
- shared memory (registration, status, and any inference tensor that names a region): the key as
  any other call, then `local` (the default) only for loopback peers (403 otherwise), since a
  region is any object in /dev/shm the server can open; `any` for every peer; `off` refused for
  all (400). shm.py says why.
TLS (--tls-cert, --tls-key) is in AccessConfig as the same settings travel together, but is the
transports' (tls.py): a key sent over plain HTTP on a network is a key given away.

Where the doors ask: once per request, after the request line and headers and BEFORE any body is
read or parsed (HTTP: route_call; gRPC: before the RPC's handler, a load's parameters included;
the metrics port: before it renders or answers 404), so a peer without a key cannot make the
server read, decompress or parse anything. A malformed body sent where the call is refused gets
the refusal, not a 400 about the body. Cost: with no keys, a few attribute reads per request;
with keys, one header lookup, a regular expression, one SHA-256 and a compare_digest per
accepted hash (microseconds; `python -m bench security` measures it).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from urllib.parse import unquote

from .errors import RuntimeUserError
from .keys import KeyFile, KeySet, bearer_token, digest, parse_hash
from .protocol import ProtocolError
from .protocol import peer_text as _peer

SHARED_MEMORY_POLICIES = ("local", "any", "off")
MODEL_CONTROL_MODES = ("none", "explicit")
REALM = "ngcx-runtime"


class Category(str, Enum):  # noqa: UP042 - StrEnum is 3.11; images run the runtime on 3.9+
    """Triton's API categories (the names its --http-restricted-api takes)."""

    HEALTH = "health"
    METADATA = "metadata"
    INFERENCE = "inference"
    SHARED_MEMORY = "shared-memory"
    STATISTICS = "statistics"
    MODEL_REPOSITORY = "model-repository"


# Every RPC of GRPCInferenceService that grpc_service.Service serves; the others answer UNIMPLEMENTED.
GRPC_CATEGORIES: dict[str, Category] = {
    "ServerLive": Category.HEALTH, "ServerReady": Category.HEALTH, "ModelReady": Category.HEALTH,
    "ServerMetadata": Category.METADATA, "ModelMetadata": Category.METADATA, "ModelConfig": Category.METADATA,
    "ModelStatistics": Category.STATISTICS,
    "ModelInfer": Category.INFERENCE,
    "RepositoryIndex": Category.MODEL_REPOSITORY, "RepositoryModelLoad": Category.MODEL_REPOSITORY,
    "RepositoryModelUnload": Category.MODEL_REPOSITORY,
    "SystemSharedMemoryStatus": Category.SHARED_MEMORY, "SystemSharedMemoryRegister": Category.SHARED_MEMORY,
    "SystemSharedMemoryUnregister": Category.SHARED_MEMORY, "CudaSharedMemoryStatus": Category.SHARED_MEMORY,
    "CudaSharedMemoryRegister": Category.SHARED_MEMORY, "CudaSharedMemoryUnregister": Category.SHARED_MEMORY,
}
GRPC_CONTROL = frozenset({"RepositoryModelLoad", "RepositoryModelUnload"})


@dataclass(frozen=True)
class Call:
    """One request as the policy sees it. category None: no route (the router answers 404 / 405).

    headers: the HTTP request's headers or the gRPC call's metadata; look names up with header().
    """

    category: Category | None
    peer: str
    headers: Mapping[str, str] = field(default_factory=dict)
    control: bool = False              # a model repository load or unload

    def header(self, name: str) -> str | None:
        """A header's value by its name in any case (HTTP headers, gRPC metadata keys are lower case);
        a header sent more than once is its values joined with ", " (RFC 9110 §5.3)."""
        get_all = getattr(self.headers, "get_all", None)       # http.client's message: every value
        if get_all is not None:
            values = get_all(name)
            return None if not values else values[0] if len(values) == 1 else ", ".join(map(str, values))
        return self.headers.get(name.lower())


# -- the HTTP route table: which route a request is, in which category --

@dataclass(frozen=True)
class Route:
    """A resolved request: which route answers it, with what of its path, in which access category.

    reads: the body the route takes: "none" (a transport discards it), "json" (a small JSON
    object: parse_small_json), "tensors" (inference: read by the transport, decode_request).
    """

    kind: str                # metrics, server, health, stats, model, infer, repository, shm
    path: str                # the request path without its trailing '/', for error lines
    args: tuple = ()
    category: Category | None = None
    control: bool = False
    reads: str = "none"


_MODEL_TAILS = {(): Category.METADATA, ("config",): Category.METADATA, ("stats",): Category.STATISTICS,
                ("ready",): Category.HEALTH}


def resolve(method: str, path: str) -> Route:
    """The route of a request path (percent-decoded per segment), or the ProtocolError (404 / 405) it gets.
    Checked in this order, as a client sees it: the path's shape, then the method."""
    path = path.rstrip("/")
    if path == "/metrics":
        if method not in ("GET", "HEAD"):
            raise ProtocolError(f"method {method} is not allowed on /metrics; use GET", 405)
        return Route("metrics", path, (), Category.STATISTICS)
    parts = [unquote(p) for p in path.split("/")[1:]]
    if not parts or parts[0] != "v2":
        raise ProtocolError(f"unknown path {_peer(path or '/')}; this server speaks KServe v2 under /v2", 404)
    rest = parts[1:]
    if method == "POST" and rest and rest[0] == "models" and rest[-1] == "infer":
        return Route("infer", path, _model_path(rest[1:-1]), Category.INFERENCE, reads="tensors")
    if rest and rest[0] == "repository":
        sub = rest[1:]
        if not (sub == ["index"] or (len(sub) == 3 and sub[0] == "models" and sub[2] in ("load", "unload"))):
            raise ProtocolError(f"unknown path {_peer(path)}", 404)
        if method != "POST":
            raise ProtocolError(f"method {method} is not allowed on {_peer(path)}; use POST", 405)
        return Route("repository", path, tuple(sub), Category.MODEL_REPOSITORY, control=sub != ["index"],
                     reads="json")
    if rest and rest[0] in ("systemsharedmemory", "cudasharedmemory"):
        return _shm_route(method, path, rest[0], rest[1:])
    if method not in ("GET", "HEAD"):
        raise ProtocolError(f"method {method} is not allowed on {_peer(path)}", 405)
    if rest == []:
        return Route("server", path, (), Category.METADATA)
    if rest in (["health", "live"], ["health", "ready"]):
        return Route("health", path, (rest[1],), Category.HEALTH)
    if rest == ["models", "stats"]:
        return Route("stats", path, (), Category.STATISTICS)
    if rest and rest[0] == "models":
        name, version, tail = _model_path(rest[1:])
        return Route("model", path, (name, version, tail), _MODEL_TAILS.get(tuple(tail)))
    raise ProtocolError(f"unknown path {_peer(path)}", 404)


def _model_path(rest: list[str]) -> tuple[str, str | None, list[str]]:
    """[NAME, (versions, V)?, ...tail] -> (name, version or None, tail)."""
    if not rest:
        raise ProtocolError("no model name in the path; use /v2/models/NAME/...", 404)
    tail = rest[1:]
    if len(tail) >= 2 and tail[0] == "versions":
        return rest[0], tail[1], tail[2:]
    return rest[0], None, tail


def _shm_route(method: str, path: str, kind: str, rest: list[str]) -> Route:
    """GET /v2/{system,cuda}sharedmemory[/region/NAME]/status, POST .../region/NAME/register, POST
    /v2/{system,cuda}sharedmemory[/region/NAME]/unregister (Triton's extensions; shm.py, cuda_shm.py)."""
    region = rest[1] if len(rest) == 3 and rest[0] == "region" else None
    action = rest[-1] if rest else ""
    if not (rest in (["status"], ["unregister"]) or (region is not None and action in
                                                      ("status", "register", "unregister"))):
        raise ProtocolError(f"unknown path {_peer(path)}", 404)
    want = "GET" if action == "status" else "POST"
    if method != want and not (want == "GET" and method == "HEAD"):
        raise ProtocolError(f"method {method} is not allowed on {_peer(path)}; use {want}", 405)
    return Route("shm", path, (kind, region, action), Category.SHARED_MEMORY,
                 reads="json" if want == "POST" else "none")


def http_category(method: str, path: str) -> Category | None:
    """The category of an HTTP request (None where no route answers it: 404 / 405)."""
    try:
        return resolve(method, path).category
    except ProtocolError:
        return None


def grpc_category(method: str) -> Category | None:
    """The category of a GRPCInferenceService RPC by its name (None for one not served)."""
    return GRPC_CATEGORIES.get(method)


def check_shared_memory(policy: str, peer: str) -> None:
    """--shared-memory's rule: `off` refuses everyone (400), `local` a peer not on loopback (403)."""
    if policy == "off":
        raise ProtocolError("system shared memory is disabled on this server (--shared-memory off); send "
                            "tensors in the request body")
    if policy == "any":
        return
    try:
        loopback = ipaddress.ip_address(peer.split("%")[0]).is_loopback
    except ValueError:
        loopback = peer in ("", "localhost")          # a unix socket peer has no address
    if not loopback:
        shown = repr(peer)
        shown = shown if len(shown) <= 60 else shown[:60] + "..."
        raise ProtocolError(f"system shared memory is only for clients on this host (peer {shown}); "
                            "start the server with --shared-memory any to allow other peers", 403)


@dataclass(frozen=True)
class AccessConfig:
    """A server's access settings (serve's flags; start_server / start_loading / start_repository take one).

    auth_key_sha256 / admin_key_sha256: hex SHA-256 hashes of the accepted keys; auth_keys_file /
    admin_keys_file: files of such lines, re-read when they change (keys.py). model_control: "none"
    (load / unload refused) or "explicit" (they need an admin key). tls_cert / tls_key: PEM files,
    both or neither (tls.py). The default is an open server without TLS and without model control.
    """

    auth_key_sha256: tuple[str, ...] = ()
    auth_keys_file: str | Path | None = None
    admin_key_sha256: tuple[str, ...] = ()
    admin_keys_file: str | Path | None = None
    model_control: str = "none"
    tls_cert: str | Path | None = None
    tls_key: str | Path | None = None

    def validate(self) -> None:
        """What needs no file: the mode, the hashes' form, an admin key for explicit, TLS's two halves."""
        if self.model_control not in MODEL_CONTROL_MODES:
            raise RuntimeUserError(f"--model-control-mode {self.model_control!r}: choose one of "
                                   f"{', '.join(MODEL_CONTROL_MODES)}")
        for flag, hashes in (("--auth-key-sha256", self.auth_key_sha256), ("--admin-key-sha256",
                                                                          self.admin_key_sha256)):
            if isinstance(hashes, str):
                raise RuntimeUserError(f"{flag}: give a list of hashes, not one string")
            for h in hashes:
                parse_hash(h, flag)
        if self.model_control == "explicit" and not self.admin_key_sha256 and self.admin_keys_file is None:
            raise RuntimeUserError("--model-control-mode explicit needs an admin key: give --admin-key-sha256 HEX "
                                   "or --admin-keys-file PATH (the SHA-256 of a key only the operator holds)")
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = ("--tls-cert", "--tls-key") if self.tls_key is None else ("--tls-key", "--tls-cert")
            raise RuntimeUserError(f"{given} needs {missing} too: give the PEM certificate and its private key, "
                                   "or neither")

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


class Unauthorized(ProtocolError):
    """401 with the Bearer challenge (gRPC: UNAUTHENTICATED); the line names no key and no hash."""

    def __init__(self, message: str, presented: bool):
        challenge = f'Bearer realm="{REALM}"' + (', error="invalid_token"' if presented else "")
        super().__init__(message, 401, (("WWW-Authenticate", challenge),))


NEEDS_KEY = "this endpoint needs a bearer key: send Authorization: Bearer <key>"
MALFORMED_KEY = ("the Authorization header is not 'Bearer <key>' (a key is up to 512 letters, digits and -._~+/, "
                 "then '=' padding): send Authorization: Bearer <key>")
WRONG_KEY = "the bearer key is not accepted by this server: check the key, or ask the deployer for a current one"
CONTROL_OFF = ("loading and unloading models is off on this server (--model-control-mode none, the default): "
               "name the models with --load-model at start, or restart it with --model-control-mode explicit "
               "and an --admin-key-sha256 / --admin-keys-file")
NEEDS_ADMIN = "loading and unloading models needs the admin key: send Authorization: Bearer <admin key>"
NOT_ADMIN = "loading and unloading models needs the admin key; this key is not one"


class Policy:
    """The access rules of one server (its HTTP, uvicorn, gRPC and metrics doors alike)."""

    def __init__(self, shared_memory: str = "local", access: AccessConfig | None = None,
                 log: Callable[[str], None] | None = None):
        """Reads the keys files now: a missing, unreadable or malformed one is a RuntimeUserError."""
        if shared_memory not in SHARED_MEMORY_POLICIES:
            raise ValueError(f"shared memory policy {shared_memory!r}: choose one of "
                             f"{', '.join(SHARED_MEMORY_POLICIES)}")
        access = access or AccessConfig()
        access.validate()
        self.shared_memory = shared_memory
        self.access = access
        self.control_refusal: str | None = None     # why load / unload is refused (serve --mps)
        self.users = _key_set(access.auth_key_sha256, access.auth_keys_file, "--auth-keys-file", log)
        self.admins = _key_set(access.admin_key_sha256, access.admin_keys_file, "--admin-keys-file", log)
        self.explicit = access.model_control == "explicit"
        self._guarded = self.users.configured             # fixed for the server's life (a file may empty, not go)
        self._admins = self.admins.configured

    @property
    def open(self) -> bool:
        """No key guards the ordinary calls (none configured): anyone who reaches the port may call them."""
        return not self._guarded

    def check(self, call: Call) -> None:
        """Allow the call, or raise the ProtocolError its door answers with."""
        if call.category is Category.HEALTH:
            return
        if call.control:
            self._check_control(call)
        elif self._guarded:
            role, presented = self._role(call)
            if role is None:
                raise Unauthorized(WRONG_KEY if presented else self._missing(call), presented)
        if call.category is Category.SHARED_MEMORY:
            check_shared_memory(self.shared_memory, call.peer)

    def _check_control(self, call: Call) -> None:
        if not self.explicit:
            if self._guarded:                              # a peer without a key learns nothing more
                role, presented = self._role(call)
                if role is None:
                    raise Unauthorized(WRONG_KEY if presented else self._missing(call), presented)
            raise ProtocolError(CONTROL_OFF, 403)
        role, presented = self._role(call)
        if role is None:
            raise Unauthorized(WRONG_KEY if presented else NEEDS_ADMIN, presented)
        if role != "admin":
            raise ProtocolError(NOT_ADMIN, 403)
        if self.control_refusal:
            raise ProtocolError(self.control_refusal, 400)

    @staticmethod
    def _missing(call: Call) -> str:
        return NEEDS_KEY if call.header("authorization") is None else MALFORMED_KEY

    def _role(self, call: Call) -> tuple[str | None, bool]:
        """("admin" | "user" | None, whether a well-formed key was presented). Each configured key set
        is compared in full whatever the answer (keys.matches: constant time, no early exit), so the
        time taken depends on how many hashes there are, never on which one, if any, matched."""
        token = bearer_token(call.header("authorization"))
        if token is None:
            return None, False
        presented = digest(token)
        admin = self._admins and self.admins.accepts(presented)
        user = self.users.accepts(presented)
        return ("admin" if admin else "user" if user else None), True


def _key_set(hashes: tuple[str, ...], path: str | Path | None, flag: str,
             log: Callable[[str], None] | None) -> KeySet:
    fixed = [parse_hash(h, flag.replace("s-file", "-sha256")) for h in hashes]
    return KeySet(fixed, KeyFile(path, flag, log) if path is not None else None)


def route_call(policy: Policy, method: str, path: str, peer: str, headers: Mapping[str, str]) -> tuple[Route, Call]:
    """Resolve an HTTP request and ask the policy, before any body is read: the Route and its Call, or the
    ProtocolError to answer. A request no route answers asks as category None first (with keys
    configured: 401 before the 404 / 405, so routes are not probed without a key)."""
    try:
        route = resolve(method, path)
    except ProtocolError:
        policy.check(Call(None, peer, headers))
        raise
    call = Call(route.category, peer, headers, route.control)
    policy.check(call)
    return route, call
