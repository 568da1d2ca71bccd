"""Coverage-guided fuzzing of what `ngcx-runtime serve` does with a request's bytes (issue 8, item 2).

Why atheris next to hypothesis: libFuzzer mutates toward new branches of framing.py and
protocol.py, which finds inputs no hand-written strategy thinks of. One input is one raw
request: the head goes through http.client.parse_headers (as the server's stdlib handler does),
framing.request_framing and read_chunked / Content-Length, then the body through parse_header
and parse_infer_request (JSON and binary tensors) against two small models. Anything but
ProtocolError / ConnectionError (what the server turns into a 4xx or a closed connection) is a
crash: libFuzzer prints it and exits non-zero.

Run: python tests/runtime/fuzz_atheris.py -runs=20000 [-max_total_time=20] [CORPUS_DIR ...]
(test_fuzz_http.py runs it bounded).
"""

from __future__ import annotations

import http.client
import io
import json  # noqa: F401 - imported before instrumentation so the stdlib stays uninstrumented
import sys

import atheris
import numpy  # noqa: F401 - not instrumented: slow and not ours

with atheris.instrument_imports(include=["ngcx_runtime"]):
    from ngcx_runtime.engine import TensorSpec
    from ngcx_runtime.framing import read_chunked, request_framing, strict_int
    from ngcx_runtime.protocol import ProtocolError, build_response, parse_header, parse_infer_request

LIMIT = 64 * 1024
MODELS = [
    ([TensorSpec("x", "FP32", (-1, 32))], [TensorSpec("y", "FP32", (-1, 10))], True),
    ([TensorSpec("a", "INT64", (-1, -1)), TensorSpec("b", "FP16", (2,))], [TensorSpec("c", "UINT8", (-1,))], False),
]


def body_of(raw: bytes) -> tuple[http.client.HTTPMessage, bytes]:
    """Split a raw request into parsed headers and its framed body (as the server frames it)."""
    head, _, rest = raw.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")[1:]                       # the request line is the stdlib's business
    try:
        headers = http.client.parse_headers(io.BytesIO(b"\r\n".join(lines) + b"\r\n\r\n"))
    except http.client.HTTPException:
        raise ProtocolError("header section refused by http.client") from None
    framing = request_framing(headers)
    if framing.chunked:
        return headers, read_chunked(io.BytesIO(rest), LIMIT, "64 KB")
    if framing.length > LIMIT:
        raise ProtocolError("over the limit", 413)
    if len(rest) < framing.length:
        raise ConnectionError("the body ended early")
    return headers, rest[:framing.length]


def one_input(raw: bytes) -> None:
    headers, body = body_of(raw)
    hlen_raw = headers.get("Inference-Header-Content-Length")
    binary = None
    if hlen_raw is not None:
        hlen = strict_int(hlen_raw, "Inference-Header-Content-Length")
        if not 0 < hlen <= len(body):
            raise ProtocolError("header length outside the body")
        body, binary = body[:hlen], memoryview(body)[hlen:]
    doc = parse_header(body)
    for inputs, outputs, batchable in MODELS:
        try:
            req = parse_infer_request(doc, binary, inputs, outputs, "fuzz", batchable)
        except ProtocolError as exc:
            check(exc)
            continue
        results = {s.name: numpy.zeros([max(d, 1) for d in s.shape], s.numpy_dtype) for s in outputs}
        build_response("fuzz", "1", req, results)


def check(exc: ProtocolError) -> None:
    """What the client reads is one bounded line with a 4xx status."""
    if not 400 <= exc.status < 600 or "\n" in exc.message or len(exc.message) > 600:
        raise AssertionError(f"bad error: {exc.status} {exc.message[:300]!r}")
    if exc.status >= 500 and exc.status != 501:
        raise AssertionError(f"a peer's bytes made a {exc.status}: {exc.message[:300]!r}")


def fuzz_one(data: bytes) -> None:
    try:
        one_input(data)
    except ProtocolError as exc:
        check(exc)
    except ConnectionError:
        pass


def main() -> None:
    atheris.Setup(sys.argv, fuzz_one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
