"""The same KServe v2 HTTP endpoints as an ASGI app under uvicorn (httptools): `serve --transport uvicorn`.

Why it exists: issue 12, item 7 asks for the HTTP transport to be decided on evidence. serve.py's
transport is written by hand on the standard library (framing.py: chunked bodies, Expect, drain,
keep-alive), which is where a request-smuggling bug once came from; uvicorn with httptools (the
llhttp parser from Node.js) is a well-kept alternative. This module serves the same models,
batchers, shared-memory registries and counters through uvicorn so both can be measured on the
same engine and run through the same framing and fuzz suites (NGCX_RUNTIME_TRANSPORT=uvicorn
makes start_server/start_repository/start_loading use it). The figures and the decision are in
bench/results/issue12-transport/ and in serve.py's docstring.

Differences kept small on purpose: routes, status codes and {"error": ...} bodies are serve.py's;
framing (chunked, Expect: 100-continue, keep-alive, pipelining) is uvicorn's; a body over
--max-body-mb with a Content-Length is refused with 413 before it is read, a chunked one once it
passes the limit. Blocking work (inference, loads) runs in a thread pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import unquote

from . import __version__, inference
from .framing import FramingError, strict_int
from .metrics import CONTENT_TYPE
from .protocol import ProtocolError, build_response, parse_header, parse_infer_request
from .served import NotFound, ServedModel, ServeError

SERVER = f"ngcx-runtime/{__version__}"


class _Request:
    """What the router needs of one ASGI request."""

    def __init__(self, scope: dict[str, Any], receive: Any):
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        self.peer = (scope.get("client") or ("", 0))[0]
        self._receive = receive

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())

    async def body(self, limit: int, limit_text: str) -> memoryview:
        """The whole body: preallocated from Content-Length (413 before reading when over the limit)."""
        from .serve import _too_large

        declared = self.header("content-length")
        size = None
        if declared is not None:
            try:
                size = strict_int(declared, "Content-Length")
            except FramingError as exc:
                raise ProtocolError(exc.message, exc.status) from None
            if size > limit:
                raise ProtocolError(_too_large(size, limit_text), 413)
        buf = bytearray(size or 0)
        got = 0
        while True:
            event = await self._receive()
            if event["type"] == "http.disconnect":
                raise ConnectionError("the client disconnected")
            chunk = event.get("body", b"")
            if chunk:
                if got + len(chunk) > limit:
                    raise ProtocolError(_too_large(got + len(chunk), limit_text), 413)
                if got + len(chunk) > len(buf):
                    buf.extend(b"\0" * (got + len(chunk) - len(buf)))
                buf[got:got + len(chunk)] = chunk
                got += len(chunk)
            if not event.get("more_body", False):
                return memoryview(buf)[:got]


class AsgiApp:
    """The ASGI callable over a serve._App."""

    def __init__(self, app: Any, pool: ThreadPoolExecutor):
        self.app = app
        self.pool = pool

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        req = _Request(scope, receive)
        try:
            status, body, ctype, extra = await self.route(req)
        except ProtocolError as exc:
            status, body, ctype, extra = exc.status, _json({"error": exc.message}), "application/json", []
        except ConnectionError:
            return
        except Exception as exc:  # noqa: BLE001 - the server must keep serving
            text = " ".join(f"internal error: {type(exc).__name__}: {exc}".split())
            status, body, ctype, extra = 500, _json({"error": text}), "application/json", []
        await self._send(req, send, status, body, ctype, extra)

    async def _send(self, req: _Request, send: Any, status: int, body: bytes, ctype: str,
                    extra: list[tuple[bytes, bytes]]) -> None:
        from .serve import _compress, _response_coding

        coding = _response_coding(req.header("accept-encoding"))
        if coding:
            body = _compress([body], coding)
            extra = [*extra, (b"content-encoding", coding.encode())]
        headers = [(b"content-type", ctype.encode()), (b"content-length", str(len(body)).encode()), *extra]
        if self.app.draining:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if req.method == "HEAD" else body})

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def route(self, req: _Request) -> tuple[int, bytes, str, list]:
        from .serve import _peer

        app = self.app
        path = req.path.rstrip("/")
        method = req.method
        if path == "/metrics":
            if method not in ("GET", "HEAD"):
                raise ProtocolError(f"method {method} is not allowed on /metrics; use GET", 405)
            return 200, (await self._run(app.render_metrics)).encode(), CONTENT_TYPE, []
        parts = [unquote(p) for p in path.split("/")[1:]]
        if not parts or parts[0] != "v2":
            raise ProtocolError(f"unknown path {_peer(path or '/')}; this server speaks KServe v2 under /v2", 404)
        rest = parts[1:]
        if method == "POST" and rest and rest[0] == "models" and rest[-1] == "infer":
            return await self._infer(req, rest[1:-1], path)
        if rest and rest[0] == "repository":
            return await self._repository(req, rest[1:], path)
        if rest and rest[0] in ("systemsharedmemory", "cudasharedmemory"):
            return await self._shared_memory(req, rest, path)
        if method not in ("GET", "HEAD"):
            raise ProtocolError(f"method {method} is not allowed on {_peer(path)}", 405)
        if rest == []:
            return _ok({"name": "ngcx-runtime", "version": __version__, "extensions": app.extensions()})
        if rest in (["health", "live"], ["health", "ready"]):
            ready = rest[1] == "live" or app.ready
            return 200 if ready else 503, _json({rest[1]: ready}), "application/json", []
        if rest == ["models", "stats"]:
            return _ok({"model_stats": [m.stats_entry() for m in app.table.served()]})
        if rest and rest[0] == "models":
            return self._model_get(rest[1:], path)
        raise ProtocolError(f"unknown path {_peer(path)}", 404)

    @staticmethod
    def _model_path(rest: list[str]) -> tuple[str, str | None, list[str]]:
        if not rest:
            raise ProtocolError("no model name in the path; use /v2/models/NAME/...", 404)
        tail = rest[1:]
        if len(tail) >= 2 and tail[0] == "versions":
            return rest[0], tail[1], tail[2:]
        return rest[0], None, tail

    def _model_get(self, rest: list[str], path: str) -> tuple[int, bytes, str, list]:
        from .serve import _peer

        app = self.app
        name, version, tail = self._model_path(rest)
        if tail == ["ready"]:
            try:
                model = app.table.lookup(name, version)
            except ProtocolError as exc:
                if exc.status != 503:
                    raise
                return 503, _json({"name": name, "ready": False}), "application/json", []
            ready = model.ready and not app.draining
            return 200 if ready else 503, _json({"name": model.name, "ready": ready}), "application/json", []
        model = app.table.lookup(name, version)
        if tail == []:
            doc = model.metadata()
            if app.single is None:
                doc["versions"] = app.table.versions_of(name)
            return _ok(doc)
        if tail == ["config"]:
            return _ok(model.config())
        if tail == ["stats"]:
            chosen = [model] if version is not None or app.single else [
                app.table.lookup(name, v) for v in app.table.versions_of(name)]
            return _ok({"model_stats": [m.stats_entry() for m in chosen]})
        raise ProtocolError(f"unknown path {_peer(path)}", 404)

    async def _infer(self, req: _Request, rest: list[str], path: str) -> tuple[int, bytes, str, list]:
        from .serve import _peer

        name, version, tail = self._model_path(rest)
        model: ServedModel = self.app.table.lookup(name, version)
        if tail:
            raise ProtocolError(f"unknown path {_peer(path)}", 404)
        stats = model.stats
        start = time.monotonic_ns()
        stats.count_request()
        try:
            engine = model.engine if model.engine is not None and model.closed is None else model.require_engine()
            body = await req.body(self.app.max_body, self.app.max_body_text)
            pieces, header_len = await self._run(self._infer_sync, model, engine, req, body)
        except ProtocolError:
            stats.count_failure()
            raise
        stats.count_success(time.monotonic_ns() - start)
        if header_len is None:
            return 200, b"".join(bytes(p) for p in pieces), "application/json", []
        return (200, b"".join(bytes(p) for p in pieces), "application/octet-stream",
                [(b"inference-header-content-length", str(header_len).encode())])

    def _infer_sync(self, model: ServedModel, engine: Any, req: _Request, body: memoryview):
        from .serve import _decompress

        app = self.app
        encoding = (req.header("content-encoding") or "identity").strip().lower()
        if encoding in ("gzip", "deflate"):
            body = memoryview(_decompress(body, encoding, app.max_body, app.max_body_text))
        elif encoding != "identity":
            raise ProtocolError(f"unsupported Content-Encoding {encoding!r}; use gzip, deflate or none")
        hlen_raw = req.header("inference-header-content-length")
        if hlen_raw is None:
            doc, binary = parse_header(body), None
        else:
            try:
                hlen = strict_int(hlen_raw, "Inference-Header-Content-Length")
            except FramingError as exc:
                raise ProtocolError(exc.message) from None
            if not 0 < hlen <= len(body):
                raise ProtocolError(f"Inference-Header-Content-Length {hlen} is outside the body's {len(body)} bytes")
            doc, binary = parse_header(body[:hlen]), body[hlen:]
        view = app.shm_view(req.peer)
        parsed = parse_infer_request(doc, binary, engine.inputs, engine.outputs, model.name, model.batched, view)
        results = inference.run(model, parsed)
        return build_response(model.name, model.version, parsed, results, view)

    async def _small_json(self, req: _Request) -> dict[str, Any]:
        body = bytes(await req.body(self.app.max_body, self.app.max_body_text))
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

    async def _repository(self, req: _Request, rest: list[str], path: str) -> tuple[int, bytes, str, list]:
        from .serve import _load_override, _only_keys, _peer

        known = rest == ["index"] or (len(rest) == 3 and rest[0] == "models" and rest[2] in ("load", "unload"))
        if not known:
            raise ProtocolError(f"unknown path {_peer(path)}", 404)
        if req.method != "POST":
            raise ProtocolError(f"method {req.method} is not allowed on {_peer(path)}; use POST", 405)
        doc = await self._small_json(req)
        table = self.app.table
        if rest == ["index"]:
            ready = _only_keys(doc, {"ready": bool}, "the index request").get("ready", False)
            return _ok(table.index(ready_only=bool(ready)))
        self.app.check_control()
        name, action = rest[1], rest[2]
        params = _only_keys(doc, {"parameters": dict}, f"the {action} request").get("parameters") or {}

        def control() -> None:
            try:
                if action == "load":
                    table.load(name, _load_override(params, name))
                else:
                    _only_keys(params, {"unload_dependents": bool}, "the unload parameters")
                    table.unload(name)
            except NotFound as exc:
                raise ProtocolError(str(exc), 404) from None
            except ServeError as exc:
                raise ProtocolError(" ".join(str(exc).split()), 400) from None
            except ProtocolError:
                raise
            except Exception as exc:  # RuntimeUserError and kin: the load's own reason
                raise ProtocolError(" ".join(str(exc).split()), 400) from None

        await self._run(control)
        return _ok({})

    async def _shared_memory(self, req: _Request, rest: list[str], path: str) -> tuple[int, bytes, str, list]:
        from .serve import _only_keys, _peer

        app = self.app
        kind, rest = rest[0], rest[1:]
        region = rest[1] if len(rest) == 3 and rest[0] == "region" else None
        action = rest[-1] if rest else ""
        if not (rest in (["status"], ["unregister"]) or (region is not None and action in
                                                          ("status", "register", "unregister"))):
            raise ProtocolError(f"unknown path {_peer(path)}", 404)
        want = "GET" if action == "status" else "POST"
        if req.method != want and not (want == "GET" and req.method == "HEAD"):
            raise ProtocolError(f"method {req.method} is not allowed on {_peer(path)}; use {want}", 405)
        doc = await self._small_json(req) if want == "POST" else {}
        app.shm.check_peer(req.peer)
        registry: Any = app.shm if kind == "systemsharedmemory" else app.cuda_shm
        if action == "status":
            return _ok(registry.status(region))
        if action == "register":
            if kind == "systemsharedmemory":
                registry.register(region or "", doc)
            else:
                await self._run(registry.register_json, region or "", doc)
        else:
            _only_keys(doc, {}, "the unregister request")
            registry.unregister(region)
        return _ok({})


def _json(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def _ok(doc: Any) -> tuple[int, bytes, str, list]:
    return 200, _json(doc), "application/json", []


class AsgiServer:
    """uvicorn (httptools parser) serving AsgiApp from a background thread with its own event loop."""

    def __init__(self, app: Any, host: str, port: int, max_connections: int, reuse_port: bool = False):
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
                                headers=[("server", SERVER)])
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
