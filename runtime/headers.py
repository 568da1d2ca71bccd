"""A request's header block (RFC 9112 §5), read without the email package.

Why by hand: the stdlib's http.server reads the header lines, then hands them to email.parser's
FeedParser, a MIME parser. For the 7 headers of one tritonclient binary request that took 39-88 us
(median 67) against 9-20 us (median 16) here: 7 interleaved timeit runs of 5,000 parses each on the
2-core bench machine (with a test suite running beside it), where ngcx answers ~1,750 small binary
requests a second (BENCHMARKS.md#serve-peers), so the email parser was ~10 % of a request's CPU.
End to end, an 8-client binary MLP load there went from 1,505 to 2,130 req/s with this alone (medians
of 3 interleaved 5 s runs, 4dd02a8 against 33b0072).
On the GPU host it was the largest piece of the HTTP threads' GIL time after reading bodies
(http.client.parse_headers: 6 % of the GIL samples in bench/results/gpu/targets/pyspy_gil_bs1_c64_h100.txt).

Stricter than the email parser where a server must be (RFC 9112 §5.1, §5.2): a line without a
colon, whitespace before the colon, an empty or non-token name, an obsolete folded line, or a CR or
NUL inside a value is a 400. The email parser took such a line as the end of the header block, so
the headers after it (a Content-Length among them) were lost, and a request hidden in the body
was answered as the next one (tests/runtime/test_serve_framing.py
test_a_malformed_header_line_is_a_400_and_closes got [200, 400, 200] with the email parser).
"""

from __future__ import annotations

import re
from typing import BinaryIO

from .protocol import ProtocolError, peer_text

MAX_LINE = 65536          # the stdlib's limits (http.client._MAXLINE, _MAXHEADERS), kept
MAX_FIELDS = 100
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_BAD_IN_VALUE = re.compile(r"[\r\x00]")


class Headers:
    """A request's header fields in order: `get` the first value of a name in any case, `get_all` every value
    (what http.client's HTTPMessage offered the handlers, access.Call.header and framing.request_framing)."""

    __slots__ = ("_fields",)

    def __init__(self, fields: list[tuple[str, str, str]]) -> None:
        self._fields = fields              # (lower-case name, name as sent, value without surrounding OWS)

    def get(self, name: str, default: str | None = None) -> str | None:
        key = name.lower()
        for lower, _, value in self._fields:
            if lower == key:
                return value
        return default

    def get_all(self, name: str, failobj: list[str] | None = None) -> list[str] | None:
        key = name.lower()
        values = [value for lower, _, value in self._fields if lower == key]
        return values or failobj

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def items(self) -> list[tuple[str, str]]:
        return [(sent, value) for _, sent, value in self._fields]

    def __len__(self) -> int:
        return len(self._fields)


def read_headers(rfile: BinaryIO) -> Headers:
    """The header lines up to the empty line; ProtocolError 431 past the limits, 400 for a malformed line."""
    fields: list[tuple[str, str, str]] = []
    while True:
        line = rfile.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise ProtocolError(f"a header line is longer than {MAX_LINE} bytes", 431)
        if line in (b"\r\n", b"\n", b""):
            return Headers(fields)
        if len(fields) == MAX_FIELDS:
            raise ProtocolError(f"the request has more than {MAX_FIELDS} header lines", 431)
        text = line.decode("iso-8859-1").rstrip("\r\n")
        name, colon, value = text.partition(":")
        if not colon or not _TOKEN.fullmatch(name) or _BAD_IN_VALUE.search(value):
            raise ProtocolError(f"{_which(len(fields) + 1, name if colon else '')} is not NAME: VALUE (a token name, "
                                "no space before the colon, no folded lines, no CR or NUL in the value)")
        fields.append((name.lower(), name, value.strip(" \t")))


def _which(number: int, name: str) -> str:
    """The bad line by its number and, when it is a token, its name: never its value, which may be a key
    (Authorization, X-Api-Key) that must not come back in an error or a log line."""
    return f"header line {number} ({peer_text(name, 40)})" if _TOKEN.fullmatch(name) else f"header line {number}"
