"""A raw-socket HTTP/1.1 client for the framing, fuzz and load tests of `ngcx-runtime serve`.

Why not requests / http.client: they refuse to send what an attacker sends (a negative
Content-Length, two framings at once, pipelined requests), and they hide whether the server
closed the connection. This one writes bytes as given and reads every response back in order.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> dict:
        return json.loads(self.body)


@dataclass
class Exchange:
    """Everything the server sent back on one connection: responses in order, and whether it
    closed the connection (EOF) before `idle` seconds of silence."""

    responses: list[Response] = field(default_factory=list)
    closed: bool = False
    leftover: bytes = b""


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
            *, length: bool = True) -> bytes:
    """One request's bytes; Content-Length is added unless `length` is False or given in headers."""
    hdrs = {"Host": "127.0.0.1", **(headers or {})}
    if length and not any(k.lower() in ("content-length", "transfer-encoding") for k in hdrs):
        hdrs["Content-Length"] = str(len(body))
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items())
    return head.encode("latin-1") + b"\r\n" + body


def infer_json(model: str, inputs: dict[str, list], shapes: dict[str, list[int]]) -> bytes:
    """A KServe v2 JSON inference body (FP32 inputs)."""
    doc = {"inputs": [{"name": n, "datatype": "FP32", "shape": shapes[n], "data": d} for n, d in inputs.items()]}
    return json.dumps(doc).encode()


def exchange(port: int, raw: bytes, idle: float = 1.0, total: float = 30.0, expect: int | None = None) -> Exchange:
    """Send raw (all at once), then read responses until the server closes or stays idle (or,
    with `expect`, until that many responses arrived)."""
    with socket.create_connection(("127.0.0.1", port), timeout=total) as s:
        s.sendall(raw)
        return read_responses(s, idle, total, expect)


def read_responses(s: socket.socket, idle: float = 1.0, total: float = 30.0, expect: int | None = None) -> Exchange:
    out = Exchange()
    buf = b""
    deadline = time.monotonic() + total
    while time.monotonic() < deadline and (expect is None or len(out.responses) < expect):
        s.settimeout(idle)
        try:
            chunk = s.recv(1 << 16)
        except TimeoutError:
            break
        except ConnectionResetError:
            out.closed = True
            break
        if not chunk:
            out.closed = True
            break
        buf += chunk
        buf = _parse(buf, out.responses)
    out.leftover = _parse(buf, out.responses)
    return out


def _parse(buf: bytes, into: list[Response]) -> bytes:
    """Move every complete response from buf into `into`; return the incomplete rest."""
    while b"\r\n\r\n" in buf:
        head, rest = buf.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
        n = int(headers.get("content-length", "0"))
        if len(rest) < n:
            return buf
        into.append(Response(status, headers, rest[:n]))
        buf = rest[n:]
    return buf
