"""`ngcx-runtime serve`: one model, or a repository of models, over the KServe v2 / Triton HTTP protocol.

Why this shape: tritonclient and curl must work unchanged (runtime.md §8), so the server speaks
JSON tensors AND Triton's binary tensor extension (tritonclient's default both ways), gzip /
deflate bodies, and answers every bad request with {"error": "..."} instead of dying. It is
stdlib only (ThreadingHTTPServer, HTTP/1.1 keep-alive) so the image stays slim; large bodies
are read with readinto into a per-connection buffer that is reused across keep-alive requests
and become numpy views without copies.

The HTTP transport, decided on evidence (issue 12, item 7; bench/results/issue12-transport/): this
hand-written one stays, against uvicorn 0.38 + httptools 0.9 (asgi.py, `--transport uvicorn`) on
the same engine and plan (H100, ResNet-50 FP16). Batch 256 in the body: 10.2k vs 2.5k img/s
(uvicorn hands a 77 MB body to the app in 64 KiB flow-controlled pieces); batch 1 from 64 clients:
1.28k vs 0.77k img/s, p99 88 vs 379 ms; one client: p50 3.1 vs 3.4 ms. uvicorn would add 2.5 MB to
the image (no uvloop), this transport nothing. On the framing and fuzz suites (issue 8) neither
answered a smuggled request (CL.TE, TE.CL, bad chunk sizes, conflicting lengths: all refused and
closed); uvicorn's parser is stricter in two places (repeated equal Content-Length, bare-LF lines:
refused) and looser in two (`Transfer-Encoding: gzip, chunked` read as chunked; a 413 keeps the
connection and reads the refused body), answers framing errors in plain text instead of the v2
JSON error, and has no connection cap at accept (28 of the 42 suite tests fail on it, none for a
crash or a 5xx). Measured too: uvicorn on a pre-bound socket without TCP_NODELAY stalled 40 ms per
response (Nagle + delayed ACK); asgi.py sets it. uvicorn stays measurable, not installed in images.

Other transports and processes: `--grpc-port` serves the KServe v2 gRPC service on the same
models (grpc_service.py); `--instances N [--gpus]` runs N engines per model behind one batcher;
`--processes N` / `--mps N` run N server processes behind this port (mps.py); CUDA shared memory
(cuda_shm.py) next to the system one where a GPU is.

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
--shared-memory local (loopback peers, the default), any, or off.

Status codes: 400 bad request body (and a failed load), 404 unknown model / version / path, 405
wrong method, 413 body over --max-body-mb (also answered to `Expect: 100-continue`, before the
upload), 500 engine failure (the server keeps serving), 503 while a model loads, after it failed
or was unloaded, while draining, and to a connection beyond --max-connections (answered at once,
then closed). SIGTERM: stop accepting, finish in-flight requests (queued ones run at once), exit 0.

Start-up (the CLI): listen first (/v2/health/live 200 at once), then load: a MODEL given
--precision / --batch-profile / --calibration-data is optimized through the plan cache
($NGCX_RUNTIME_CACHE; built once, a cache hit on every later start), a --handler module:Class
wraps it (handler.py); one warm-up inference runs; only then are /v2/health/ready and
/v2/models/NAME/ready 200. A failed load is one line and exit 2 (for a repository: when no
model loaded; otherwise one line per failed model, and the rest serve).

Python API (used by bench and tests): start_server(engine, ...), start_loading(loader, ...) and
start_repository(root, ...) -> ServerHandle; load_engine(...) builds what the CLI serves.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import signal
import socket
import sys
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from . import __version__, inference
from .batching import Batcher
from .cuda_shm import CudaSharedMemory
from .engine import Engine
from .errors import RuntimeUserError
from .framing import Framing, FramingError, read_chunked, request_framing, strict_int
from .metrics import CONTENT_TYPE, GpuGauges, MetricsServer, render
from .protocol import ProtocolError, build_response, parse_header, parse_infer_request
from .served import (
    DEFAULT_MAX_BATCH,
    PLATFORMS,
    ModelTable,
    NotFound,
    ServedModel,
    ServeError,
    Settings,
    instance_devices,
    resolve_max_batch,
)
from .shm import POLICIES, PeerView, SharedMemory

__all__ = ["DEFAULT_MAX_BATCH", "PLATFORMS", "ServeError", "ServerHandle", "load_engine", "start_loading",
           "start_repository", "start_server"]

SERVER_NAME = "ngcx-runtime"
MODEL_VERSION = "1"
EXTENSIONS = ["binary_tensor_data", "statistics", "model_configuration", "model_repository"]
SHM_EXTENSION = "system_shared_memory"
CUDA_SHM_EXTENSION = "cuda_shared_memory"
TRANSPORTS = ("stdlib", "uvicorn")
DEFAULT_MAX_CONNECTIONS = 512    # open connections (one thread each); more get a 503 at once
SMALL_WRITE = 64 * 1024          # responses below this go out in one send
DISCARD_FACTOR = 16              # after a refusal, up to this multiple of the limit is read and dropped
LINGER_IDLE_S = 1.0              # ... while the client keeps sending at least every second
LINGER_MAX_S = 10.0              # ... and for at most this long
SOCKET_TIMEOUT_S = 120.0         # a client stalled mid-body this long loses its connection
DRAIN_GRACE_S = 0.2              # draining: keep-alive connections get this long to deliver a request in transit
_resolve_max_batch = resolve_max_batch


class _App:
    """Everything a request handler needs: the model table, limits, connections and draining state."""

    def __init__(self, table: ModelTable, max_body_bytes: int, verbose: bool, shared_memory: str = "local"):
        self.table = table
        self.shm = SharedMemory(shared_memory)
        self.max_body = max_body_bytes
        self.max_body_text = f"{max_body_bytes / 2**20:.4g} MB ({max_body_bytes} bytes)"
        self.verbose = verbose
        self.draining = False
        self.inflight = 0
        self.cond = threading.Condition()
        self.connections: set[socket.socket] = set()
        self.max_connections = DEFAULT_MAX_CONNECTIONS
        self.gpus: GpuGauges | None = None
        self.metrics_server: MetricsServer | None = None
        self.cuda_shm = CudaSharedMemory(enabled=self.shm.enabled)
        self.grpc: Any = None                       # grpc_service.GrpcEndpoint with --grpc-port
        self.control_refusal: str | None = None     # why load/unload is refused (serve --mps)

    def extensions(self) -> list[str]:
        """Server metadata's extensions: shared memory only where it is enabled (CUDA: where a GPU is)."""
        out = list(EXTENSIONS)
        if self.shm.enabled:
            out.append(SHM_EXTENSION)
            if self.cuda_shm.available():
                out.append(CUDA_SHM_EXTENSION)
        return out

    def shm_view(self, peer: str) -> PeerView | None:
        """The shared-memory registries as a request from `peer` may use them (None when disabled)."""
        return PeerView(self.shm, peer, self.cuda_shm) if self.shm.enabled else None

    def check_control(self) -> None:
        """Repository load/unload, unless this process is one of several serving the same port."""
        if self.control_refusal:
            raise ProtocolError(self.control_refusal, 400)

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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    reuse_port = False                 # serve --mps: N processes share the port (SO_REUSEPORT)
    app: _App

    def server_bind(self) -> None:
        if self.reuse_port:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()

    def process_request(self, request: Any, client_address: Any) -> None:
        """One thread per connection, up to --max-connections. Past that a connection gets a 503
        at once and is closed, so idle or slow clients (slowloris) cannot pile up threads and
        memory without bound (issue 8). Counted here, before the thread starts, so a burst of
        accepts cannot overshoot the limit."""
        app = self.app
        with app.cond:
            full = request not in app.connections and len(app.connections) >= app.max_connections
            if not full:
                app.connections.add(request)
        if full:
            _refuse_busy(request, app.max_connections)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            with app.cond:
                app.connections.discard(request)
            raise


def _refuse_busy(sock: socket.socket, limit: int) -> None:
    body = json.dumps({"error": f"the server has {limit} connections open (--max-connections); "
                                "retry shortly or against another replica"}).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
            f"\r\nRetry-After: 1\r\nConnection: close\r\nServer: {SERVER_NAME}/{__version__}\r\n\r\n")
    with contextlib.suppress(OSError):
        sock.settimeout(1.0)
        sock.sendall(head.encode() + body)


class _Handler(BaseHTTPRequestHandler):
    """Routes the v2 paths; every failure becomes {"error": msg} with a 4xx/5xx status."""

    protocol_version = "HTTP/1.1"
    server_version = f"{SERVER_NAME}/{__version__}"
    timeout = SOCKET_TIMEOUT_S
    server: _Server

    # -- connection bookkeeping (so stop() can close idle keep-alive connections) --
    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buf = bytearray(0)
        with self.server.app.cond:
            self.server.app.connections.add(self.connection)

    def finish(self) -> None:
        with self.server.app.cond:
            self.server.app.connections.discard(self.connection)
            self.server.app.cond.notify_all()          # stop() waits for connections to end
        with contextlib.suppress(OSError):
            super().finish()

    def version_string(self) -> str:
        return self.server_version          # without the stdlib's Python version

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if self.server.app.verbose:
            sys.stderr.write(f"serve: {self.address_string()} {format % args}\n")

    # -- methods --
    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The stdlib calls this for unparsable request lines and unknown methods: keep the v2 format."""
        self.close_connection = True
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            self.request_version = self.protocol_version   # garbage request line: still send a status line
        text = _peer(message or explain or self.responses.get(code, ("error",))[0], 300)
        if code == 501:
            text = f"method {self.command} is not supported; use GET or POST"
        with contextlib.suppress(OSError):
            self._send_json(code, {"error": text})

    def handle_expect_100(self) -> bool:
        """curl sends `Expect: 100-continue` for large bodies: refuse an oversized one before upload."""
        app = self.server.app
        try:
            framing = request_framing(self.headers)
        except FramingError as exc:
            self.close_connection = True
            self._error(exc.status, exc.message)
            return False
        if not framing.chunked and framing.length > app.max_body:
            self.close_connection = True
            self._error(413, _too_large(framing.length, app.max_body_text))
            return False
        return super().handle_expect_100()

    def _dispatch(self, method: str) -> None:
        app = self.server.app
        self._body_done = False
        self._unread_body = False
        with app.cond:
            app.inflight += 1
        try:
            if app.draining:
                self.close_connection = True
            self._route(method)
        except ProtocolError as exc:
            self._drain_body()
            self._error(exc.status, exc.message)
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - the server must keep serving
            self.close_connection = True       # the body may be unread; start the next request afresh
            self._unread_body = not self._body_done
            self._error(500, f"internal error: {type(exc).__name__}: {exc}".replace("\n", " "))
        finally:
            with app.cond:
                app.inflight -= 1
                app.cond.notify_all()
        if self._unread_body:
            self._linger()

    def _route(self, method: str) -> None:
        app = self.server.app
        path = urlsplit(self.path).path.rstrip("/")
        if path == "/metrics":
            self._drain_body()
            if method not in ("GET", "HEAD"):
                raise ProtocolError(f"method {method} is not allowed on /metrics; use GET", 405)
            return self._send_pieces(200, [app.render_metrics().encode()], None, ctype=CONTENT_TYPE)
        parts = [unquote(p) for p in path.split("/")[1:]]
        if not parts or parts[0] != "v2":
            self._drain_body()
            raise ProtocolError(f"unknown path {_peer(path or '/')}; this server speaks KServe v2 under /v2", 404)
        rest = parts[1:]
        if method == "POST" and rest and rest[0] == "models" and rest[-1] == "infer":
            model = self._lookup(rest[1:-1], path)
            return self._infer(model)
        if rest and rest[0] == "repository":
            return self._repository(method, rest[1:], path)
        if rest and rest[0] in ("systemsharedmemory", "cudasharedmemory"):
            return self._shared_memory(method, rest, path)
        self._drain_body()
        if method not in ("GET", "HEAD"):
            raise ProtocolError(f"method {method} is not allowed on {_peer(path)}", 405)
        if rest == []:
            return self._send_json(200, {"name": SERVER_NAME, "version": __version__,
                                         "extensions": app.extensions()})
        if rest in (["health", "live"], ["health", "ready"]):
            ready = rest[1] == "live" or app.ready
            return self._send_json(200 if ready else 503, {rest[1]: ready})
        if rest == ["models", "stats"]:
            return self._send_json(200, {"model_stats": [m.stats_entry() for m in app.table.served()]})
        if rest and rest[0] == "models":
            return self._model_get(rest[1:], path)
        raise ProtocolError(f"unknown path {_peer(path)}", 404)

    @staticmethod
    def _model_path(rest: list[str]) -> tuple[str, str | None, list[str]]:
        """[NAME, (versions, V)?, ...tail] -> (name, version or None, tail)."""
        if not rest:
            raise ProtocolError("no model name in the path; use /v2/models/NAME/...", 404)
        tail = rest[1:]
        if len(tail) >= 2 and tail[0] == "versions":
            return rest[0], tail[1], tail[2:]
        return rest[0], None, tail

    def _lookup(self, rest: list[str], path: str) -> ServedModel:
        """The model an inference URL names (its tail must be empty)."""
        name, version, tail = self._model_path(rest)
        model = self.server.app.table.lookup(name, version)
        if tail:
            raise ProtocolError(f"unknown path {_peer(path)}", 404)
        return model

    def _model_get(self, rest: list[str], path: str) -> None:
        app = self.server.app
        name, version, tail = self._model_path(rest)
        if tail == ["ready"]:
            try:
                model = app.table.lookup(name, version)
            except ProtocolError as exc:
                if exc.status != 503:
                    raise
                return self._send_json(503, {"name": name, "ready": False})
            ready = model.ready and not app.draining
            return self._send_json(200 if ready else 503, {"name": model.name, "ready": ready})
        model = app.table.lookup(name, version)
        if tail == []:
            doc = model.metadata()
            if app.single is None:
                doc["versions"] = app.table.versions_of(name)
            return self._send_json(200, doc)
        if tail == ["config"]:
            return self._send_json(200, model.config())
        if tail == ["stats"]:
            chosen = [model] if version is not None or app.single else [
                app.table.lookup(name, v) for v in app.table.versions_of(name)]
            return self._send_json(200, {"model_stats": [m.stats_entry() for m in chosen]})
        raise ProtocolError(f"unknown path {_peer(path)}", 404)

    # -- the repository extension --
    def _repository(self, method: str, rest: list[str], path: str) -> None:
        """POST /v2/repository/index, /v2/repository/models/NAME/load and /unload (KServe v2, Triton)."""
        known = rest == ["index"] or (len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload"))
        if not known:
            self._drain_body()
            raise ProtocolError(f"unknown path {_peer(path)}", 404)
        if method != "POST":
            self._drain_body()
            raise ProtocolError(f"method {method} is not allowed on {_peer(path)}; use POST", 405)
        doc = self._small_json()
        table = self.server.app.table
        if rest != ["index"]:
            self.server.app.check_control()
        if rest == ["index"]:
            ready = _only_keys(doc, {"ready": bool}, "the index request").get("ready", False)
            return self._send_json(200, table.index(ready_only=bool(ready)))
        name, action = rest[1], rest[2]
        params = _only_keys(doc, {"parameters": dict}, f"the {action} request").get("parameters") or {}
        try:
            if action == "load":
                table.load(name, _load_override(params, name))
            else:
                _only_keys(params, {"unload_dependents": bool}, "the unload parameters")
                table.unload(name)
        except NotFound as exc:
            raise ProtocolError(str(exc), 404) from None
        except RuntimeUserError as exc:
            raise ProtocolError(" ".join(str(exc).split()), 400) from None
        return self._send_json(200, {})

    # -- the system shared memory extension --
    def _shared_memory(self, method: str, rest: list[str], path: str) -> None:
        """GET /v2/{system,cuda}sharedmemory[/region/NAME]/status, POST .../region/NAME/register, POST
        /v2/{system,cuda}sharedmemory[/region/NAME]/unregister (Triton's extensions; shm.py, cuda_shm.py)."""
        app = self.server.app
        kind, rest = rest[0], rest[1:]
        region = rest[1] if len(rest) == 3 and rest[0] == "region" else None
        action = rest[-1] if rest else ""
        shape_ok = rest in (["status"], ["unregister"]) or (region is not None and action in
                                                            ("status", "register", "unregister"))
        if not shape_ok:
            self._drain_body()
            raise ProtocolError(f"unknown path {_peer(path)}", 404)
        want = "GET" if action == "status" else "POST"
        if method != want and not (want == "GET" and method == "HEAD"):
            self._drain_body()
            raise ProtocolError(f"method {method} is not allowed on {_peer(path)}; use {want}", 405)
        doc = self._small_json() if want == "POST" else (self._drain_body() or {})
        app.shm.check_peer(self.client_address[0])
        registry: Any = app.shm if kind == "systemsharedmemory" else app.cuda_shm
        if action == "status":
            return self._send_json(200, registry.status(region))
        if action == "register" and kind == "systemsharedmemory":
            registry.register(region or "", doc)
        elif action == "register":
            registry.register_json(region or "", doc)
        else:
            _only_keys(doc, {}, "the unregister request")
            registry.unregister(region)
        return self._send_json(200, {})

    def _small_json(self) -> dict[str, Any]:
        """The optional JSON object body of a repository request ({} when there is none)."""
        framing = self._framing()
        if framing.chunked:
            body = bytes(self._read_chunked())
        else:
            body = bytes(self._read_body(self._checked_length(framing.length)))
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

    # -- inference --
    def _infer(self, model: ServedModel) -> None:
        stats = model.stats
        start = time.monotonic_ns()
        stats.count_request()
        try:
            engine = model.engine
            if engine is None or model.closed is not None:
                self._drain_body()
                engine = model.require_engine()
            shm = self.server.app.shm_view(self.client_address[0])
            req = self._read_request(model, engine, shm)
            results = inference.run(model, req)
            pieces, header_len = build_response(model.name, model.version, req, results, shm)
        except ProtocolError:
            stats.count_failure()
            raise
        stats.count_success(time.monotonic_ns() - start)
        self._send_pieces(200, pieces, header_len)

    def _read_request(self, model: ServedModel, eng: Engine, shm: PeerView | None = None):
        app = self.server.app
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        hlen_raw = self.headers.get("Inference-Header-Content-Length")
        framing = self._framing()
        if framing.chunked:
            body = self._read_chunked()
        elif self.headers.get("Content-Length") is None:
            raise ProtocolError("the inference request has no body (Content-Length missing)")
        else:
            body = self._read_body(self._checked_length(framing.length))
        if encoding in ("gzip", "deflate"):
            body = memoryview(_decompress(body, encoding, app.max_body, app.max_body_text))
        elif encoding != "identity":
            raise ProtocolError(f"unsupported Content-Encoding {encoding!r}; use gzip, deflate or none")
        if hlen_raw is None:
            doc, binary = parse_header(body), None
        else:
            try:
                hlen = strict_int(hlen_raw, "Inference-Header-Content-Length")
            except FramingError as exc:
                raise ProtocolError(exc.message) from None       # the body was read: keep the connection
            if not 0 < hlen <= len(body):
                raise ProtocolError(f"Inference-Header-Content-Length {hlen} is outside the body's "
                                    f"{len(body)} bytes")
            doc, binary = parse_header(body[:hlen]), body[hlen:]
        return parse_infer_request(doc, binary, eng.inputs, eng.outputs, model.name, model.batched, shm)

    def _framing(self) -> Framing:
        """The request's body framing (framing.py); an ambiguous one closes the connection."""
        try:
            framing = request_framing(self.headers)
        except FramingError:
            self.close_connection = True
            raise
        if framing.close or (framing.chunked and self.request_version == "HTTP/1.0"):
            self.close_connection = True       # RFC 9112 §6.1: chunked in HTTP/1.0 is faulty framing: close after
        return framing

    def _read_chunked(self) -> memoryview:
        """Transfer-Encoding: chunked (curl -T -, streaming clients): slower, one extra copy."""
        self._body_done = True
        app = self.server.app
        try:
            return memoryview(read_chunked(self.rfile, app.max_body, app.max_body_text))
        except (ProtocolError, ConnectionError):
            self.close_connection = True
            self._unread_body = True           # the rest of the upload is discarded after the answer
            raise

    def _checked_length(self, length: int) -> int:
        """An over-limit body is refused at once (413 before it is read), then the connection closes."""
        if length > self.server.app.max_body:
            self.close_connection = True
            raise ProtocolError(_too_large(length, self.server.app.max_body_text), 413)
        return length

    def _read_body(self, length: int) -> memoryview:
        """readinto a per-connection buffer (reused across keep-alive requests; never resized)."""
        self._body_done = True
        if len(self._buf) < length:
            self._buf = bytearray(length)
        view = memoryview(self._buf)[:length]
        got = 0
        while got < length:
            n = self.rfile.readinto(view[got:])
            if not n:
                self.close_connection = True
                raise ConnectionError(f"client closed the connection after {got} of {length} body bytes")
            got += n
        return view

    def _drain_body(self) -> None:
        """Discard a body nobody reads so the keep-alive stream stays in sync.

        Only a body within the limit with a valid Content-Length is read here, before the answer.
        Any other (oversized, chunked, ambiguous) is answered first and the connection closes; the
        rest of its upload is then discarded by _linger, so a client waiting for the answer gets it
        at once (issue 8) and a client still uploading reads it instead of a connection reset.
        """
        if self._body_done:
            return
        self._body_done = True
        try:
            framing = request_framing(self.headers)
        except FramingError:
            framing = None
        if framing is None or framing.chunked or framing.length > self.server.app.max_body:
            self.close_connection = True
            self._unread_body = True
            return
        chunk = memoryview(bytearray(min(framing.length, 1 << 20)))
        left = framing.length
        try:
            while left > 0:
                n = self.rfile.readinto(chunk[:min(left, len(chunk))])
                if not n:
                    break
                left -= n
        except OSError:
            self.close_connection = True

    def _linger(self) -> None:
        """After answering a request whose body stays unread: half-close, then discard what the
        client still sends (bounded in bytes and time) before the socket closes (nginx's
        lingering close). Closing at once with unread data makes the kernel send a reset, which
        can destroy our answer before the client has read it."""
        budget = DISCARD_FACTOR * self.server.app.max_body
        deadline = time.monotonic() + LINGER_MAX_S
        with contextlib.suppress(OSError, ValueError):
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(LINGER_IDLE_S)
            while budget > 0 and time.monotonic() < deadline:
                data = self.rfile.read1(min(budget, 1 << 16))
                if not data:
                    break
                budget -= len(data)

    # -- responses --
    def _error(self, status: int, message: str) -> None:
        try:
            self._send_json(status, {"error": message})
        except OSError:
            self.close_connection = True

    def _send_json(self, status: int, doc: Any) -> None:
        self._send_pieces(status, [json.dumps(doc, separators=(",", ":")).encode()], None)

    def _send_pieces(self, status: int, pieces: list, header_len: int | None, ctype: str | None = None) -> None:
        headers = getattr(self, "headers", None)      # absent when the request line was unparsable
        coding = _response_coding(headers.get("Accept-Encoding") if headers else None)
        if coding:
            pieces = [_compress(pieces, coding)]
        total = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in pieces)
        self.send_response(status)
        if ctype is None:
            ctype = "application/json" if header_len is None else "application/octet-stream"
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(total))
        if header_len is not None:
            self.send_header("Inference-Header-Content-Length", str(header_len))
        if coding:
            self.send_header("Content-Encoding", coding)
        if self.close_connection or self.server.app.draining:
            self.send_header("Connection", "close")
            self.close_connection = True
        if self.command == "HEAD":
            self.end_headers()
            return
        # One send for the HTTP headers plus the whole small body, or plus the JSON header of a
        # large binary one (no Nagle / delayed-ACK stall); tensors then go straight from their arrays.
        inline = len(pieces) if total < SMALL_WRITE else 1
        self._headers_buffer.append(b"\r\n")
        self._headers_buffer.extend(bytes(p) for p in pieces[:inline])
        self.flush_headers()
        for p in pieces[inline:]:
            self.wfile.write(p)


def _peer(text: str, limit: int = 80) -> str:
    """A peer's path, name or request line inside an error: as is when short and printable, else
    escaped and cut, so the error stays one bounded line (issue 8: %0A in a model name, 64 KB paths)."""
    if len(text) <= limit and text.isprintable():
        return text
    return repr(text[:limit])[1:-1] + ("..." if len(text) > limit else "")


def _only_keys(doc: dict[str, Any], allowed: dict[str, type], where: str) -> dict[str, Any]:
    """A small request object with only the known keys, each of its type: else one 400 line."""
    for key, value in doc.items():
        if key not in allowed:
            raise ProtocolError(f"{where}: unknown field '{_peer(str(key), 40)}'; known: {', '.join(allowed)}")
        if value is not None and (not isinstance(value, allowed[key]) or
                                  (allowed[key] is not bool and isinstance(value, bool))):
            raise ProtocolError(f"{where}: '{key}' must be a {allowed[key].__name__.replace('dict', 'JSON object')}")
    return doc


_load_override = inference.load_override


def _too_large(length: int, limit_text: str) -> str:
    return (f"request body of {length} bytes exceeds the limit of {limit_text}; "
            "restart the server with a larger --max-body-mb")


def _response_coding(accept: str | None) -> str | None:
    """gzip or deflate when the client's Accept-Encoding allows it (q > 0), else None."""
    allowed = set()
    for item in (accept or "").lower().split(","):
        coding, _, params = item.strip().partition(";")
        q = params.strip().removeprefix("q=") if params.strip().startswith("q=") else "1"
        try:
            if float(q) > 0:
                allowed.add(coding.strip())
        except ValueError:
            continue
    return next((c for c in ("gzip", "deflate") if c in allowed), None)


def _decompress(body: memoryview, encoding: str, limit: int, limit_text: str) -> bytes:
    """gzip or deflate (zlib-wrapped, or raw as some clients send), bounded by the body limit."""
    for wbits in ((31,) if encoding == "gzip" else (15, -15)):
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(body, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit or d.unconsumed_tail:
            raise ProtocolError(f"the decompressed request body exceeds the limit of {limit_text}; "
                                "restart the server with a larger --max-body-mb", 413)
        if not d.eof:                          # zlib hands back what it has of a cut-off stream
            continue
        return out
    raise ProtocolError(f"the request body is not valid {encoding} data (Content-Encoding: {encoding}); "
                        "it is corrupt or truncated")


def _compress(pieces: list, coding: str) -> bytes:
    """Level 1: responses are mostly float tensors that barely compress; speed matters more."""
    c = zlib.compressobj(1, zlib.DEFLATED, 31 if coding == "gzip" else 15)
    return b"".join([*(c.compress(p) for p in pieces), c.flush()])


class ServerHandle:
    """A running server: its address, models, counters, and stop(drain=True)."""

    def __init__(self, server: _Server, app: _App, thread: threading.Thread):
        self._server = server
        self._app = app
        self._thread = thread
        self.host, self.port = server.server_address[:2]
        self._stopped = False
        self.load_exception: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def grpc_port(self) -> int | None:
        """The gRPC port (None without --grpc-port)."""
        return self._app.grpc.port if self._app.grpc else None

    @property
    def grpc_target(self) -> str | None:
        """host:port for tritonclient.grpc.InferenceServerClient(url=...) (None without --grpc-port)."""
        return self._app.grpc.target if self._app.grpc else None

    @property
    def metrics_url(self) -> str | None:
        """The --metrics-port exposition (None when not asked for; /metrics of url always works)."""
        return self._app.metrics_server.url if self._app.metrics_server else None

    @property
    def name(self) -> str | None:
        """The one model's name (None for a repository)."""
        return self._app.name

    @property
    def max_batch(self) -> int:
        return self._app.single.max_batch if self._app.single else 0

    @property
    def ready(self) -> bool:
        return self._app.ready

    @property
    def load_error(self) -> str | None:
        """Why the model did not load (start_loading), or the repository's start-up failures, or None."""
        if self._app.single is not None:
            return self._app.single.load_error
        errors = self._app.table.startup_errors
        return "; ".join(errors.values()) if errors else None

    @property
    def loading(self) -> bool:
        """True until the engine is attached or loading failed (a repository: until start-up loading ended)."""
        if self._app.single is not None:
            return not self._app.single.loaded.is_set()
        return not self._app.table.startup_done.is_set()

    def wait_loaded(self, timeout: float | None = None) -> bool:
        """Wait until loading ended: True when the model (any repository model) is ready."""
        if self._app.single is not None:
            self._app.single.loaded.wait(timeout)
            return self._app.single.engine is not None
        self._app.table.startup_done.wait(timeout)
        return any(m.ready for m in self._app.table.served())

    def models(self) -> list[dict[str, Any]]:
        """The repository index (name, version, state, reason), as POST /v2/repository/index answers."""
        return self._app.table.index()

    def stats(self, model: str | None = None, version: str | None = None) -> dict[str, Any]:
        """requests, success, failed, engine_calls, batched_requests, inferences, batch_sizes ... of the
        one model, or of `model` (its newest version, or `version`) in a repository."""
        if model is None and self._app.single is not None:
            return self._app.single.stats.snapshot()
        entry = self._app.table.entries.get(model or "")
        if entry is None or not entry.stats:
            raise KeyError(f"no counters for model {model!r}")
        return entry.stats[version or max(entry.stats, key=int)].snapshot()

    @property
    def engine_calls(self) -> int:
        return self.stats()["engine_calls"]

    @property
    def requests(self) -> int:
        return self.stats()["requests"]

    @property
    def batched_requests(self) -> int:
        return self.stats()["batched_requests"]

    def stop(self, drain: bool = True, timeout: float = 30.0) -> None:
        """Stop accepting; with drain, let in-flight requests finish (up to timeout), then close."""
        if self._stopped:
            return
        self._stopped = True
        app = self._app
        with app.cond:
            app.draining = True
        if not isinstance(self._server, _Server):        # --transport uvicorn
            self._stop_asgi(drain, timeout)
            return
        self._server.shutdown()
        self._accept_backlog()
        self._server.socket.close()       # new connections are refused from here on
        grpc_done = app.grpc.stop(timeout if drain else 0) if app.grpc is not None else None
        app.table.flush()
        if drain:
            deadline = time.monotonic() + timeout
            grace = min(deadline, time.monotonic() + DRAIN_GRACE_S)
            with app.cond:
                while app.inflight and time.monotonic() < deadline:
                    app.cond.wait(max(0.0, deadline - time.monotonic()))
                # A request a keep-alive client sent before it saw `Connection: close` is still read
                # and answered (with close) instead of being lost to the shutdown below (issue 8).
                while app.connections and time.monotonic() < grace:
                    app.cond.wait(max(0.0, grace - time.monotonic()))
                while app.inflight and time.monotonic() < deadline:
                    app.cond.wait(max(0.0, deadline - time.monotonic()))
        app.table.stop(timeout if drain else 0.1)
        with app.cond:
            idle = list(app.connections)
        for conn in idle:                 # idle keep-alive connections: wake their threads
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        if grpc_done is not None:
            grpc_done.wait(timeout)
        if app.metrics_server is not None:
            app.metrics_server.stop()
        if app.gpus is not None:
            app.gpus.close()
        app.shm.close()
        app.cuda_shm.close()
        self._thread.join(timeout)

    def _stop_asgi(self, drain: bool, timeout: float) -> None:
        app = self._app
        grpc_done = app.grpc.stop(timeout if drain else 0) if app.grpc is not None else None
        app.table.flush()
        self._server.stop(timeout if drain else 0.1)
        app.table.stop(timeout if drain else 0.1)
        if grpc_done is not None:
            grpc_done.wait(timeout)
        if app.metrics_server is not None:
            app.metrics_server.stop()
        if app.gpus is not None:
            app.gpus.close()
        app.shm.close()
        app.cuda_shm.close()

    def _accept_backlog(self) -> None:
        """Serve the connections the kernel queued while serve_forever was stopping (up to its poll
        interval): closing the listener would reset them with their requests unanswered (issue 8).
        Their handlers see the drain and answer with `Connection: close`."""
        listener = self._server.socket
        with contextlib.suppress(OSError):
            listener.setblocking(False)
            while True:
                conn, addr = listener.accept()          # BlockingIOError (an OSError) once it is empty
                conn.setblocking(True)
                with self._app.cond:                    # counted now, so the drain's grace waits for it
                    self._app.connections.add(conn)
                self._server.process_request(conn, addr)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def start_server(engine: Engine | list[Engine], host: str = "127.0.0.1", port: int = 8000, *,
                 name: str | None = None, max_batch: int | None = None, max_queue_delay_ms: float = 1.0,
                 max_body_mb: float = 256.0, verbose: bool = False, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                 metrics_port: int | None = None, log: Callable[[str], None] | None = None,
                 shared_memory: str = "local", grpc_port: int | None = None, reuse_port: bool = False,
                 transport: str | None = None) -> ServerHandle:
    """Serve engine on host:port (0 = a free port) from background threads; returns at once, after one
    warm-up inference that also measures the batch layout (layout.py). A list of engines is the
    model's instances (--instances): one batcher feeds them all. grpc_port adds the gRPC service."""
    check_limits(max_batch, name, max_queue_delay_ms, max_body_mb, max_connections, metrics_port, grpc_port)
    first = engine[0] if isinstance(engine, list) else engine
    model = ServedModel(name or first.name, MODEL_VERSION, Settings(max_batch, max_queue_delay_ms), log=log)
    model.attach(engine)
    return _listen(_App(ModelTable.for_one(model, log), int(max_body_mb * 2**20), verbose, shared_memory), host,
                   port, max_connections, metrics_port, grpc_port, reuse_port, transport)


def start_loading(loader: Callable[..., Engine], host: str = "127.0.0.1", port: int = 8000, *, name: str,
                  max_batch: int | None = None, max_queue_delay_ms: float = 1.0, max_body_mb: float = 256.0,
                  verbose: bool = False, warmup: bool = True, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                  metrics_port: int | None = None, log: Callable[[str], None] | None = None,
                  shared_memory: str = "local", devices: tuple[int | str | None, ...] | None = None,
                  grpc_port: int | None = None, reuse_port: bool = False,
                  transport: str | None = None) -> ServerHandle:
    """Listen at once (live), then load in the background: ready only after loader() returned AND
    one warm-up inference ran, so a readiness probe never sends traffic to a cold model.

    devices: one entry per instance (served.instance_devices); loader(device) is then called once per
    instance. A loader failure leaves the server live and not ready, with handle.load_error saying
    why; the exception itself is kept as handle.load_exception for the caller to re-raise.
    """
    check_limits(max_batch, name, max_queue_delay_ms, max_body_mb, max_connections, metrics_port, grpc_port)
    model = ServedModel(name, MODEL_VERSION, Settings(max_batch, max_queue_delay_ms), log=log)
    handle = _listen(_App(ModelTable.for_one(model, log), int(max_body_mb * 2**20), verbose, shared_memory), host,
                     port, max_connections, metrics_port, grpc_port, reuse_port, transport)

    def load() -> None:
        try:
            engines = [loader()] if devices is None else [loader(d) for d in devices]
            if warmup:
                model.attach(engines)
            else:
                from .layout import prepare

                layout = prepare(engines[0], resolve_max_batch(engines[0], max_batch), run=False)
                model.attach(engines, layout, warm=False)
        except Exception as exc:  # noqa: BLE001 - any failure is reported, the server stays up not ready
            handle.load_exception = exc
            text = str(exc) if isinstance(exc, RuntimeUserError) else f"{type(exc).__name__}: {exc}"
            model.fail(" ".join(text.split()))

    threading.Thread(target=load, name="ngcx-load", daemon=True).start()
    return handle


def start_repository(root: str | Path, host: str = "127.0.0.1", port: int = 8000, *,
                     models: list[str] | None = None, backend: str | None = None, max_batch: int | None = None,
                     max_queue_delay_ms: float = 1.0, max_body_mb: float = 256.0, verbose: bool = False,
                     max_connections: int = DEFAULT_MAX_CONNECTIONS, metrics_port: int | None = None,
                     log: Callable[[str], None] | None = None, shared_memory: str = "local",
                     devices: tuple[int | str | None, ...] = (None,), grpc_port: int | None = None,
                     reuse_port: bool = False, transport: str | None = None) -> ServerHandle:
    """Serve a model repository (DIR/<model>/<version>/...): listen at once, then load `models` (default:
    all) one by one in the background, each ready after its warm-up; the repository extension loads
    and unloads more while it runs. handle.wait_loaded() waits for the start-up loads. devices: the
    instances of every model without an instance_group in its config (served.instance_devices)."""
    check_limits(max_batch, None, max_queue_delay_ms, max_body_mb, max_connections, metrics_port, grpc_port)
    root = Path(root)
    table = ModelTable(Settings(max_batch, max_queue_delay_ms, devices=tuple(devices)), log, root=root,
                       backend=backend)
    handle = _listen(_App(table, int(max_body_mb * 2**20), verbose, shared_memory), host, port, max_connections,
                     metrics_port, grpc_port, reuse_port, transport)
    threading.Thread(target=table.load_startup, args=(models,), name="ngcx-load", daemon=True).start()
    return handle


def check_limits(max_batch: int | None, name: str | None, max_queue_delay_ms: float, max_body_mb: float,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS, metrics_port: int | None = None,
                 grpc_port: int | None = None) -> None:
    """Flag checks that need no engine (done before listening)."""
    if max_connections < 1:
        raise ServeError(f"--max-connections {max_connections} must be at least 1")
    if max_batch is not None and max_batch < 1:
        raise ServeError(f"--max-batch {max_batch} must be at least 1")
    if name is not None and (not name or "/" in name):
        raise ServeError(f"--name {name!r} must be a non-empty name without '/' (it is a URL path segment)")
    if max_queue_delay_ms < 0:
        raise ServeError(f"--max-queue-delay-ms {max_queue_delay_ms} must not be negative")
    if max_body_mb <= 0:
        raise ServeError(f"--max-body-mb {max_body_mb} must be positive")
    if metrics_port is not None and not 0 <= metrics_port <= 65535:
        raise ServeError(f"--metrics-port {metrics_port} is not a TCP port (0-65535; 0 = any free port)")
    if grpc_port is not None and not 0 <= grpc_port <= 65535:
        raise ServeError(f"--grpc-port {grpc_port} is not a TCP port (0-65535; 0 = any free port; Triton uses 8001)")


def _transport(transport: str | None) -> str:
    """stdlib (default) or uvicorn; $NGCX_RUNTIME_TRANSPORT picks the default (the bench and suites use it)."""
    import os

    chosen = transport or os.environ.get("NGCX_RUNTIME_TRANSPORT") or "stdlib"
    if chosen not in TRANSPORTS:
        raise ServeError(f"transport {chosen!r}: choose one of {', '.join(TRANSPORTS)}")
    return chosen


def _listen(app: _App, host: str, port: int, max_connections: int = DEFAULT_MAX_CONNECTIONS,
            metrics_port: int | None = None, grpc_port: int | None = None, reuse_port: bool = False,
            transport: str | None = None) -> ServerHandle:
    app.max_connections = max_connections
    try:
        if _transport(transport) == "uvicorn":
            from .asgi import AsgiServer

            server: Any = AsgiServer(app, host, port, max_connections, reuse_port)
        else:
            server = _Server((host, port), _Handler, bind_and_activate=False)
            server.reuse_port = reuse_port
            try:
                server.server_bind()
                server.server_activate()
            except BaseException:
                server.server_close()
                raise
    except OSError as exc:
        app.table.stop(0.1)
        why = exc.strerror or exc
        raise ServeError(f"cannot listen on {host}:{port}: {why}; pick another --port") from None
    server.app = app
    app.gpus = GpuGauges()
    asgi = not isinstance(server, _Server)

    def close_listener() -> None:
        server.stop(0.1) if asgi else server.server_close()

    if metrics_port is not None:
        try:
            app.metrics_server = MetricsServer(host, metrics_port, app.render_metrics)
        except OSError as exc:
            close_listener()
            app.table.stop(0.1)
            app.gpus.close()
            raise ServeError(f"cannot listen on {host}:{metrics_port} for metrics: {exc.strerror or exc}; "
                             "pick another --metrics-port") from None
    if grpc_port is not None:
        from . import grpc_service

        try:
            app.grpc = grpc_service.start(app, host, grpc_port, max_message_bytes=app.max_body, reuse_port=reuse_port)
        except BaseException:
            close_listener()
            app.table.stop(0.1)
            app.gpus.close()
            if app.metrics_server is not None:
                app.metrics_server.stop()
            raise
    if asgi:
        return ServerHandle(server, app, server.thread)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              name="ngcx-serve", daemon=True)
    thread.start()
    return ServerHandle(server, app, thread)


# -- command line --

def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `serve` on the ngcx-runtime argparse subparsers; sets func(args) -> int."""
    p = subparsers.add_parser("serve", help="serve a model over the KServe v2 / Triton HTTP protocol",
                              description=__doc__.split("\n\n")[0])
    _add_arguments(p)
    p.set_defaults(func=run, parser=p)
    return p


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="PLAN_DIR|MODEL|REPOSITORY", nargs="?", default=None,
                   help="a plan directory from `optimize`, a model (.onnx / .pt2), or a model repository "
                        "(DIR/<model>/<version>/model.onnx, optional DIR/<model>/config.json); optional with "
                        "--handler")
    p.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 = any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--name", default=None, help="model name in the URL (default: the engine's name)")
    p.add_argument("--max-batch", type=int, default=None,
                   help="largest merged batch and largest accepted request batch (default: the engine's, "
                        f"or {DEFAULT_MAX_BATCH})")
    p.add_argument("--max-queue-delay-ms", type=float, default=1.0,
                   help="how long the oldest queued request waits for others to merge with (default 1.0)")
    p.add_argument("--max-body-mb", type=float, default=256.0, help="largest request body (default 256 MB)")
    p.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS,
                   help=f"open connections served at once (one thread each); more get a 503 "
                        f"(default {DEFAULT_MAX_CONNECTIONS})")
    p.add_argument("--backend", default=None, choices=["tensorrt", "onnxruntime", "pytorch"],
                   help="engine backend (default: chosen automatically)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="also serve Prometheus metrics on this port (Triton uses 8002; default: only /metrics "
                        "of --port)")
    p.add_argument("--load-model", action="append", default=None, metavar="NAME",
                   help="a repository: load only these models at start (repeatable; default: all); the others "
                        "load through POST /v2/repository/models/NAME/load")
    p.add_argument("--shared-memory", default="local", choices=POLICIES,
                   help="Triton's system shared memory extension: local = clients on this host (loopback) only "
                        "(default), any = every peer (e.g. a container sharing /dev/shm), off = disabled")
    p.add_argument("--grpc-port", type=int, default=None, metavar="PORT",
                   help="also serve the KServe v2 gRPC service on this port (Triton uses 8001; tritonclient.grpc)")
    p.add_argument("--instances", type=int, default=1, metavar="N",
                   help="engine instances per model (Triton's instance_group count), fed by one dynamic batcher; "
                        "a repository model's config.json instance_group overrides it (default 1)")
    p.add_argument("--gpus", default=None, metavar="0,1",
                   help="put --instances N instances on EACH of these GPUs (default: the first GPU, or the CPU)")
    p.add_argument("--mps", type=int, default=None, metavar="N",
                   help="N server processes sharing the GPU through NVIDIA MPS behind this one port (starts the "
                        "MPS control daemon when none runs; refused where MPS is unavailable; default "
                        "$NGCX_RUNTIME_MPS, which `ngcx run --mps N` sets)")
    p.add_argument("--transport", default=None, choices=TRANSPORTS,
                   help="HTTP transport: stdlib (default; see the module docstring for the measurement) or uvicorn "
                        "(needs uvicorn + httptools); default $NGCX_RUNTIME_TRANSPORT or stdlib")
    p.add_argument("--processes", type=int, default=None, metavar="N",
                   help="N server processes behind this one port (SO_REUSEPORT), e.g. to use more CPU cores than "
                        "one Python process can; --mps does the same with the GPU shared through MPS")
    p.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)   # one of --mps's processes
    p.add_argument("--verbose", action="store_true", help="log every request to stderr")
    p.add_argument("--handler", default=None, metavar="MODULE:CLASS",
                   help="serve a Python handler class (load(context), predict(inputs)) from --app-dir")
    p.add_argument("--app-dir", default=None, metavar="DIR",
                   help="folder the handler module is imported from (default /opt/ngcx/app when it exists, "
                        "else the current directory)")
    p.add_argument("--precision", default=None, choices=["fp32", "fp16", "int8"],
                   help="optimize MODEL at this precision on first start, into the plan cache "
                        "($NGCX_RUNTIME_CACHE); later starts load the cached plan")
    p.add_argument("--batch-profile", default=None, metavar="1,8,32",
                   help="batch sizes to optimize MODEL for (the largest is the max batch); implies optimizing")
    p.add_argument("--calibration-data", default=None, metavar="FILE.npz",
                   help="int8 calibration inputs, one array per model input keyed by its name")


def _env_int(name: str) -> int | None:
    """An integer default from the environment (None when unset; a junk value is left for the check to name)."""
    import os

    value = os.environ.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ServeError(f"${name}={value!r} is not a whole number of processes") from None


def load_engine(model: str | Path | None, *, handler: str | None = None, app_dir: str | Path | None = None,
                backend: str | None = None, precision: str | None = None, batch_profile: list[int] | None = None,
                calibration: str | Path | None = None, name: str | None = None,
                log: Callable[[str], None] | None = None, device: int | str | None = None) -> Engine:
    """The engine `serve` runs: the model (optimized through the plan cache when a precision, batch
    profile or calibration file is given), wrapped in the handler when there is one."""
    from .plan import load

    engine: Engine | None = None
    if model is not None:
        path = Path(model)
        wants_plan = precision is not None or batch_profile is not None or calibration is not None
        if wants_plan and path.is_file():
            path = _cached_plan(path, backend, precision or "fp32", batch_profile, calibration, name, log or print)
        engine = load(path, backend=backend, device=device)
    if handler is not None:
        from .handler import load_handler

        engine = load_handler(handler, Path(app_dir) if app_dir else None, engine=engine,
                              model_path=Path(model).resolve() if model is not None else None, name=name)
    if engine is None:
        raise ServeError("nothing to serve: give a MODEL (or PLAN_DIR), a --handler module:Class, or both")
    return engine


def _cached_plan(model: Path, backend: str | None, precision: str, batch_profile: list[int] | None,
                 calibration: str | Path | None, name: str | None, log: Callable[[str], None]) -> Path:
    """Optimize through optimize.py's cache (keyed by model hash, backend version, GPU, precision,
    batch profile, calibration): the first start builds, every later one is a cache hit."""
    from .optimize import load_calibration, optimize
    from .plan import OptimizeOptions, _model_name

    calib = sha = None
    if calibration is not None:
        calib, sha = load_calibration(Path(calibration))
    opts = OptimizeOptions(precision=precision, calibration=calib, calibration_sha256=sha,
                           name=name or _model_name(model))
    if batch_profile is not None:
        opts.batch_profile = list(batch_profile)
    res = optimize(model, None, opts, backend=backend,
                   calibration_path=Path(calibration).resolve() if calibration is not None else None)
    m = res.manifest
    what = (f"{m['backend']} {m['precision']}, batch {','.join(map(str, m.get('batch_profile') or []))}, "
            f"{res.plan_dir}")
    if res.cache_hit:
        log(f"plan: cache hit ({what}) in {res.seconds:.2f} s")
    else:
        log(f"plan: built in {res.seconds:.1f} s (cache miss; {what})")
    return res.plan_dir


def _check_args(args: argparse.Namespace) -> list[int] | None:
    """Everything checkable without loading, so a typo exits 2 before the server listens."""
    from .errors import RuntimeUserError

    check_limits(args.max_batch, args.name, args.max_queue_delay_ms, args.max_body_mb, args.max_connections,
                 args.metrics_port, args.grpc_port)
    args.devices = instance_devices(args.instances, _parse_gpus(args.gpus))
    if args.mps is None and not args.reuse_port:
        args.mps = _env_int("NGCX_RUNTIME_MPS")
    for flag, value in (("--mps", args.mps), ("--processes", args.processes)):
        if value is not None and value < 1:
            raise ServeError(f"{flag} {value} must be at least 1 (the number of server processes)")
    if args.mps is not None and args.processes is not None:
        raise ServeError("give --mps N or --processes N, not both (--mps N is --processes N with MPS)")
    if _repository_root(args) is not None:
        _check_repository_args(args)
        return None
    if args.load_model:
        raise ServeError("--load-model names models of a repository; give a repository folder "
                         "(DIR/<model>/<version>/model.onnx) instead of one model")
    if args.model is None and args.handler is None:
        raise ServeError("nothing to serve: give a MODEL (or PLAN_DIR), a --handler module:Class, or both")
    if args.model is not None and not Path(args.model).exists():
        raise RuntimeUserError(f"{args.model}: no such model or plan directory")
    if args.handler is not None:
        from .handler import parse_spec

        parse_spec(args.handler)
        if args.app_dir is not None and not Path(args.app_dir).is_dir():
            raise ServeError(f"--app-dir {args.app_dir}: no such directory; point it at the folder with the handler")
    if args.calibration_data is not None and not Path(args.calibration_data).is_file():
        raise ServeError(f"--calibration-data {args.calibration_data}: no such file; save one with "
                         "numpy.savez(path, input_name=array, ...)")
    if args.precision == "int8" and args.calibration_data is None and args.model and Path(args.model).is_file():
        raise ServeError("--precision int8 needs --calibration-data FILE.npz (one array per model input, keyed "
                         "by input name, samples along axis 0)")
    if args.model is not None and Path(args.model).is_dir() and (args.precision or args.batch_profile
                                                                 or args.calibration_data):
        raise ServeError(f"{args.model} is an optimized plan already; --precision, --batch-profile and "
                         "--calibration-data apply to a MODEL file (or rebuild it with ngcx-runtime optimize)")
    if args.batch_profile is None:
        return None
    from .optimize import parse_batches

    try:
        return parse_batches(args.batch_profile)
    except RuntimeUserError:
        raise ServeError(f"--batch-profile {args.batch_profile!r}: give positive batch sizes separated by "
                         "commas, e.g. 1,8,32") from None


def _parse_gpus(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        gpus = [int(g) for g in text.split(",")]
    except ValueError:
        gpus = []
    if not gpus or any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise ServeError(f"--gpus {text!r}: give distinct GPU indices separated by commas, e.g. 0,1")
    return gpus


def _repository_root(args: argparse.Namespace) -> Path | None:
    """MODEL is a repository when it is a folder without a plan manifest (repository.is_repository)."""
    from .repository import is_repository

    if args.model is None:
        return None
    path = Path(args.model)
    return path if is_repository(path) else None


def _check_repository_args(args: argparse.Namespace) -> None:
    """Per-model flags belong in DIR/<model>/config.json; a repository must hold at least one model."""
    from .repository import model_names, valid_name

    root = Path(args.model)
    per_model = [flag for flag, value in (("--handler", args.handler), ("--name", args.name),
                                          ("--precision", args.precision), ("--batch-profile", args.batch_profile),
                                          ("--calibration-data", args.calibration_data)) if value is not None]
    if per_model:
        raise ServeError(f"{', '.join(per_model)} apply to one model; {root} is a model repository (it has no "
                         "manifest.json): put batching settings in DIR/<model>/config.json, or serve one model")
    names = model_names(root)
    if not names:
        raise ServeError(f"{root}: neither a plan directory (no manifest.json) nor a model repository (no "
                         f"{root}/<model>/<version>/model.onnx); give a model file, a plan or a repository")
    for name in args.load_model or []:
        if not valid_name(name) or name not in names:
            raise ServeError(f"--load-model {name!r}: no such model in {root}; it has: {', '.join(names[:20])}")


def _default_name(args: argparse.Namespace) -> str:
    """The URL name before the engine exists: --name, the plan's, the model file's, or the handler module's."""
    from .plan import _model_name, read_manifest

    if args.name:
        return args.name
    if args.model is not None:
        path = Path(args.model)
        if path.is_dir():
            name = read_manifest(path).get("name")
            return name if isinstance(name, str) and name and "/" not in name else _model_name(path)
        return _model_name(path)
    return args.handler.partition(":")[0].rsplit(".", 1)[-1]


def run(args: argparse.Namespace) -> int:
    """Listen at once, load (optimize on a cache miss), warm up, turn ready; serve until
    SIGTERM/SIGINT, drain in-flight requests, exit 0. A load failure: one line, exit 2."""
    batch_profile = _check_args(args)
    if (args.mps is not None or args.processes is not None) and not args.reuse_port:
        from . import mps

        return mps.supervise(args)
    stop = threading.Event()

    def _on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    root = _repository_root(args)
    if root is not None:
        signal.signal(signal.SIGTERM, _on_signal)
        signal.signal(signal.SIGINT, _on_signal)
        return _run_repository(args, root, stop)
    name = _default_name(args)

    def loader(device: int | str | None = None) -> Engine:
        return load_engine(args.model, handler=args.handler, app_dir=args.app_dir, backend=args.backend,
                           precision=args.precision, batch_profile=batch_profile,
                           calibration=args.calibration_data, name=name, log=lambda line: print(line, flush=True),
                           device=device)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    handle = start_loading(loader, args.host, args.port, name=name, max_batch=args.max_batch,
                           max_queue_delay_ms=args.max_queue_delay_ms, max_body_mb=args.max_body_mb,
                           verbose=args.verbose, max_connections=args.max_connections,
                           metrics_port=args.metrics_port, log=_log, shared_memory=args.shared_memory,
                           devices=args.devices, grpc_port=args.grpc_port, reuse_port=args.reuse_port,
                           transport=args.transport)
    _mark_shared(handle, args)
    print(f"serve: listening at {handle.url} (live; ready once '{name}' is loaded and warmed up)"
          f"{_metrics_note(handle)}", flush=True)
    while handle.loading and not stop.is_set():
        handle.wait_loaded(0.2)
    engine = handle._app.engine
    if engine is None:                  # the load failed (one line, exit 2), or a signal came first
        handle.stop(drain=False, timeout=1.0)
        if handle.load_exception is not None:
            raise handle.load_exception
        return 0
    print(f"serving model '{handle.name}' ({engine.backend}, {engine.device}, {engine.precision}) at "
          f"{handle.url}/v2/models/{handle.name} (max batch {handle.max_batch}, queue delay "
          f"{args.max_queue_delay_ms:g} ms)", flush=True)
    while not stop.wait(0.5):
        pass
    print("serve: signal received; draining in-flight requests", flush=True)
    handle.stop(drain=True)
    print(f"serve: stopped ({handle.stats()['requests']} inference requests served)", flush=True)
    return 0


def _log(line: str) -> None:
    print(line, flush=True)


def _metrics_note(handle: ServerHandle) -> str:
    grpc = f"; gRPC at {handle.grpc_target}" if handle.grpc_target else ""
    return grpc + (f"; metrics at {handle.metrics_url}" if handle.metrics_url else "")


def _mark_shared(handle: ServerHandle, args: argparse.Namespace) -> None:
    """One of serve --mps's processes: a load or unload would reach only the process a client happens to hit."""
    if args.reuse_port:
        handle._app.control_refusal = ("this server is one of several processes sharing the port (serve --mps); "
                                       "loading and unloading models would change only one of them: restart the "
                                       "server with the models to serve (--load-model)")


def _run_repository(args: argparse.Namespace, root: Path, stop: threading.Event) -> int:
    """`serve DIR`: load the repository's models (each warmed up), serve those that loaded; exit 2 when
    none did. Failures are one line each; the repository extension can load them again later."""
    handle = start_repository(root, args.host, args.port, models=args.load_model, backend=args.backend,
                              max_batch=args.max_batch, max_queue_delay_ms=args.max_queue_delay_ms,
                              max_body_mb=args.max_body_mb, verbose=args.verbose,
                              max_connections=args.max_connections, metrics_port=args.metrics_port, log=_log,
                              shared_memory=args.shared_memory, devices=args.devices, grpc_port=args.grpc_port,
                              reuse_port=args.reuse_port, transport=args.transport)
    _mark_shared(handle, args)
    print(f"serve: listening at {handle.url} (live; ready once the models of {root} are loaded and warmed up)"
          f"{_metrics_note(handle)}", flush=True)
    while handle.loading and not stop.is_set():
        handle.wait_loaded(0.2)
    ready = sorted({m.name for m in handle._app.table.served() if m.ready})
    errors = handle._app.table.startup_errors
    if stop.is_set() and handle.loading:
        handle.stop(drain=False, timeout=1.0)
        return 0
    if not ready and errors:
        handle.stop(drain=False, timeout=1.0)
        raise ServeError(f"no model of {root} loaded: {'; '.join(errors.values())}")
    failed = f"; failed: {', '.join(sorted(errors))}" if errors else ""
    print(f"serving {len(ready)} model(s) from {root} at {handle.url}/v2/models/ ({', '.join(ready) or 'none yet'})"
          f"{failed}", flush=True)
    while not stop.wait(0.5):
        pass
    print("serve: signal received; draining in-flight requests", flush=True)
    handle.stop(drain=True)
    total = sum(m.stats.snapshot()["requests"] for m in handle._app.table.served())
    print(f"serve: stopped ({total} inference requests served)", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m ngcx_runtime.serve ...`: the same command without the ngcx-runtime front end."""
    from .errors import RuntimeUserError

    p = argparse.ArgumentParser(prog="ngcx-runtime serve", description=__doc__.split("\n\n")[0])
    _add_arguments(p)
    p.set_defaults(parser=p)
    args = p.parse_args(argv)
    try:
        return run(args)
    except (RuntimeUserError, ServeError) as exc:
        print(f"ngcx-runtime serve: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
