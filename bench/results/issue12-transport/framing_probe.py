"""Issue 12, item 7: the framing corner cases of tests/runtime/test_serve_framing.py and
test_fuzz_http.py, sent raw to both transports, with what each one answered.

    .venv/bin/python bench/results/issue12-transport/framing_probe.py > bench/results/issue12-transport/framing.md

Each case is one raw byte string on a fresh connection (tests/runtime/rawhttp.py reads every
response until the server closes or goes idle). "smuggled" counts answers to a request hidden in a
body: any count above the number of requests a strict parser sees is a smuggling finding.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tests" / "runtime"))

import models  # noqa: E402
import rawhttp  # noqa: E402

from ngcx_runtime.plan import load  # noqa: E402
from ngcx_runtime.serve import start_server  # noqa: E402

INFER = "/v2/models/mlp/infer"
HIDDEN = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
GOOD = rawhttp.infer_json("mlp", {"x": [0.5] * 32}, {"x": [1, 32]})


def head(lines: list[str], body: bytes = b"") -> bytes:
    return ("POST " + INFER + " HTTP/1.1\r\nHost: x\r\n" + "".join(f"{h}\r\n" for h in lines) + "\r\n").encode() + body


CASES: list[tuple[str, bytes]] = [
    ("Content-Length: +5", head(["Content-Length: +5"], b"hello")),
    ("Content-Length: 0x10", head(["Content-Length: 0x10"], b"0" * 16)),
    ("two different Content-Lengths", head(["Content-Length: 5", "Content-Length: 6"], b"hello!")),
    ("two equal Content-Lengths", head([f"Content-Length: {len(GOOD)}", f"Content-Length: {len(GOOD)}"], GOOD)),
    ("Transfer-Encoding: xchunked", head(["Transfer-Encoding: xchunked"], b"0\r\n\r\n")),
    ("Transfer-Encoding: chunked, gzip", head(["Transfer-Encoding: chunked, gzip"], b"0\r\n\r\n")),
    ("Transfer-Encoding: gzip, chunked", head(["Transfer-Encoding: gzip, chunked"], b"0\r\n\r\n")),
    ("CL + TE, request hidden after the chunks (CL.TE smuggling)",
     head(["Content-Length: 5", "Transfer-Encoding: chunked"], b"0\r\n\r\n" + HIDDEN)),
    ("TE + CL, request hidden inside the CL (TE.CL smuggling)",
     head(["Transfer-Encoding: chunked", f"Content-Length: {5 + len(HIDDEN)}"], b"0\r\n\r\n" + HIDDEN)),
    ("chunk size 0x5", head(["Transfer-Encoding: chunked"], b"0x5\r\nhello\r\n0\r\n\r\n")),
    ("chunk size -5", head(["Transfer-Encoding: chunked"], b"-5\r\nhello\r\n0\r\n\r\n")),
    ("chunk longer than its size", head(["Transfer-Encoding: chunked"], b"3\r\nhello\r\n0\r\n\r\n")),
    ("bare LF line endings", f"POST {INFER} HTTP/1.1\nHost: x\nContent-Length: {len(GOOD)}\n\n".encode() + GOOD),
    ("body over --max-body-mb declared", head(["Content-Length: 9000000"], b"x" * 1000)),
    ("Expect: 100-continue over the limit", head(["Content-Length: 9000000", "Expect: 100-continue"])),
    ("garbage request line", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n"),
    ("unknown method", b"BREW /v2 HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("a good request, then a pipelined one", head([f"Content-Length: {len(GOOD)}"], GOOD) + HIDDEN),
]


def probe(transport: str) -> dict[str, str]:
    path = models.mlp(Path("/tmp") / "framing_probe_mlp.onnx")
    handle = start_server(load(path, backend="onnxruntime"), "127.0.0.1", 0, name="mlp", max_body_mb=1,
                          max_queue_delay_ms=0, transport=transport)
    out = {}
    try:
        for name, raw in CASES:
            ex = rawhttp.exchange(handle.port, raw, idle=0.5, total=10)
            statuses = [r.status for r in ex.responses]
            first = ex.responses[0].body[:60].decode("latin-1").replace("|", "/").replace("\n", " ") \
                if ex.responses else ""
            out[name] = f"{statuses} {'closed' if ex.closed else 'open'}: {first}"
        ok = rawhttp.exchange(handle.port, head([f"Content-Length: {len(GOOD)}"], GOOD), expect=1)
        out["still serving afterwards"] = str([r.status for r in ok.responses])
    finally:
        handle.stop()
    return out


def main() -> None:
    results = {t: probe(t) for t in ("stdlib", "uvicorn")}
    print("| case | stdlib (hand-written) | uvicorn 0.38 + httptools 0.9 |")
    print("|---|---|---|")
    for name in results["stdlib"]:
        print(f"| {name} | {results['stdlib'][name]} | {results['uvicorn'][name]} |")


if __name__ == "__main__":
    main()
