"""A real `ngcx dashboard` process on a free loopback port, as the tests (and the browser) talk to it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

START_S = 30.0
URL = re.compile(r"^(http://[^/]+)/\?token=(\S+)$")


class NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):  # noqa: ANN002, ANN003 - urllib's signature
        return None


PLAIN = urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect())


class Dashboard:
    """`ngcx dashboard --port 0` with `env` (NGCX_STATE_DIR, clouds' credentials): its URL, token, and calls."""

    def __init__(self, env: dict[str, str], *args: str, cwd: Path | None = None) -> None:
        self.env = {**os.environ, "NO_PROXY": "*", "no_proxy": "*", **env}
        self.argv = [sys.executable, "-m", "ngcx", "dashboard", "--port", "0", "--interval", "0.5", *args]
        self.cwd = cwd
        self.proc: subprocess.Popen[str] | None = None
        self.base = self.token = ""
        self.stderr = ""

    def __enter__(self) -> Dashboard:
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=self.env, cwd=self.cwd)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()     # the URL is the first line; the process ends it or dies
        found = URL.match(line)
        if not found:
            self.__exit__()
            raise AssertionError(f"no URL from ngcx dashboard: {line!r}; stderr: {self.stderr[-2000:]}")
        self.base, self.token = found.group(1), found.group(2)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.stderr = self.proc.stderr.read() if self.proc.stderr else ""
        assert "Traceback" not in self.stderr, self.stderr[-3000:]

    @property
    def port(self) -> int:
        return int(self.base.rsplit(":", 1)[1])

    @property
    def url(self) -> str:
        return f"{self.base}/?token={self.token}"

    def call(self, path: str, *, method: str = "GET", headers: dict[str, str] | None = None,
             auth: bool = True, timeout: float = 20.0) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of one request; with `auth` it carries the token as a bearer header."""
        all_headers = dict(headers or {})
        if auth:
            all_headers.setdefault("Authorization", f"Bearer {self.token}")
        request = urllib.request.Request(self.base + path, method=method, headers=all_headers,
                                         data=b"" if method == "POST" else None)
        try:
            with PLAIN.open(request, timeout=timeout) as res:
                return res.status, dict(res.headers), res.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()


def until(predicate, timeout: float, every: float = 0.1, what: str = "the condition"):  # noqa: ANN001, ANN201
    """Poll `predicate` until it returns something truthy (returned), or fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(every)
