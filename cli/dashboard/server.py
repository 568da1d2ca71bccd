"""`ngcx dashboard`'s listening socket and server: bind first, print the URL with its token, serve with uvicorn.

Why the socket is bound here and handed to uvicorn: a port in use (a second dashboard) is then one clear line
before anything starts, and `--port 0` gets a free port whose URL is printed exactly. uvicorn's access log is
off: the first request's query string carries the token, and a token must never reach a log line.
"""

from __future__ import annotations

import errno
import secrets
import socket
import sys
import webbrowser

from ..core.errors import UserError


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, or one line saying why not (in use, not an address of this machine)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"port {port} on {host} is in use (another ngcx dashboard?)",
                            hint=f"open the running one, or pick another port: ngcx dashboard --port {port + 1}")\
                from None
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror or exc}",
                        hint="--host takes an address of this machine, e.g. 127.0.0.1 or 0.0.0.0") from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def url_of(host: str, port: int, token: str) -> str:
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    shown = f"[{shown}]" if ":" in shown else shown
    return f"http://{shown}:{port}/?token={token}"


def serve(host: str, port: int, open_browser: bool, interval: float) -> None:
    """Serve until Ctrl-C. The state store is opened (and migrated) once first, as every command does; from
    then on it is only read (state/db.py reader())."""
    import uvicorn

    from ..deploy import store
    from ..state import db
    from .app import Context, create
    from .guard import allowed_hosts
    from .scrape import Scrapers

    db.check()
    store.owner_id()      # the one write: the store's owner id, which the orphan search (deploy/gc.py) reads
    sock = bind(host, port)
    port = sock.getsockname()[1]
    token = secrets.token_urlsafe(24)
    ctx = Context(token=token, scrapers=Scrapers(interval=interval))
    app = create(ctx, port, allowed_hosts(host, port))
    url = url_of(host, port, token)
    print(url, flush=True)
    print(f"ngcx: dashboard on {host}:{port}; the token in the URL is needed on every request; Ctrl-C stops it",
          file=sys.stderr, flush=True)
    if open_browser:
        webbrowser.open(url)
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=2)
    with db.reader():     # from here on the store is only read (db.reader says why)
        uvicorn.Server(config).run(sockets=[sock])
