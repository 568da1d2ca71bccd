"""Test traffic through an emulated balancer's data plane: one request, who answered a batch, a paced load, a
live process.

Shared by the emulators' own tests and the product's balancer tests (tests/deploy), which send their
requests to the address the emulator's `balancer_address()` names. http.client never asks a proxy.
"""

from __future__ import annotations

import http.client
import importlib.util
import ssl
import threading
import time
from collections import Counter
from pathlib import Path
from types import ModuleType


def get(address: tuple[str, int], path: str = "/", timeout: float = 10) -> tuple[int, str]:
    """(status, body) of one GET on a fresh connection."""
    conn = http.client.HTTPConnection(*address, timeout=timeout)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        return reply.status, reply.read().decode()
    finally:
        conn.close()


def spread(address: tuple[str, int], count: int = 24) -> Counter[str]:
    """Who answered `count` requests through the balancer (non-200 answers count as "<status>")."""
    seen: Counter[str] = Counter()
    for _ in range(count):
        status, body = get(address)
        seen[body if status == 200 else f"<{status}>"] += 1
    return seen


def running(pid: int) -> bool:
    """The process exists and is not a zombie (a stopped haproxy must be gone, not merely exited)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def certs() -> ModuleType:
    """tests/runtime/certs.py, loaded by path: tests/runtime is not a package the other test folders import."""
    spec = importlib.util.spec_from_file_location("ngcx_test_certs", Path(__file__).parents[1] / "runtime" / "certs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tls_server_context(folder: Path) -> ssl.SSLContext:
    """A server context with a fresh self-signed certificate in `folder` (cert.pem, key.pem), made by
    tests/runtime/certs.py."""
    cert, key, _fingerprint = certs().self_signed(folder)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def get_tls(address: tuple[str, int], path: str = "/", timeout: float = 10) -> tuple[int, str, bytes]:
    """(status, body, the server's certificate in DER) of one GET over TLS, verifying nothing."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    conn = http.client.HTTPSConnection(*address, timeout=timeout, context=context)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        der = conn.sock.getpeercert(binary_form=True) or b""
        return reply.status, reply.read().decode(), der
    finally:
        conn.close()


class PacedLoad:
    """GETs through a balancer at about `rate` per second on one thread, for at most `limit_s` seconds and
    `limit` requests (every load loop is bounded); every answer but 200, and every error, is a failure."""

    def __init__(self, address: tuple[str, int], rate: float = 2.0, limit_s: float = 90.0, limit: int = 5000) -> None:
        self.address, self.rate, self.limit = address, rate, limit
        self.deadline = time.monotonic() + limit_s
        self.seen: Counter[str] = Counter()
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set() and time.monotonic() < self.deadline and \
                sum(self.seen.values()) + len(self.failures) < self.limit:
            started = time.monotonic()
            try:
                status, body = get(self.address, timeout=10)
                if status == 200:
                    self.seen[body] += 1
                else:
                    self.failures.append(f"{status}: {body[:80]}")
            except OSError as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(max(0.0, 1 / self.rate - (time.monotonic() - started)))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)
