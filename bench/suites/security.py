"""security: what bearer keys and TLS cost ngcx-runtime serve, at batch 1 on this CPU (issue 20).

The question is whether the access rules cost anything measurable, so the figure is the worst
case for them: the smallest model (tests/runtime/models.py's mlp, microseconds per inference),
batch 1, one keep-alive connection, so per-request overhead is as large a share of each request
as it can be. Four servers run side by side in this process on the same engine: open, keys (a
keys file of two hashes, as during a rotation), TLS (a self-signed EC P-256 certificate, TLS 1.3),
and TLS + keys (what `ngcx deploy` runs on a cloud). One client process (http.client, the same
code for all four; only the URL, the context and the header differ) sends JSON inference
requests for DURATION_S per figure; the four are measured in turn, the order rotated every
round, `repeat` rounds, so a load spike hits each alike. Each row's min / median / max is over the
rounds; the ratios are medians over medians, and the per-round paired ratios are kept in extra.

Beside the throughput, Policy.check alone is timed in this process (no key vs a valid key read
from a keys file), in microseconds per call: the whole cost of the key check without the network.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..core import ROOT, Measurement, Ratio, Stats, SuiteResult, SuiteSkipped

DURATION_S = 2.0             # per figure per round
WARMUP = 200                 # requests per figure before the clock starts
MAX_ROUND_S = 120.0          # one client run is killed past this
KEY = "bench-security-key-0123456789abcdef"
CONFIGS = ("open", "keys", "tls", "tls+keys")
CHECKS = 200_000             # Policy.check calls timed per variant

CLIENT = r"""
import hashlib, http.client, json, ssl, sys, time
host, port, scheme, key, duration, warmup, pin = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], \
    float(sys.argv[5]), int(sys.argv[6]), sys.argv[7]
body = json.dumps({"inputs": [{"name": "x", "shape": [1, 32], "datatype": "FP32", "data": [0.5] * 32}]})
headers = {"Content-Type": "application/json"}
if key != "-":
    headers["Authorization"] = "Bearer " + key
if scheme == "https":
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    conn = http.client.HTTPSConnection(host, port, timeout=30, context=ctx)
    conn.connect()
    assert hashlib.sha256(conn.sock.getpeercert(binary_form=True)).hexdigest() == pin, "not the pinned certificate"
else:
    conn = http.client.HTTPConnection(host, port, timeout=30)
def one():
    conn.request("POST", "/v2/models/mlp/infer", body=body, headers=headers)
    r = conn.getresponse()
    r.read()
    assert r.status == 200, r.status
for _ in range(warmup):
    one()
n, start = 0, time.perf_counter()
while time.perf_counter() - start < duration:
    one()
    n += 1
print(json.dumps({"requests": n, "seconds": time.perf_counter() - start,
                  "tls": conn.sock.version() if scheme == "https" else None}))
"""


def _imports() -> tuple[Any, Any]:
    """tests/runtime's model and certificate builders (as the runtime suite imports models)."""
    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    try:
        import certs
        import cryptography  # noqa: F401
        import models
        import onnxruntime  # noqa: F401
    except ImportError as exc:
        raise SuiteSkipped(f"needs the test extras (onnx, onnxruntime, cryptography): {exc}") from None
    return models, certs


def start_servers(work: Path) -> tuple[dict[str, Any], str]:
    """The four servers on loopback (same engine) and the certificate's SHA-256 pin."""
    from ngcx_runtime.access import AccessConfig
    from ngcx_runtime.keys import sha256_hex
    from ngcx_runtime.plan import load
    from ngcx_runtime.serve import start_server

    models, certs = _imports()
    engine = load(models.mlp(work / "mlp.onnx"), backend="onnxruntime")
    cert, key, pin = certs.self_signed(work / "tls")
    keys_file = work / "keys"
    keys_file.write_text(f"# two keys, as during a rotation\n{sha256_hex('another-key-' + KEY)}\n{sha256_hex(KEY)}\n")
    configs = {"open": AccessConfig(), "keys": AccessConfig(auth_keys_file=keys_file),
               "tls": AccessConfig(tls_cert=cert, tls_key=key),
               "tls+keys": AccessConfig(auth_keys_file=keys_file, tls_cert=cert, tls_key=key)}
    servers: dict[str, Any] = {}
    try:
        for name in CONFIGS:
            servers[name] = start_server(engine, "127.0.0.1", 0, name="mlp", max_queue_delay_ms=0,
                                         access=configs[name], transport="stdlib")
    except BaseException:
        for handle in servers.values():
            handle.stop(drain=False, timeout=1)
        raise
    return servers, pin


def client_run(handle: Any, name: str, pin: str, duration: float = DURATION_S, warmup: int = WARMUP) -> dict:
    """One client process against one server: {"requests", "seconds", "tls"}."""
    argv = [sys.executable, "-c", CLIENT, "127.0.0.1", str(handle.port), "https" if "tls" in name else "http",
            KEY if "keys" in name else "-", str(duration), str(warmup), pin]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=MAX_ROUND_S + duration)
    if proc.returncode != 0:
        raise RuntimeError(f"the client against '{name}' exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
    return json.loads(proc.stdout)


def check_cost(work: Path, calls: int | None = None) -> dict[str, float]:
    """Microseconds per Policy.check of an inference call: open, and with a valid key from a keys file."""
    from ngcx_runtime.access import AccessConfig, Call, Category, Policy

    calls = calls or CHECKS

    keyed = Policy(access=AccessConfig(auth_keys_file=work / "keys"))
    out = {}
    for label, policy, headers in (("open", Policy(), {}),
                                   ("keys", keyed, {"authorization": f"Bearer {KEY}"})):
        call = Call(Category.INFERENCE, "127.0.0.1", headers)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(calls):
                policy.check(call)
            best = min(best, time.perf_counter() - start)
        out[label] = round(best / calls * 1e6, 3)
    return out


def run(result: SuiteResult, work: Path, out: Path, duration: float = DURATION_S, warmup: int = WARMUP) -> None:
    """`repeat` rounds over the four servers (order rotated per round); throughput rows, ratios, check cost."""
    servers, pin = start_servers(work)
    samples: dict[str, list[float]] = {name: [] for name in CONFIGS}
    versions = set()
    try:
        for r in range(result.repeat):
            order = CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)]
            for name in order:
                doc = client_run(servers[name], name, pin, duration, warmup)
                samples[name].append(doc["requests"] / doc["seconds"])
                if doc["tls"]:
                    versions.add(doc["tls"])
        refused = _refused_without_key(servers["keys"])
    finally:
        for handle in servers.values():
            handle.stop(drain=False, timeout=2)
    command = (f"in-process start_server x4 (stdlib transport, mlp, ONNX Runtime CPU) + one http.client process, "
               f"batch 1 JSON, 1 keep-alive connection, {duration:g} s per figure")
    notes = {"open": "no key, plain HTTP (as before issue 20)", "keys": "Authorization: Bearer, keys file of 2 hashes",
             "tls": f"HTTPS ({', '.join(sorted(versions)) or 'TLS'}), EC P-256 self-signed, pinned",
             "tls+keys": "HTTPS and the key: what ngcx deploy runs on a cloud"}
    result.measurements = [Measurement(name=f"{name}, batch 1, 1 connection", tool="ngcx-runtime", unit="inf/s",
                                       better="higher", wall=Stats.of(samples[name]), command=command,
                                       note=notes[name]) for name in CONFIGS]
    by = {name: m for name, m in zip(CONFIGS, result.measurements, strict=True)}
    result.ratios = [_ratio(label, by[num], by[den]) for label, num, den in (
        ("keys / open", "keys", "open"), ("TLS / plain", "tls", "open"), ("TLS + keys / open", "tls+keys", "open"))]
    paired = {label: [round(a / b, 4) for a, b in zip(samples[num], samples[den], strict=True)]
              for label, num, den in (("keys / open", "keys", "open"), ("TLS / plain", "tls", "open"),
                                      ("TLS + keys / open", "tls+keys", "open"))}
    cost = check_cost(work)
    per_request_us = 1e6 / by["open"].wall.median
    result.extra = {"paired_ratios_per_round": paired, "policy_check_us": cost,
                    "open_request_us": round(per_request_us, 1), "unauthenticated_status": refused,
                    "model": "tests/runtime/models.py mlp (32 -> 64 -> 10), ONNX Runtime CPU EP"}
    result.notes = [
        "Throughput (inferences/s, higher is better) of one keep-alive client at batch 1 on the smallest model: "
        "the worst case for per-request overhead; a real model's inference makes the same overhead a smaller share.",
        f"Policy.check alone: {cost['open']:.2f} us per call without keys, {cost['keys']:.2f} us with a valid key "
        f"from a keys file (SHA-256 + compare_digest against every hash), against {per_request_us:.0f} us per open "
        "request here.",
        "A ratio below 1 is the cost; its spread is in paired_ratios_per_round (each round measures all four in "
        "turn), and a difference inside the rows' min..max is this machine's noise.",
    ]


def _refused_without_key(handle: Any) -> int:
    """The keys server's answer to an inference without a key (401 expected): the figure is of a guarded server."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", handle.port, timeout=30)
    conn.request("POST", "/v2/models/mlp/infer", body=b"{}", headers={"Content-Type": "application/json"})
    status = conn.getresponse().status
    conn.close()
    return status


def _ratio(name: str, num: Measurement, den: Measurement) -> Ratio:
    return Ratio(name=name, numerator=num.name, denominator=den.name,
                 wall=round(num.wall.median / den.wall.median, 3), better="higher", unit="inf/s")
