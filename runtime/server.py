"""Running servers: start_server, start_loading and start_repository, and the ServerHandle they return.

Why apart from the `serve` command (serve.py): bench/ and the tests start servers in-process
through these functions, and the command is one caller among them. A start function checks the
limits (check_limits: flag checks that need no engine) and the access settings (access=AccessConfig:
the keys files read and the TLS files loaded before anything listens), builds the routes' App over
a model table, listens on the HTTP port (transport.py, or asgi.py with transport="uvicorn" or
$NGCX_RUNTIME_TRANSPORT=uvicorn), then the metrics port and the gRPC port when asked, all with
TLS when configured (tls.py), and returns at once; a failure to listen is one ServeError line,
with whatever was started stopped.

Start-up: listen first (/v2/health/live 200 at once), then load in the background (start_loading,
start_repository): one warm-up inference runs before /v2/health/ready and /v2/models/NAME/ready
turn 200, so a readiness probe never sends traffic to a cold model.

Stopping (ServerHandle.stop, the command's SIGTERM): stop accepting, finish in-flight requests
(queued ones run at once), answer a request a keep-alive client sent before it saw
`Connection: close` (DRAIN_GRACE_S), serve the connections the kernel had queued, then close.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import tls
from .access import AccessConfig, Call, Category, Policy
from .engine import Engine
from .errors import RuntimeUserError
from .loading import LOADS
from .metrics import GpuGauges, MetricsServer
from .routes import DEFAULT_MAX_CONNECTIONS, App
from .served import ModelTable, ServedModel, ServeError, Settings, resolve_max_batch
from .transport import HttpHandler, HttpServer

MODEL_VERSION = "1"
TRANSPORTS = ("stdlib", "uvicorn")
DRAIN_GRACE_S = 0.2              # draining: keep-alive connections get this long to deliver a request in transit


class ServerHandle:
    """A running server: its address, models, counters, and stop(drain=True)."""

    def __init__(self, server: HttpServer, app: App, thread: threading.Thread):
        self._server = server
        self._app = app
        self._thread = thread
        self.host, self.port = server.server_address[:2]
        self._stopped = False
        self.load_exception: BaseException | None = None

    @property
    def url(self) -> str:
        """http://host:port, or https:// with --tls-cert."""
        scheme = "https" if self._app.policy.access.tls else "http"
        return f"{scheme}://{self.host}:{self.port}"

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
        if not isinstance(self._server, HttpServer):        # --transport uvicorn
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
        self._close_rest(grpc_done, timeout)
        self._thread.join(timeout)

    def _stop_asgi(self, drain: bool, timeout: float) -> None:
        app = self._app
        grpc_done = app.grpc.stop(timeout if drain else 0) if app.grpc is not None else None
        app.table.flush()
        self._server.stop(timeout if drain else 0.1)
        app.table.stop(timeout if drain else 0.1)
        self._close_rest(grpc_done, timeout)

    def _close_rest(self, grpc_done: threading.Event | None, timeout: float) -> None:
        """After the HTTP side stopped: wait for gRPC's in-flight calls, close metrics, NVML, shared memory."""
        app = self._app
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
                 transport: str | None = None, access: AccessConfig | None = None) -> ServerHandle:
    """Serve engine on host:port (0 = a free port) from background threads; returns at once, after one
    warm-up inference that also measures the batch layout (layout.py). A list of engines is the
    model's instances (--instances): one batcher feeds them all. grpc_port adds the gRPC service.
    access: keys, model control, TLS (access.AccessConfig; default: open, plain, no model control)."""
    check_limits(max_batch, name, max_queue_delay_ms, max_body_mb, max_connections, metrics_port, grpc_port)
    policy = Policy(shared_memory, access, log)
    first = engine[0] if isinstance(engine, list) else engine
    model = ServedModel(name or first.name, MODEL_VERSION, Settings(max_batch, max_queue_delay_ms), log=log)
    model.attach(engine)
    return _listen(App(ModelTable.for_one(model, log), int(max_body_mb * 2**20), verbose, shared_memory, policy),
                   host, port, max_connections, metrics_port, grpc_port, reuse_port, transport)


def start_loading(loader: Callable[..., Engine], host: str = "127.0.0.1", port: int = 8000, *, name: str,
                  max_batch: int | None = None, max_queue_delay_ms: float = 1.0, max_body_mb: float = 256.0,
                  verbose: bool = False, warmup: bool = True, max_connections: int = DEFAULT_MAX_CONNECTIONS,
                  metrics_port: int | None = None, log: Callable[[str], None] | None = None,
                  shared_memory: str = "local", devices: tuple[int | str | None, ...] | None = None,
                  grpc_port: int | None = None, reuse_port: bool = False,
                  transport: str | None = None, access: AccessConfig | None = None) -> ServerHandle:
    """Listen at once (live), then load in the background: ready only after loader() returned AND
    one warm-up inference ran, so a readiness probe never sends traffic to a cold model.

    devices: one entry per instance (placement.place); loader(device) is then called once per
    instance. A loader failure leaves the server live and not ready, with handle.load_error saying
    why; the exception itself is kept as handle.load_exception for the caller to re-raise.
    """
    check_limits(max_batch, name, max_queue_delay_ms, max_body_mb, max_connections, metrics_port, grpc_port)
    policy = Policy(shared_memory, access, log)
    model = ServedModel(name, MODEL_VERSION, Settings(max_batch, max_queue_delay_ms), log=log)
    handle = _listen(App(ModelTable.for_one(model, log), int(max_body_mb * 2**20), verbose, shared_memory, policy),
                     host, port, max_connections, metrics_port, grpc_port, reuse_port, transport)

    def load() -> None:
        from .placement import load_instances  # a default spread over the GPUs falls back, never fails (its doc)

        try:
            engines = [loader()] if devices is None else load_instances(loader, devices, log or (lambda _l: None))
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

    LOADS.submit(load)
    return handle


def start_repository(root: str | Path, host: str = "127.0.0.1", port: int = 8000, *,
                     models: list[str] | None = None, backend: str | None = None, max_batch: int | None = None,
                     max_queue_delay_ms: float = 1.0, max_body_mb: float = 256.0, verbose: bool = False,
                     max_connections: int = DEFAULT_MAX_CONNECTIONS, metrics_port: int | None = None,
                     log: Callable[[str], None] | None = None, shared_memory: str = "local",
                     devices: tuple[int | str | None, ...] = (None,), grpc_port: int | None = None,
                     reuse_port: bool = False, transport: str | None = None,
                     access: AccessConfig | None = None) -> ServerHandle:
    """Serve a model repository (DIR/<model>/<version>/...): listen at once, then load `models` (default:
    all) one by one in the background, each ready after its warm-up; the repository extension loads
    and unloads more while it runs. handle.wait_loaded() waits for the start-up loads. devices: the
    instances of every model without an instance_group in its config (placement.place)."""
    check_limits(max_batch, None, max_queue_delay_ms, max_body_mb, max_connections, metrics_port, grpc_port)
    policy = Policy(shared_memory, access, log)
    root = Path(root)
    table = ModelTable(Settings(max_batch, max_queue_delay_ms, devices=tuple(devices)), log, root=root,
                       backend=backend)
    handle = _listen(App(table, int(max_body_mb * 2**20), verbose, shared_memory, policy), host, port,
                     max_connections, metrics_port, grpc_port, reuse_port, transport)
    LOADS.submit(table.load_startup, models)
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
    chosen = transport or os.environ.get("NGCX_RUNTIME_TRANSPORT") or "stdlib"
    if chosen not in TRANSPORTS:
        raise ServeError(f"transport {chosen!r}: choose one of {', '.join(TRANSPORTS)}")
    return chosen


def _listen(app: App, host: str, port: int, max_connections: int = DEFAULT_MAX_CONNECTIONS,
            metrics_port: int | None = None, grpc_port: int | None = None, reuse_port: bool = False,
            transport: str | None = None) -> ServerHandle:
    app.max_connections = max_connections
    config = app.policy.access
    tls_files = (str(config.tls_cert), str(config.tls_key)) if config.tls else None
    try:
        ctx = tls.server_context(*tls_files) if tls_files else None
    except BaseException:
        app.table.stop(0.1)
        raise
    try:
        if _transport(transport) == "uvicorn":
            from .asgi import AsgiServer

            server: Any = AsgiServer(app, host, port, max_connections, reuse_port, ctx, tls_files)
        else:
            server = HttpServer((host, port), HttpHandler, bind_and_activate=False)
            server.reuse_port = reuse_port
            server.tls = ctx
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
    asgi = not isinstance(server, HttpServer)

    def close_listener() -> None:
        server.stop(0.1) if asgi else server.server_close()

    if metrics_port is not None:
        try:
            app.metrics_server = MetricsServer(
                host, metrics_port, app.render_metrics,
                lambda peer, headers, known: app.policy.check(Call(Category.STATISTICS if known else None, peer,
                                                                   headers)), tls=ctx)
        except OSError as exc:
            close_listener()
            app.table.stop(0.1)
            app.gpus.close()
            raise ServeError(f"cannot listen on {host}:{metrics_port} for metrics: {exc.strerror or exc}; "
                             "pick another --metrics-port") from None
    if grpc_port is not None:
        from . import grpc_service

        try:
            app.grpc = grpc_service.start(app, host, grpc_port, max_message_bytes=app.max_body, reuse_port=reuse_port,
                                          tls_files=tls_files)
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
