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

The rules today (moved here unchanged):
- shared memory (registration, status, and any inference tensor that names a region): `local`
  (the default) only for loopback peers (403 otherwise), since a region is any object in /dev/shm
  the server can open; `any` for every peer; `off` refused for all (400). shm.py says why.
- model control (repository load / unload; the index is not control): refused with 400 by a server
  that is one of several processes sharing a port (serve --mps / --processes), where a load would
  reach only the process a client happens to hit.
Every other call is allowed. The checks cost a few attribute reads per request.

Where the doors ask: HTTP after the request line and headers, and for the small JSON requests
(repository, shared-memory registration) after their body is parsed, so a malformed body keeps
its 400 before any refusal as it always had; for inference before the body is read; gRPC before
the RPC's handler (a load or unload once its parameters are parsed, likewise); the metrics port
before it renders. The next rules (keys, an admin key for model control) belong in Policy.check:
each Call carries the peer and the headers (or metadata) already.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from urllib.parse import unquote

from .protocol import ProtocolError
from .protocol import peer_text as _peer

SHARED_MEMORY_POLICIES = ("local", "any", "off")


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
        """A header's value by its name in any case (HTTP headers, gRPC metadata keys are lower case)."""
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


class Policy:
    """The access rules of one server (its HTTP, uvicorn, gRPC and metrics doors alike)."""

    def __init__(self, shared_memory: str = "local"):
        if shared_memory not in SHARED_MEMORY_POLICIES:
            raise ValueError(f"shared memory policy {shared_memory!r}: choose one of "
                             f"{', '.join(SHARED_MEMORY_POLICIES)}")
        self.shared_memory = shared_memory
        self.control_refusal: str | None = None     # why load / unload is refused (serve --mps)

    def check(self, call: Call) -> None:
        """Allow the call, or raise the ProtocolError its door answers with."""
        if call.category is Category.SHARED_MEMORY:
            check_shared_memory(self.shared_memory, call.peer)
        if call.control and self.control_refusal:
            raise ProtocolError(self.control_refusal, 400)
