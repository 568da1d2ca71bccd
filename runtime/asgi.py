"""The same KServe v2 HTTP endpoints as an ASGI app under uvicorn (httptools): `serve --transport uvicorn`.

Why it exists: issue 12, item 7 asks for the HTTP transport to be decided on evidence.
transport.py is written by hand on the standard library (framing.py: chunked bodies, Expect,
drain, keep-alive), which is where a request-smuggling bug once came from; uvicorn with httptools
(the llhttp parser from Node.js) is a well-kept alternative. This module serves the same models,
batchers, shared-memory registries and counters through uvicorn so both can be measured on the
same engine and run through the same framing and fuzz suites (NGCX_RUNTIME_TRANSPORT=uvicorn
makes start_server/start_repository/start_loading use it). The figures and the decision are in
bench/results/http-transport/ and in transport.py's docstring.

Differences kept small on purpose: routes, access checks, status codes and {"error": ...} bodies
are routes.py's and access.py's, called in the same order as transport.py calls them; framing
(chunked, Expect: 100-continue, keep-alive, pipelining) is uvicorn's; a body over --max-body-mb
with a Content-Length is refused with 413 before it is read, a chunked one once it passes the
limit. Blocking work (inference, metrics, loads, shared-memory registration) runs in a thread
pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import __version__, access, routes
from .access import Call
from .codings import compress, response_coding, too_large
from .framing import FramingError, strict_int
from .protocol import ProtocolError
from .routes import App
from .served import ServedModel, ServeError

SERVER = f"ngcx-runtime/{__version__}"


class _Request:
    """What the router needs of one ASGI request."""

    def __init__(self, scope: dict[str, Any], receive: Any):
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers: dict[str, str] = {}
        for k, v in scope["headers"]:          # a header sent twice: its values joined (RFC 9110 §5.3)
            name, value = k.decode("latin-1").lower(), v.decode("latin-1")
            self.headers[name] = f"{self.headers[name]}, {value}" if name in self.headers else value
        self.peer = (scope.get("client") or ("", 0))[0]
        self._receive = receive

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    async def body(self, limit: int, limit_text: str) -> memoryview:
        """The whole body: preallocated from Content-Length (413 before reading when over the limit)."""
        declared = self.header("content-length")
        size = None
        if declared is not None:
            try:
                size = strict_int(declared, "Content-Length")
            except FramingError as exc:
                raise ProtocolError(exc.message, exc.status) from None
            if size > limit:
                raise ProtocolError(too_large(size, limit_text), 413)
        buf = bytearray(size or 0)
        got = 0
        while True:
            event = await self._receive()
            if event["type"] == "http.disconnect":
                raise ConnectionError("the client disconnected")
            chunk = event.get("body", b"")
            if chunk:
                if got + len(chunk) > limit:
                    raise ProtocolError(too_large(got + len(chunk), limit_text), 413)
                if got + len(chunk) > len(buf):
                    buf.extend(b"\0" * (got + len(chunk) - len(buf)))
                buf[got:got + len(chunk)] = chunk
                got += len(chunk)
            if not event.get("more_body", False):
                return memoryview(buf)[:got]


class AsgiApp:
    """The ASGI callable over a routes.App: the same routes, access policy and replies as transport.py."""

    def __init__(self, app: App, pool: ThreadPoolExecutor):
        self.app = app
        self.pool = pool

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        req = _Request(scope, receive)
        try:
            reply = await self.route(req)
        except ProtocolError as exc:
            reply = routes.error_reply(exc)
        except ConnectionError:
            return
        except Exception as exc:  # noqa: BLE001 - the server must keep serving
            text = " ".join(f"internal error: {type(exc).__name__}: {exc}".split())
            reply = routes.json_reply(500, {"error": text})
        await self._send(req, send, reply)

    async def _send(self, req: _Request, send: Any, reply: routes.Reply) -> None:
        body = b"".join(bytes(p) for p in reply.pieces)
        ctype = reply.ctype or ("application/json" if reply.header_len is None else "application/octet-stream")
        extra = [] if reply.header_len is None else [(b"inference-header-content-length",
                                                      str(reply.header_len).encode())]
        coding = response_coding(req.header("accept-encoding"))
        if coding:
            body = compress([body], coding)
            extra = [*extra, (b"content-encoding", coding.encode())]
        headers = [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode()), *extra,
                   *((k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers)]
        if self.app.draining:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if req.method == "HEAD" else body})

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def route(self, req: _Request) -> routes.Reply:
        """Resolve and ask the access policy (access.route_call, before any body is read), read the body
        the route takes, answer (blocking work in the pool)."""
        app = self.app
        route, call = access.route_call(app.policy, req.method, req.path, req.peer, req.headers)
        if route.kind == "infer":
            return await self._infer(req, route, call)
        doc = await self._small_json(req) if route.reads == "json" else {}
        if route.kind in ("metrics", "repository", "shm"):
            return await self._run(routes.answer, app, route, doc)
        return routes.answer(app, route, doc)

    async def _infer(self, req: _Request, route: access.Route, call: Call) -> routes.Reply:
        model = routes.infer_model(self.app, route)
        with routes.counted(model):
            engine = model.engine if model.engine is not None and model.closed is None else model.require_engine()
            body = await req.body(self.app.max_body, self.app.max_body_text)
            return await self._run(self._infer_sync, model, engine, req, body, call)

    def _infer_sync(self, model: ServedModel, engine: Any, req: _Request, body: memoryview,
                    call: Call) -> routes.Reply:
        view = self.app.shm_view(call)
        parsed = routes.decode_request(self.app, model, engine, body, req.header("content-encoding"),
                                       req.header("inference-header-content-length"), view)
        return routes.respond(model, parsed, view)

    async def _small_json(self, req: _Request) -> dict[str, Any]:
        return routes.parse_small_json(bytes(await req.body(self.app.max_body, self.app.max_body_text)))


class AsgiServer:
    """uvicorn (httptools parser) serving AsgiApp from a background thread with its own event loop."""

    def __init__(self, app: App, host: str, port: int, max_connections: int, reuse_port: bool = False,
                 tls: ssl.SSLContext | None = None, tls_files: tuple[str, str] | None = None):
        """tls: the server context (tls.py) uvicorn serves with; tls_files its (cert, key) paths."""
        try:
            import uvicorn
        except ImportError:
            raise ServeError("--transport uvicorn needs uvicorn and httptools: pip install uvicorn httptools") from None
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # accepted connections inherit it: uvicorn writes a response's head and body separately, and
        # without it Nagle holds the body until the client's delayed ACK (40 ms per request, measured)
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if reuse_port:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            self.socket.bind((host, port))
        except OSError:
            self.socket.close()
            raise
        self.socket.listen(1024)
        self.server_address = self.socket.getsockname()
        self.pool = ThreadPoolExecutor(max_workers=max_connections, thread_name_prefix="ngcx-asgi")
        http = "httptools"
        try:
            import httptools  # noqa: F401
        except ImportError:
            http = "h11"
        config = uvicorn.Config(AsgiApp(app, self.pool), http=http, ws="none", loop="asyncio", lifespan="off",
                                log_level="critical", access_log=False, limit_concurrency=max_connections,
                                timeout_keep_alive=120, server_header=False, date_header=False,
                                headers=[("server", SERVER)],
                                ssl_certfile=tls_files[0] if tls and tls_files else None,
                                ssl_keyfile=tls_files[1] if tls and tls_files else None)
        if tls is not None:
            config.load()
            config.ssl = tls                    # ours: TLS 1.2 at least, as the other ports
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                       name="ngcx-uvicorn", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and self.thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.01)

    def stop(self, timeout: float) -> None:
        """Stop accepting, let in-flight requests finish (uvicorn's graceful shutdown), close."""
        self.server.config.timeout_graceful_shutdown = max(0.1, timeout)
        self.server.should_exit = True
        self.thread.join(timeout + 5)
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.socket.close()
