"""The HTTP/1.1 transport: connections, framing and body reading for the v2 routes (routes.py).

Why this shape: tritonclient and curl must work unchanged (runtime.md §8), so the server speaks
JSON tensors AND Triton's binary tensor extension (tritonclient's default both ways), gzip /
deflate bodies, and answers every bad request with {"error": "..."} instead of dying. It is
stdlib only (ThreadingHTTPServer, HTTP/1.1 keep-alive) so the image stays slim; large bodies
are read with readinto into a per-connection buffer that is reused across keep-alive requests
and become numpy views without copies.

The HTTP transport, decided on evidence (issue 12, item 7; bench/results/http-transport/): this
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

What is the transport's and not the routes': framing (framing.py: Content-Length, chunked,
ambiguous framings refused and closed), 413 for a body over --max-body-mb (also answered to
`Expect: 100-continue`, before the upload), a body nobody reads drained or lingered over (never a
reset under the answer), one thread per connection up to --max-connections (a connection beyond
it gets a 503 at once, then is closed), `Connection: close` while draining, and response
compression. The routes get a resolved path and a parsed body and hand back a Reply. Who may
call a route is access.route_call's answer, asked before any body is read (also before a `100
Continue` invites one); with --tls-cert each accepted connection's TLS handshake runs on its own
thread, bounded in time (tls.py), and counts against --max-connections.
"""

from __future__ import annotations

import contextlib
import json
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from . import __version__, access, routes
from .access import Call
from .codings import compress, response_coding, too_large
from .framing import Framing, FramingError, read_chunked, request_framing
from .headers import read_headers
from .protocol import ProtocolError, peer_text
from .routes import SERVER_NAME, App
from .tls import TlsServerMixin

SMALL_WRITE = 64 * 1024          # responses below this go out in one send
DISCARD_FACTOR = 16              # after a refusal, up to this multiple of the limit is read and dropped
LINGER_IDLE_S = 1.0              # ... while the client keeps sending at least every second
LINGER_MAX_S = 10.0              # ... and for at most this long
SOCKET_TIMEOUT_S = 120.0         # a client stalled mid-body this long loses its connection
_date: tuple[int, str] = (0, "")  # (second, its HTTP date): one formatdate a second, swapped whole (no lock)


class HttpServer(TlsServerMixin, ThreadingHTTPServer):
    """With `tls` set (--tls-cert), each connection's TLS handshake runs on its own thread, bounded in
    time (tls.py), and counts against --max-connections while it runs."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128
    reuse_port = False                 # serve --mps: N processes share the port (SO_REUSEPORT)
    app: App

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
            if self.tls is None:                        # a TLS client could not read a plain answer
                _refuse_busy(request, app.max_connections)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            with app.cond:
                app.connections.discard(request)
            raise

    def finish_request(self, request: Any, client_address: Any) -> None:
        """The connection's thread: (the TLS handshake, then) its requests. With TLS the accepted socket
        is counted until the handshake ends, then the TLS socket that took it over (HttpHandler.setup)."""
        try:
            super().finish_request(request, client_address)
        finally:
            if self.tls is not None:
                self.handshaken(request, None)

    def handshaken(self, accepted: Any, conn: Any) -> None:
        with self.app.cond:
            self.app.connections.discard(accepted)
            self.app.cond.notify_all()


def _refuse_busy(sock: socket.socket, limit: int) -> None:
    body = json.dumps({"error": f"the server has {limit} connections open (--max-connections); "
                                "retry shortly or against another replica"}).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
            f"\r\nRetry-After: 1\r\nConnection: close\r\nServer: {SERVER_NAME}/{__version__}\r\n\r\n")
    with contextlib.suppress(OSError):
        sock.settimeout(1.0)
        sock.sendall(head.encode() + body)


class HttpHandler(BaseHTTPRequestHandler):
    """One connection's requests, answered by routes.py; every failure becomes {"error": msg} with a 4xx/5xx status."""

    protocol_version = "HTTP/1.1"
    server_version = f"{SERVER_NAME}/{__version__}"
    timeout = SOCKET_TIMEOUT_S
    server: HttpServer

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

    def parse_request(self) -> bool:
        """The stdlib's parse_request (Python 3.11, http/server.py), with the header block read by headers.py
        instead of the email package (its docstring says why); errors answer in the v2 JSON format (send_error).
        True when the request line and headers are good, else the error has been sent."""
        self.command = None                                    # set in case of an error on the first line
        self.request_version = self.default_request_version
        self.close_connection = True
        self.requestline = requestline = str(self.raw_requestline, "iso-8859-1").rstrip("\r\n")
        words = requestline.split()
        if not words:
            return False
        if len(words) >= 3 and not self._request_version(words[-1]):
            return False
        if not 2 <= len(words) <= 3 or (len(words) == 2 and words[0] != "GET"):
            self.send_error(400, f"bad request line {requestline[:80]!r}")
            return False
        self.command, self.path = words[0], words[1]
        if self.path.startswith("//"):                         # gh-87389: no open redirect through //host/path
            self.path = "/" + self.path.lstrip("/")
        try:
            self.headers = read_headers(self.rfile)
        except ProtocolError as exc:
            self.send_error(exc.status, exc.message)
            return False
        connection = (self.headers.get("Connection") or "").lower()
        if connection == "close":
            self.close_connection = True
        elif connection == "keep-alive":
            self.close_connection = False
        expect = (self.headers.get("Expect") or "").lower()
        if expect == "100-continue" and self.request_version >= "HTTP/1.1":
            return self.handle_expect_100()
        return True

    def _request_version(self, version: str) -> bool:
        """HTTP/MAJOR.MINOR (RFC 9112 §2.3): 1.1 and later keep the connection open; 2.0 and later get a 505."""
        numbers = version.removeprefix("HTTP/").split(".")
        if not version.startswith("HTTP/") or len(numbers) != 2 or not all(
                n.isdigit() and n.isascii() and len(n) <= 10 for n in numbers):
            self.send_error(400, f"bad request version {version[:40]!r}")
            return False
        major_minor = int(numbers[0]), int(numbers[1])
        if major_minor >= (2, 0):
            self.send_error(505, f"HTTP version {version[:40]} is not supported; use HTTP/1.1")
            return False
        self.close_connection = major_minor < (1, 1)
        self.request_version = version
        return True

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The Date header, formatted once a second (the stdlib's email.utils.formatdate: 8 us per answer here)."""
        global _date
        if timestamp is not None:
            return super().date_time_string(timestamp)
        now = int(time.time())
        if _date[0] != now:
            _date = (now, super().date_time_string(now))
        return _date[1]

    def version_string(self) -> str:
        return self.server_version          # without the stdlib's Python version

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        if self.server.app.verbose:
            sys.stderr.write(f"serve: {self.address_string()} {format % args}\n")

    # -- methods (the stdlib calls do_<METHOD>; the router answers 405 where one does not apply) --
    def do_GET(self) -> None:
        self._dispatch(self.command)

    do_POST = do_HEAD = do_PUT = do_DELETE = do_PATCH = do_GET

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The stdlib calls this for unparsable request lines and unknown methods: keep the v2 format."""
        self.close_connection = True
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            self.request_version = self.protocol_version   # garbage request line: still send a status line
        text = peer_text(message or explain or self.responses.get(code, ("error",))[0], 300)
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
        try:            # a call the policy refuses (401 without a key) is not invited to upload its body
            access.route_call(app.policy, self.command, urlsplit(self.path).path, self.client_address[0],
                              self.headers)
        except ProtocolError as exc:
            self.close_connection = True
            self._error(exc.status, exc.message, exc.headers)
            return False
        if not framing.chunked and framing.length > app.max_body:
            self.close_connection = True
            self._error(413, too_large(framing.length, app.max_body_text))
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
            self._error(exc.status, exc.message, exc.headers)
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
        """Resolve the route and ask the access policy (access.route_call: before any body is read),
        read the body the route takes, answer (routes.py)."""
        app = self.server.app
        route, call = access.route_call(app.policy, method, urlsplit(self.path).path, self.client_address[0],
                                        self.headers)
        if route.kind == "infer":
            return self._infer(route, call)
        doc = self._small_json() if route.reads == "json" else (self._drain_body() or {})
        self._send_pieces(*routes.answer(app, route, doc))

    def _small_json(self) -> dict[str, Any]:
        """The optional JSON object body of a repository or shared-memory request ({} when there is none)."""
        framing = self._framing()
        if framing.chunked:
            body = bytes(self._read_chunked())
        else:
            body = bytes(self._read_body(self._checked_length(framing.length)))
        return routes.parse_small_json(body)

    # -- inference --
    def _infer(self, route: access.Route, call: Call) -> None:
        app = self.server.app
        model = routes.infer_model(app, route)
        with routes.counted(model):
            engine = model.engine
            if engine is None or model.closed is not None:
                self._drain_body()
                engine = model.require_engine()
            view = app.shm_view(call)
            req = routes.decode_request(app, model, engine, self._read_infer_body(),
                                        self.headers.get("Content-Encoding"),
                                        self.headers.get("Inference-Header-Content-Length"), view)
            reply = routes.respond(model, req, view)
        self._send_pieces(*reply)

    def _read_infer_body(self) -> memoryview:
        """An inference body: Content-Length or chunked (decoded by routes.decode_request)."""
        framing = self._framing()
        if framing.chunked:
            return self._read_chunked()
        if self.headers.get("Content-Length") is None:
            raise ProtocolError("the inference request has no body (Content-Length missing)")
        return self._read_body(self._checked_length(framing.length))

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
            raise ProtocolError(too_large(length, self.server.app.max_body_text), 413)
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
    def _error(self, status: int, message: str, headers: tuple[tuple[str, str], ...] = ()) -> None:
        try:
            self._send_pieces(*routes.json_reply(status, {"error": message}, headers))
        except OSError:
            self.close_connection = True

    def _send_json(self, status: int, doc: Any) -> None:
        self._send_pieces(*routes.json_reply(status, doc))

    def _send_pieces(self, status: int, pieces: list, header_len: int | None, ctype: str | None = None,
                     extra: tuple[tuple[str, str], ...] = ()) -> None:
        headers = getattr(self, "headers", None)      # absent when the request line was unparsable
        coding = response_coding(headers.get("Accept-Encoding") if headers else None)
        if coding:
            pieces = [compress(pieces, coding)]
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
        for name, value in extra:
            self.send_header(name, value)
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
