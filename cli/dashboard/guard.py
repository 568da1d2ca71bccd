"""Who may talk to the dashboard: the token holder, from a page this dashboard served (CSRF), on a known host.

Jupyter's model (issue 23): a random token in the URL `ngcx dashboard` prints; the first visit trades it for
an HttpOnly, SameSite=Strict cookie named after the port (two dashboards on one machine keep apart) and is
redirected to the same URL without the token, so it leaves the address bar and the history. Every request
needs the token (cookie, or `Authorization: Bearer` for scripts), on loopback too: another local user, or a
web page the user visits, must not read deployments or destroy them. A state-changing request (POST) also
needs the CSRF token the pages carry (derived from the token: nothing to store) and, when the browser sends
one, an Origin of this dashboard. On a loopback bind the Host header must name loopback (DNS rebinding).

A pure ASGI middleware, not starlette's BaseHTTPMiddleware: that one buffers and breaks streaming responses,
and the event streams (events.py) are streaming responses.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from typing import Any
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, RedirectResponse, Response

REFUSED = "this dashboard needs its token: open the URL that `ngcx dashboard` printed"


def csrf_of(token: str) -> str:
    return hmac.new(token.encode(), b"ngcx-dashboard-csrf", hashlib.sha256).hexdigest()


def cookie_name(port: int) -> str:
    return f"ngcx_dashboard_{port}"


def allowed_hosts(host: str, port: int) -> set[str] | None:
    """The Host headers a loopback bind answers; None (any) for a wider bind, where the token alone guards."""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        return None
    return {f"{name}:{port}" for name in ("127.0.0.1", "localhost", "[::1]", host)}


class Guard:
    """Wraps the app: refuses what lacks the token (401), a foreign Host (403), a POST without CSRF (403)."""

    def __init__(self, app: Any, token: str, port: int, hosts: set[str] | None) -> None:
        self.app, self.token, self.port, self.hosts = app, token, port, hosts
        self.csrf = csrf_of(token)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        response = self._check(scope)
        if response is not None:
            return await response(scope, receive, send)
        await self.app(scope, receive, send)

    def _check(self, scope: dict) -> Response | None:
        headers = Headers(scope=scope)
        if self.hosts is not None and headers.get("host", "") not in self.hosts:
            return PlainTextResponse("refused: this dashboard answers on loopback only (Host header)\n", 403)
        query = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        if "token" in query:
            if not self._same(query["token"]):
                return PlainTextResponse(f"refused: wrong token; {REFUSED}\n", 401)
            return self._trade_for_cookie(scope, query)
        if not (self._same(_cookie(headers, cookie_name(self.port))) or self._same(_bearer(headers))):
            return PlainTextResponse(f"refused: {REFUSED}\n", 401)
        if scope["method"] not in ("GET", "HEAD") and not self._csrf_ok(headers):
            return PlainTextResponse("refused: a change must come from a page of this dashboard (CSRF)\n", 403)
        return None

    def _same(self, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self.token.encode())

    def _csrf_ok(self, headers: Headers) -> bool:
        origin = headers.get("origin")
        if origin and origin.split("://", 1)[-1] != headers.get("host"):
            return False
        return hmac.compare_digest(headers.get("x-ngcx-csrf", "").encode(), self.csrf.encode())

    def _trade_for_cookie(self, scope: dict, query: dict[str, str]) -> Response:
        rest = urlencode({k: v for k, v in query.items() if k != "token"})
        response = RedirectResponse(scope["path"] + (f"?{rest}" if rest else ""), status_code=303)
        response.set_cookie(cookie_name(self.port), self.token, httponly=True, samesite="strict", path="/",
                            secure=scope.get("scheme") == "https")
        return response


def _cookie(headers: Headers, name: str) -> str | None:
    for part in headers.get("cookie", "").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return None


def _bearer(headers: Headers) -> str | None:
    scheme, _, value = headers.get("authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None
