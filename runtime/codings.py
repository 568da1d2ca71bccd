"""HTTP content codings and body limits, for both HTTP transports (transport.py, asgi.py) and the
inference route (routes.py): gzip / deflate request bodies bounded by --max-body-mb, responses
compressed when the client's Accept-Encoding asks for it, and the one 413 line."""

from __future__ import annotations

import zlib

from .protocol import ProtocolError


def too_large(length: int, limit_text: str) -> str:
    return (f"request body of {length} bytes exceeds the limit of {limit_text}; "
            "restart the server with a larger --max-body-mb")


def response_coding(accept: str | None) -> str | None:
    """gzip or deflate when the client's Accept-Encoding allows it (q > 0), else None."""
    allowed = set()
    for item in (accept or "").lower().split(","):
        coding, _, params = item.strip().partition(";")
        q = params.strip().removeprefix("q=") if params.strip().startswith("q=") else "1"
        try:
            if float(q) > 0:
                allowed.add(coding.strip())
        except ValueError:
            continue
    return next((c for c in ("gzip", "deflate") if c in allowed), None)


def decompress(body: memoryview, encoding: str, limit: int, limit_text: str) -> bytes:
    """gzip or deflate (zlib-wrapped, or raw as some clients send), bounded by the body limit."""
    for wbits in ((31,) if encoding == "gzip" else (15, -15)):
        d = zlib.decompressobj(wbits)
        try:
            out = d.decompress(body, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit or d.unconsumed_tail:
            raise ProtocolError(f"the decompressed request body exceeds the limit of {limit_text}; "
                                "restart the server with a larger --max-body-mb", 413)
        if not d.eof:                          # zlib hands back what it has of a cut-off stream
            continue
        return out
    raise ProtocolError(f"the request body is not valid {encoding} data (Content-Encoding: {encoding}); "
                        "it is corrupt or truncated")


def compress(pieces: list, coding: str) -> bytes:
    """Level 1: responses are mostly float tensors that barely compress; speed matters more."""
    c = zlib.compressobj(1, zlib.DEFLATED, 31 if coding == "gzip" else 15)
    return b"".join([*(c.compress(p) for p in pieces), c.flush()])
