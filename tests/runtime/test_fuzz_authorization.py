"""The Authorization header, fuzzed: whatever a peer sends there is the key, or "no key" (401), never a crash.

What an attacker notices: nothing. Any string or bytes in the header, of any length, gets the same
401 (or, with the right key in any letter case of `Bearer`, the answer); the server never answers
500 for it and keeps serving. Policy.check is exercised directly (every category, thousands of
values) and through a real server on loopback (raw bytes in the header, both HTTP transports).
"""

from __future__ import annotations

import socket

import models
import pytest
import rawhttp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from keyring import KEYS, USER_KEY

from ngcx_runtime.access import Call, Category, Policy, Unauthorized
from ngcx_runtime.keys import MAX_TOKEN, bearer_token

TOKEN_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~+/"
POLICY = Policy(access=KEYS)
GUARDED = [c for c in Category if c is not Category.HEALTH] + [None]


def schemes() -> st.SearchStrategy[str]:
    return st.tuples(*[st.sampled_from([c.lower(), c.upper()]) for c in "bearer"]).map("".join)


@settings(max_examples=3000, deadline=None)
@given(st.one_of(st.text(max_size=2000), st.binary(max_size=600), st.none(), st.integers()))
def test_the_parser_never_raises_and_returns_only_a_token(value):
    token = bearer_token(value)
    assert token is None or (0 < len(token.rstrip("=")) <= MAX_TOKEN and set(token.rstrip("=")) <= set(TOKEN_CHARS))


@settings(max_examples=2000, deadline=None)
@given(value=st.text(max_size=700), category=st.sampled_from(GUARDED), control=st.booleans())
def test_any_header_value_is_the_401_path_unless_it_is_the_key(value, category, control):
    c = Call(category, "127.0.0.1", {"authorization": value}, control and category is Category.MODEL_REPOSITORY)
    try:
        POLICY.check(c)
    except Unauthorized as exc:
        assert exc.status == 401 and USER_KEY not in exc.message
        return
    assert bearer_token(value) is not None, "let in without a well-formed key"


@settings(max_examples=500, deadline=None)
@given(scheme=schemes(), spaces=st.integers(1, 5), outer=st.sampled_from(["", " ", "\t", " \t "]))
def test_the_right_key_passes_with_any_scheme_case_and_spacing(scheme, spaces, outer):
    value = f"{outer}{scheme}{' ' * spaces}{USER_KEY}{outer}"
    for category in GUARDED:
        POLICY.check(Call(category, "127.0.0.1", {"authorization": value}))


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="ascii", exclude_characters="\r\n\t "), min_size=1, max_size=80))
def test_a_near_miss_of_the_key_is_refused(junk):
    for value in (f"Bearer {USER_KEY}{junk}", f"Bearer {junk}{USER_KEY}", f"{junk}Bearer {USER_KEY}"):
        if bearer_token(value) == USER_KEY:
            continue            # junk that is only padding or spaces around the key
        with pytest.raises(Unauthorized):
            POLICY.check(Call(Category.INFERENCE, "127.0.0.1", {"authorization": value}))


# -- through a real server: raw bytes in the header --

@pytest.fixture(scope="module", params=["stdlib", "uvicorn"])
def server(request, tmp_path_factory):
    pytest.importorskip("onnxruntime")
    if request.param == "uvicorn":
        pytest.importorskip("uvicorn")
    from ngcx_runtime.plan import load
    from ngcx_runtime.serve import start_server

    path = models.mlp(tmp_path_factory.mktemp("fuzz-auth") / "mlp.onnx")
    handle = start_server(load(path, backend="onnxruntime"), "127.0.0.1", 0, name="mlp", access=KEYS,
                          transport=request.param)
    handle.transport = request.param
    yield handle
    handle.stop()


def _status(port: int, raw: bytes) -> int | None:
    ex = rawhttp.exchange(port, raw, idle=2.0, total=10.0, expect=1)
    return ex.responses[0].status if ex.responses else None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=st.binary(max_size=300).filter(lambda b: b"\r" not in b and b"\n" not in b))
def test_raw_header_bytes_get_the_401_and_the_server_keeps_serving(server, value):
    head = b"GET /v2/models/mlp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: " + value + b"\r\n\r\n"
    status = _status(server.port, head)
    if server.transport == "uvicorn":
        assert status in (400, 401), status        # httptools refuses some bytes in a header as a bad request
    else:                                          # a NUL in a value is a 400 (RFC 9110 §5.5), anything else no key
        assert status == (400 if b"\x00" in value else 401), status
    good = rawhttp.request("GET", "/v2/models/mlp", headers={"Authorization": f"Bearer {USER_KEY}"})
    assert _status(server.port, good) == 200


def test_two_authorization_headers_are_no_key(server):
    raw = (b"GET /v2/models/mlp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + USER_KEY.encode()
           + b"\r\nAuthorization: Bearer " + USER_KEY.encode() + b"\r\n\r\n")
    assert _status(server.port, raw) == 401
    huge = b"GET /v2/models/mlp HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + b"a" * 60_000 + b"\r\n\r\n"
    assert _status(server.port, huge) in (400, 401, 431)
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(rawhttp.request("GET", "/v2/health/live"))
        assert rawhttp.read_responses(s, idle=1.0, expect=1).responses[0].status == 200
