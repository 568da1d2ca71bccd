"""HTTP/1.1 request framing for `ngcx-runtime serve`: where a request body ends (RFC 9112 §6).

Why a module of its own: framing decides where the NEXT request on a keep-alive connection
starts, so any leniency here is request smuggling. The stdlib's http.server leaves body framing
to the handler, and `int()` accepts `-5`, `+5`, `1_0` and ` 5 ` — a negative Content-Length once
made the HTTP server (then in serve.py, now transport.py) answer a previous request's buffer again
and parse the real body as a new request (issue 8). Everything here is strict, bounded and pure
over (headers, rfile), so the fuzz tests drive it without sockets.

Rules (RFC 9112 §6.1, §6.3, §7.1): Content-Length is ASCII digits only; several Content-Length
values must agree; Transfer-Encoding must be exactly `chunked` (any other coding is refused,
chunked not last is a 400); with both headers, chunked wins and the connection closes after the
answer; chunk sizes are hex digits only, each chunk ends in CRLF, trailers are bounded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from email.message import Message
from typing import BinaryIO

from .protocol import ProtocolError

_DIGITS = re.compile(rb"[0-9]{1,18}")           # 18 digits: far above any body limit, below int64
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")
LINE_MAX = 1024                                   # chunk-size and trailer lines
TRAILERS_MAX = 32


class FramingError(ProtocolError):
    """The request's body boundary is unknowable: answer, then close the connection."""


@dataclass(frozen=True)
class Framing:
    """How the body is delimited: chunked, or `length` bytes; `close` when the answer must end
    the connection (both headers were sent, RFC 9112 §6.3 item 3)."""

    chunked: bool
    length: int = 0
    close: bool = False


def strict_int(raw: str, what: str) -> int:
    """A header value that must be plain ASCII digits (no sign, underscore, space or Unicode digit)."""
    value = raw.strip(" \t")
    if not _DIGITS.fullmatch(value.encode("ascii", "replace")):
        raise FramingError(f"{what} {raw[:40]!r} is not a plain decimal number of at most 18 digits")
    return int(value)


def request_framing(headers: Message) -> Framing:
    """Framing from the request headers; FramingError (400 / 501) when it is ambiguous or unsupported."""
    codings = [c.strip().lower() for v in headers.get_all("Transfer-Encoding") or [] for c in v.split(",")]
    lengths = [part for v in headers.get_all("Content-Length") or [] for part in v.split(",")]
    if codings:
        quoted = _brief(", ".join(codings))             # a peer's header: one bounded line in the error
        if codings[-1] != "chunked":
            raise FramingError(f"Transfer-Encoding {quoted} does not end in chunked; the body length is unknown")
        if codings != ["chunked"]:
            raise FramingError(f"Transfer-Encoding {quoted} is not supported; send the body "
                               "chunked (without other codings) or with a Content-Length", 501)
        return Framing(chunked=True, close=bool(lengths))
    values = {strict_int(v, "Content-Length") for v in lengths}
    if len(values) > 1:
        raise FramingError(f"conflicting Content-Length values {_brief(str(sorted(values)))}; send exactly one")
    return Framing(chunked=False, length=values.pop() if values else 0)


def read_chunked(rfile: BinaryIO, limit: int, limit_text: str) -> bytes:
    """The decoded body of a chunked request, at most `limit` bytes (413 past it).

    ConnectionError when the client goes away inside the body.
    """
    parts: list[bytes] = []
    size = 0
    while True:
        n = _chunk_size(_line(rfile, "chunk size line"))
        if n == 0:
            _skip_trailers(rfile)
            return b"".join(parts)
        size += n
        if size > limit:
            raise ProtocolError(f"chunked request body exceeds the limit of {limit_text}; "
                                "restart the server with a larger --max-body-mb", 413)
        chunk = rfile.read(n)
        if len(chunk) != n:
            raise ConnectionError("client closed the connection inside a chunk")
        parts.append(chunk)
        if _line(rfile, "chunk terminator") not in (b"\r\n", b"\n"):
            raise FramingError(f"chunk of {n} bytes is not followed by CRLF; the chunk size is wrong")


def _brief(text: str, limit: int = 60) -> str:
    """repr() cut to limit: escapes control characters, so the error stays one line."""
    quoted = repr(text)
    return quoted if len(quoted) <= limit else quoted[:limit] + "..."


def _line(rfile: BinaryIO, what: str) -> bytes:
    line = rfile.readline(LINE_MAX + 1)
    if not line:
        raise ConnectionError(f"client closed the connection before the {what}")
    if len(line) > LINE_MAX or not line.endswith(b"\n"):
        raise FramingError(f"{what} longer than {LINE_MAX} bytes in a chunked body")
    return line


def _chunk_size(line: bytes) -> int:
    """`1a3;ext=x\\r\\n` -> 0x1a3; extensions are ignored, anything else in the size is a 400."""
    raw = line.split(b";", 1)[0].strip(b" \t\r\n")
    if not _HEX.fullmatch(raw):
        raise FramingError(f"malformed chunk size line {line[:40]!r} in a chunked body")
    return int(raw, 16)


def _skip_trailers(rfile: BinaryIO) -> None:
    for _ in range(TRAILERS_MAX):
        if _line(rfile, "trailer section") in (b"\r\n", b"\n"):
            return
    raise FramingError(f"more than {TRAILERS_MAX} trailer lines after a chunked body")
