"""The KServe v2 protocol over the served models: what each route answers, whatever carried it.

Why apart from the transports: the hand-written HTTP/1.1 server (transport.py) and uvicorn
(asgi.py) read requests and write answers their own way (framing, buffers, an event loop), but
must answer every request alike. So a transport resolves the path (access.resolve: a Route with
its category, or the 404 / 405 it gets), asks access.Policy, reads the body the route takes, and
calls answer() here (or, for inference, infer_model / decode_request / respond around its own
body reading) with the parsed request; what comes back is a Reply to write. gRPC (grpc_service.py) shares the
models, counters and inference.py below this layer.

What it serves (served.py): `serve MODEL_OR_PLAN_DIR` one model, as version 1; `serve DIR` a
Triton-style repository (DIR/<model>/<version>/model.onnx, optional DIR/<model>/config.json or
.yaml with max_batch_size, dynamic_batching, version_policy; repository.py), every model with its
own batcher, loadable and unloadable at runtime through the KServe v2 repository extension
(POST /v2/repository/index, /v2/repository/models/NAME/load, /unload). A model is ready only
after its load AND a warm-up inference; a broken model directory fails its own load (400 with
the reason) while the others keep serving.

Batching (batching.py, layout.py): the batch axis of every output is measured at load (batch 1
vs batch 2), so a model whose outputs are time-major is split on the right axis, and a model
whose dim 0 is not a batch is served unbatched; never a 500 under concurrency. A request whose
batch (dim 0) exceeds the max batch is refused with 400, the way Triton refuses requests above
max_batch_size; it is never split.

Metrics (metrics.py): Prometheus text with Triton's names on GET /metrics of this port, and of
--metrics-port when given (Triton's 8002).

System shared memory (shm.py): Triton's extension under /v2/systemsharedmemory, so a client on
this host (tritonclient.utils.shared_memory) passes tensors through /dev/shm instead of bodies;
--shared-memory local (loopback peers, the default), any, or off (the rule is access.py's).
CUDA shared memory (cuda_shm.py) under /v2/cudasharedmemory, next to the system one where a GPU is.

Status codes: 400 bad request body (and a failed load), 404 unknown model / version / path, 405
wrong method, 413 body over --max-body-mb, 500 engine failure (the server keeps serving), 503
while a model loads, after it failed or was unloaded, and while draining.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

from . import __version__, inference
from .access import Call, Category, Policy, Route
from .batching import Batcher
from .codings import decompress
from .cuda_shm import CudaSharedMemory
from .engine import Engine
from .errors import RuntimeUserError
from .framing import FramingError, strict_int
from .metrics import CONTENT_TYPE, GpuGauges, MetricsServer, render
from .protocol import InferRequest, ProtocolError, build_response, parse_header, parse_infer_request
from .protocol import peer_text as _peer
from .served import ModelTable, NotFound, ServedModel
from .shm import PeerView, SharedMemory

SERVER_NAME = "ngcx-runtime"
EXTENSIONS = ["binary_tensor_data", "statistics", "model_configuration", "model_repository"]
SHM_EXTENSION = "system_shared_memory"
CUDA_SHM_EXTENSION = "cuda_shared_memory"
DEFAULT_MAX_CONNECTIONS = 512    # open connections (one thread each); more get a 503 at once


class App:
    """Everything a route needs: the model table, limits, access policy, connections and draining state."""

    def __init__(self, table: ModelTable, max_body_bytes: int, verbose: bool, shared_memory: str = "local",
                 policy: Policy | None = None):
        self.table = table
        self.policy = policy or Policy(shared_memory)
        self.shm = SharedMemory(shared_memory)
        self.max_body = max_body_bytes
        self.max_body_text = f"{max_body_bytes / 2**20:.4g} MB ({max_body_bytes} bytes)"
        self.verbose = verbose
        self.draining = False
        self.inflight = 0
        self.cond = threading.Condition()
        self.connections: set[Any] = set()
        self.max_connections = DEFAULT_MAX_CONNECTIONS
        self.gpus: GpuGauges | None = None
        self.metrics_server: MetricsServer | None = None
        self.cuda_shm = CudaSharedMemory(enabled=self.shm.enabled)
        self.grpc: Any = None                       # grpc_service.GrpcEndpoint with --grpc-port

    def extensions(self) -> list[str]:
        """Server metadata's extensions: shared memory only where it is enabled (CUDA: where a GPU is)."""
        out = list(EXTENSIONS)
        if self.shm.enabled:
            out.append(SHM_EXTENSION)
            if self.cuda_shm.available():
                out.append(CUDA_SHM_EXTENSION)
        return out

    def shm_view(self, call: Call) -> PeerView | None:
        """The shared-memory registries as `call`'s peer may use them (None when disabled): every
        region it names is checked by the policy as a shared-memory call."""
        if not self.shm.enabled:
            return None
        shm_call = Call(Category.SHARED_MEMORY, call.peer, call.headers)
        return PeerView(self.shm, lambda: self.policy.check(shm_call), self.cuda_shm)

    # `serve MODEL`: the one model (None for a repository)
    @property
    def single(self) -> ServedModel | None:
        return self.table.single

    @property
    def name(self) -> str | None:
        return self.single.name if self.single else None

    @property
    def engine(self) -> Engine | None:
        return self.single.engine if self.single else None

    @property
    def batcher(self) -> Batcher | None:
        return self.single.batcher if self.single else None

    @property
    def ready(self) -> bool:
        """Server readiness: the one model is ready, or the repository's start-up loading has ended."""
        if self.draining:
            return False
        return self.single.ready if self.single else self.table.startup_done.is_set()

    def render_metrics(self) -> str:
        return render(self.table.samples(), self.gpus)


class Reply(NamedTuple):
    """An answer to write: status, body pieces (bytes or arrays), the binary header length, content type."""

    status: int
    pieces: list
    header_len: int | None = None
    ctype: str | None = None
    headers: tuple[tuple[str, str], ...] = ()       # extra response headers (a 401's WWW-Authenticate)


def json_reply(status: int, doc: Any, headers: tuple[tuple[str, str], ...] = ()) -> Reply:
    return Reply(status, [json.dumps(doc, separators=(",", ":")).encode()], None, None, headers)


def error_reply(exc: ProtocolError) -> Reply:
    """{"error": message} with the error's status and headers."""
    return json_reply(exc.status, {"error": exc.message}, exc.headers)


def answer(app: App, route: Route, doc: dict[str, Any]) -> Reply:
    """The reply of every route but inference; doc is the parsed body of a "json" route ({} otherwise)."""
    if route.kind == "metrics":
        return Reply(200, [app.render_metrics().encode()], None, CONTENT_TYPE)
    if route.kind == "server":
        return json_reply(200, {"name": SERVER_NAME, "version": __version__, "extensions": app.extensions()})
    if route.kind == "health":
        which = route.args[0]
        ready = which == "live" or app.ready
        return json_reply(200 if ready else 503, {which: ready})
    if route.kind == "stats":
        return json_reply(200, {"model_stats": [m.stats_entry() for m in app.table.served()]})
    if route.kind == "model":
        return _model_get(app, route)
    if route.kind == "repository":
        return _repository(app, route, doc)
    if route.kind == "shm":
        return _shared_memory(app, route, doc)
    raise ProtocolError(f"unknown path {_peer(route.path)}", 404)


def _model_get(app: App, route: Route) -> Reply:
    name, version, tail = route.args
    if tail == ["ready"]:
        try:
            model = app.table.lookup(name, version)
        except ProtocolError as exc:
            if exc.status != 503:
                raise
            return json_reply(503, {"name": name, "ready": False})
        ready = model.ready and not app.draining
        return json_reply(200 if ready else 503, {"name": model.name, "ready": ready})
    model = app.table.lookup(name, version)
    if tail == []:
        doc = model.metadata()
        if app.single is None:
            doc["versions"] = app.table.versions_of(name)
        return json_reply(200, doc)
    if tail == ["config"]:
        return json_reply(200, model.config())
    if tail == ["stats"]:
        chosen = [model] if version is not None or app.single else [
            app.table.lookup(name, v) for v in app.table.versions_of(name)]
        return json_reply(200, {"model_stats": [m.stats_entry() for m in chosen]})
    raise ProtocolError(f"unknown path {_peer(route.path)}", 404)


def _repository(app: App, route: Route, doc: dict[str, Any]) -> Reply:
    """POST /v2/repository/index, /v2/repository/models/NAME/load and /unload (KServe v2, Triton)."""
    table = app.table
    if route.args == ("index",):
        ready = only_keys(doc, {"ready": bool}, "the index request").get("ready", False)
        return json_reply(200, table.index(ready_only=bool(ready)))
    name, action = route.args[1], route.args[2]
    params = only_keys(doc, {"parameters": dict}, f"the {action} request").get("parameters") or {}
    try:
        if action == "load":
            table.load(name, inference.load_override(params, name))
        else:
            only_keys(params, {"unload_dependents": bool}, "the unload parameters")
            table.unload(name)
    except NotFound as exc:
        raise ProtocolError(str(exc), 404) from None
    except RuntimeUserError as exc:
        raise ProtocolError(" ".join(str(exc).split()), 400) from None
    return json_reply(200, {})


def _shared_memory(app: App, route: Route, doc: dict[str, Any]) -> Reply:
    kind, region, action = route.args
    registry: Any = app.shm if kind == "systemsharedmemory" else app.cuda_shm
    if action == "status":
        return json_reply(200, registry.status(region))
    if action == "register" and kind == "systemsharedmemory":
        registry.register(region or "", doc)
    elif action == "register":
        registry.register_json(region or "", doc)
    else:
        only_keys(doc, {}, "the unregister request")
        registry.unregister(region)
    return json_reply(200, {})


def parse_small_json(body: bytes) -> dict[str, Any]:
    """The optional JSON object body of a repository or shared-memory request ({} when there is none)."""
    if not body.strip():
        return {}
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(f"malformed JSON in the request body: {' '.join(str(exc).split())[:160]}") from None
    except RecursionError:
        raise ProtocolError("the JSON request body is nested too deeply") from None
    if not isinstance(doc, dict):
        raise ProtocolError(f"the request body must be a JSON object, not a {type(doc).__name__}")
    return doc


def only_keys(doc: dict[str, Any], allowed: dict[str, type], where: str) -> dict[str, Any]:
    """A small request object with only the known keys, each of its type: else one 400 line."""
    for key, value in doc.items():
        if key not in allowed:
            raise ProtocolError(f"{where}: unknown field '{_peer(str(key), 40)}'; known: {', '.join(allowed)}")
        if value is not None and (not isinstance(value, allowed[key]) or
                                  (allowed[key] is not bool and isinstance(value, bool))):
            raise ProtocolError(f"{where}: '{key}' must be a {allowed[key].__name__.replace('dict', 'JSON object')}")
    return doc


# -- inference: the transport reads the body between infer_model and decode_request --

def infer_model(app: App, route: Route) -> ServedModel:
    """The model an inference URL names (404 / 503 as the table says; its tail must be empty)."""
    name, version, tail = route.args
    model = app.table.lookup(name, version)
    if tail:
        raise ProtocolError(f"unknown path {_peer(route.path)}", 404)
    return model


@contextlib.contextmanager
def counted(model: ServedModel) -> Iterator[None]:
    """Count one inference request in the model's statistics: a ProtocolError is a failure, a
    return a success with its duration (anything else, a 500, is neither). Between the two it is in
    flight (Stats.in_flight), which the batcher reads to decide whether waiting for company can pay."""
    stats = model.stats
    start = time.monotonic_ns()
    stats.count_request()
    try:
        yield
    except ProtocolError:
        stats.count_failure()
        raise
    except BaseException:
        stats.count_abandoned()
        raise
    stats.count_success(time.monotonic_ns() - start)


def decode_request(app: App, model: ServedModel, engine: Engine, body: memoryview, encoding: str | None,
                   header_length: str | None, view: PeerView | None) -> InferRequest:
    """An inference body (Content-Encoding, then the JSON header and Triton's binary tail) as a parsed request."""
    encoding = (encoding or "identity").strip().lower()
    if encoding in ("gzip", "deflate"):
        body = memoryview(decompress(body, encoding, app.max_body, app.max_body_text))
    elif encoding != "identity":
        raise ProtocolError(f"unsupported Content-Encoding {encoding!r}; use gzip, deflate or none")
    if header_length is None:
        doc, binary = parse_header(body), None
    else:
        try:
            hlen = strict_int(header_length, "Inference-Header-Content-Length")
        except FramingError as exc:
            raise ProtocolError(exc.message) from None       # the body was read: keep the connection
        if not 0 < hlen <= len(body):
            raise ProtocolError(f"Inference-Header-Content-Length {hlen} is outside the body's "
                                f"{len(body)} bytes")
        doc, binary = parse_header(body[:hlen]), body[hlen:]
    return parse_infer_request(doc, binary, engine.inputs, engine.outputs, model.name, model.batched, view)


def respond(model: ServedModel, req: InferRequest, view: PeerView | None) -> Reply:
    """Run a parsed request through the model's batcher; the v2 response (JSON, or binary tensors)."""
    results = inference.run(model, req)
    pieces, header_len = build_response(model.name, model.version, req, results, view)
    return Reply(200, pieces, header_len)
