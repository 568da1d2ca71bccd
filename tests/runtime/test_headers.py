"""The request header block as ngcx-runtime serve reads it (runtime/headers.py, RFC 9112 §5).

What a client notices: every well-formed header block reads exactly as the stdlib's email-based
parser read it (same names, same values, same repeats), and a malformed one is refused with one
4xx instead of being cut short where the email parser stopped reading.
"""

from __future__ import annotations

import http.client
import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ngcx_runtime.headers import MAX_FIELDS, MAX_LINE, read_headers
from ngcx_runtime.protocol import ProtocolError

TOKEN = st.text(st.sampled_from("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"),
                min_size=1, max_size=20)
# Field values as RFC 9110 §5.5 allows them: visible characters and inner spaces, Latin-1 obs-text included.
VALUE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0xFF, blacklist_characters="\x7f"),
                max_size=40).map(str.strip)


def block(fields: list[tuple[str, str]], end: bytes = b"\r\n") -> bytes:
    return b"".join(f"{k}: {v}".encode("latin-1") + end for k, v in fields) + end


@settings(max_examples=300, deadline=None)
@given(fields=st.lists(st.tuples(TOKEN, VALUE), max_size=12), end=st.sampled_from([b"\r\n", b"\n"]))
def test_a_well_formed_block_reads_as_the_stdlib_read_it(fields, end):
    raw = block(fields, end)
    ours, stdlib = read_headers(io.BytesIO(raw)), http.client.parse_headers(io.BytesIO(raw))
    for name in {k for k, _ in fields} | {"Content-Length", "absent"}:
        assert ours.get_all(name) == stdlib.get_all(name), name
        assert ours.get(name.upper()) == stdlib.get(name.upper()), name
    assert ours.items() == list(stdlib.items())


def test_the_body_after_the_block_stays_unread():
    stream = io.BytesIO(block([("Host", "x"), ("Content-Length", "5")]) + b"hello")
    headers = read_headers(stream)
    assert headers.get("content-length") == "5" and "HOST" in headers and len(headers) == 2
    assert stream.read() == b"hello"


@pytest.mark.parametrize("line", [
    b"no colon here",                    # the email parser ended the block here: the lines after it were lost
    b"Content-Length : 5",               # whitespace before the colon (RFC 9112 §5.1: MUST be a 400)
    b" folded: continuation",            # obs-fold (RFC 9112 §5.2)
    b": no name",
    b"Bad Name: x",
    b"Nul: a\x00b",
    b"Cr: a\rb",
])
def test_a_malformed_line_is_a_400_that_names_it(line):
    raw = b"Host: x\r\n" + line + b"\r\nContent-Length: 5\r\n\r\nhello"
    with pytest.raises(ProtocolError) as err:
        read_headers(io.BytesIO(raw))
    assert err.value.status == 400 and "NAME: VALUE" in err.value.message


def test_past_the_limits_is_a_431():
    many = block([(f"X-{i}", "v") for i in range(MAX_FIELDS + 1)])
    with pytest.raises(ProtocolError) as err:
        read_headers(io.BytesIO(many))
    assert err.value.status == 431
    read_headers(io.BytesIO(block([(f"X-{i}", "v") for i in range(MAX_FIELDS)])))      # exactly the limit: fine
    with pytest.raises(ProtocolError) as err:
        read_headers(io.BytesIO(b"X: " + b"a" * MAX_LINE + b"\r\n\r\n"))
    assert err.value.status == 431


def test_a_refused_line_is_named_by_its_number_and_name_never_its_value():
    raw = b"Host: x\r\nAuthorization: Bearer sk-canary-5e1f\x00\r\n\r\n"
    with pytest.raises(ProtocolError) as err:
        read_headers(io.BytesIO(raw))
    assert "header line 2 (Authorization)" in err.value.message and "canary" not in err.value.message
