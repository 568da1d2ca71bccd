"""Who may call which route: the one place every transport asks before it runs one.

Why one place: the server has four front doors onto the same models: the hand-written HTTP/1.1
transport (transport.py), uvicorn (asgi.py, `--transport uvicorn`), the gRPC service
(grpc_service.py, `--grpc-port`) and the metrics port (metrics.py, `--metrics-port`). A rule
written into each of them would be written four times and drift; here each door names the call
(its API category, its peer, its headers or gRPC metadata) and Policy.check says yes, or raises
the ProtocolError that door answers with (HTTP status, or the gRPC code for it).

The categories are Triton's (`--http-restricted-api` / `--grpc-restricted-protocol`): health,
metadata, inference, shared memory, statistics (with Prometheus metrics), model repository. An
HTTP request's category comes from the same route table that dispatches it (routes.resolve), a
gRPC call's from GRPC_CATEGORIES, so a route cannot be served one way and classified another.

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

from .protocol import ProtocolError

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


def http_category(method: str, path: str) -> Category | None:
    """The category of an HTTP request (None where no route answers it: 404 / 405)."""
    from .routes import resolve

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
