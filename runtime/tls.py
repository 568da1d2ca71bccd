"""TLS for every port of the server: `--tls-cert PATH --tls-key PATH`.

Why the standard library's ssl: the runtime ships in images whose only Python dependency is
numpy; ssl.SSLContext(PROTOCOL_TLS_SERVER) with TLS 1.2 as the minimum is what nginx or Triton
would offer, and the same context serves the stdlib HTTP transport (each accepted socket is
wrapped here), uvicorn (its config gets this context) and the metrics port; gRPC takes the same
two PEM files through grpc.ssl_server_credentials (grpc_service.py).

Why the handshake is here and bounded (handshake): it runs on the connection's own thread, never
on the accept loop, so a client that connects and says nothing, a plain-HTTP client on the TLS
port, or a failed handshake costs that one thread at most HANDSHAKE_TIMEOUT_S, and the server
keeps serving. A plain-HTTP client gets no answer: the connection is closed.

A missing file, an unreadable one, a bad PEM, an encrypted key or a key that does not match the
certificate is one RuntimeUserError line at start (exit 2). The certificate is not re-read while
the server runs (restart to rotate it).
"""

from __future__ import annotations

import contextlib
import hashlib
import select
import socket
import ssl
import time
from pathlib import Path
from typing import Any

from .errors import RuntimeUserError

HANDSHAKE_TIMEOUT_S = 10.0


def server_context(cert: str | Path, key: str | Path) -> ssl.SSLContext:
    """A server context for the PEM certificate (chain) and its unencrypted PEM private key; TLS 1.2 or later."""
    for flag, path in (("--tls-cert", cert), ("--tls-key", key)):
        try:
            Path(path).read_bytes()
        except OSError as exc:
            raise RuntimeUserError(f"{flag} {path}: cannot read it ({exc.strerror or exc}); give a PEM file") from None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert), str(key), password=lambda: b"")
    except (ssl.SSLError, ValueError) as exc:
        why = " ".join(str(getattr(exc, "reason", None) or exc).split())[:120]
        raise RuntimeUserError(f"--tls-cert {cert} / --tls-key {key}: not a PEM certificate with its unencrypted "
                               f"PEM private key ({why}); e.g. openssl req -x509 -newkey rsa:2048 -nodes -days 365 "
                               "-subj /CN=HOST -keyout key.pem -out cert.pem") from None
    return ctx


def fingerprint(cert: str | Path) -> str:
    """The SHA-256 fingerprint of the first certificate of a PEM file (AB:CD:...), as clients pin it."""
    der = ssl.PEM_cert_to_DER_cert(Path(cert).read_text(encoding="ascii", errors="replace"))
    return ":".join(f"{b:02X}" for b in hashlib.sha256(der).digest())


def handshake(ctx: ssl.SSLContext, sock: socket.socket, timeout: float = HANDSHAKE_TIMEOUT_S) -> ssl.SSLSocket | None:
    """The accepted `sock` as a TLS socket once the handshake is done, within `timeout` seconds in all;
    None (the socket closed) when it fails, stalls or is not TLS. The TLS socket is blocking again."""
    try:
        conn = ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            sock.close()
        return None
    deadline = time.monotonic() + timeout
    try:
        conn.setblocking(False)
        while True:
            try:
                conn.do_handshake()
                break
            except ssl.SSLWantReadError:
                wait: tuple[list[Any], list[Any]] = ([conn], [])
            except ssl.SSLWantWriteError:
                wait = ([], [conn])
            left = deadline - time.monotonic()
            if left <= 0 or not any(select.select(*wait, [], left)[:2]):
                raise TimeoutError("the TLS handshake did not finish in time")
        conn.setblocking(True)
        return conn
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            conn.close()
        return None


def close(conn: socket.socket) -> None:
    """End a served TLS connection: its write side first (the peer reads to EOF), then the socket."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
    with contextlib.suppress(OSError):
        conn.close()


class TlsServerMixin:
    """For a socketserver server: with `tls` set, each connection is handshaken on its own thread
    (finish_request) before the request handler sees it."""

    tls: ssl.SSLContext | None = None

    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is None:
            super().finish_request(request, client_address)  # type: ignore[misc]
            return
        conn = handshake(self.tls, request, HANDSHAKE_TIMEOUT_S)
        if conn is None:
            return
        try:
            self.handshaken(request, conn)
            super().finish_request(conn, client_address)  # type: ignore[misc]
        finally:
            close(conn)

    def handshaken(self, accepted: Any, conn: ssl.SSLSocket) -> None:
        """The TLS socket `conn` took `accepted` over (a hook for connection bookkeeping)."""
