"""security: what bearer keys and TLS cost ngcx-runtime serve, at batch 1 on this CPU (issue 20).

The question is whether the access rules cost anything measurable, so the figure is the worst
case for them: the smallest model (tests/runtime/models.py's mlp, microseconds per inference),
batch 1, one keep-alive connection, so per-request overhead is as large a share of each request
as it can be. Five servers run side by side in this process on the same engine: open, a second
open one (the control: what two identical servers differ by here is the noise floor), keys (a
keys file of two hashes, as during a rotation), TLS (a self-signed EC P-256 certificate) and
TLS + keys (what `ngcx deploy` runs on a cloud). One client process per round (http.client, the
same code for all five; only the port, TLS and the header differ) keeps a connection to each and
gives them turns of SLICE_S, CYCLES cycles a round with the order rotated every cycle, so a load
spike hits each alike; every round starts the servers afresh in a rotated order, so no server is
always the first made or warmed. Each row's min / median / max is over the `repeat` rounds; the
ratios are medians over medians, and the per-round paired ratios are kept in extra.

Beside the throughput, Policy.check alone is timed in this process (no key vs a valid key read
from a keys file), in microseconds per call: the whole cost of the key check without the network.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ..core import ROOT, Measurement, Ratio, Stats, SuiteResult, SuiteSkipped

SLICE_S = 0.25               # one target's turn within a cycle
CYCLES = 12                  # cycles per round: each target gets CYCLES * SLICE_S seconds per round
WARMUP = 200                 # requests per target before the clock starts
MAX_ROUND_S = 300.0          # one client process is killed past this
KEY = "bench-security-key-0123456789abcdef"
CONFIGS = ("open", "open (control)", "keys", "tls", "tls+keys")
CHECKS = 200_000             # Policy.check calls timed per variant

CLIENT = r"""
import hashlib, http.client, json, ssl, sys, time
spec = json.loads(sys.argv[1])
body = json.dumps({"inputs": [{"name": "x", "shape": [1, 32], "datatype": "FP32", "data": [0.5] * 32}]})
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
conns, headers, out = {}, {}, {}
for t in spec["targets"]:
    if t["tls"]:
        conn = http.client.HTTPSConnection("127.0.0.1", t["port"], timeout=30, context=ctx)
        conn.connect()
        assert hashlib.sha256(conn.sock.getpeercert(binary_form=True)).hexdigest() == spec["pin"], "not the pin"
    else:
        conn = http.client.HTTPConnection("127.0.0.1", t["port"], timeout=30)
    conns[t["name"]] = conn
    headers[t["name"]] = {"Content-Type": "application/json",
                          **({"Authorization": "Bearer " + t["key"]} if t["key"] else {})}
    out[t["name"]] = {"requests": 0, "seconds": 0.0, "tls": None, "slices": []}
def one(name):
    conn = conns[name]
    conn.request("POST", "/v2/models/mlp/infer", body=body, headers=headers[name])
    r = conn.getresponse()
    r.read()
    assert r.status == 200, (name, r.status)
names = [t["name"] for t in spec["targets"]]
for name in names:
    for _ in range(spec["warmup"]):
        one(name)
    out[name]["tls"] = conns[name].sock.version() if hasattr(conns[name].sock, "version") else None
for cycle in range(spec["cycles"]):
    k = cycle % len(names)
    for name in names[k:] + names[:k]:
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < spec["slice"]:
            one(name)
            n += 1
        took = time.perf_counter() - start
        out[name]["requests"] += n
        out[name]["seconds"] += took
        out[name]["slices"].append(n / took)
print(json.dumps(out))
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


def prepare(work: Path) -> tuple[Any, dict[str, Any], str]:
    """The engine, each server's AccessConfig, and the certificate's SHA-256 pin."""
    from ngcx_runtime.access import AccessConfig
    from ngcx_runtime.keys import sha256_hex
    from ngcx_runtime.plan import load

    models, certs = _imports()
    engine = load(models.mlp(work / "mlp.onnx"), backend="onnxruntime")
    cert, key, pin = certs.self_signed(work / "tls")
    keys_file = work / "keys"
    keys_file.write_text(f"# two keys, as during a rotation\n{sha256_hex('another-key-' + KEY)}\n{sha256_hex(KEY)}\n")
    configs = {"open": AccessConfig(), "open (control)": AccessConfig(), "keys": AccessConfig(auth_keys_file=keys_file),
               "tls": AccessConfig(tls_cert=cert, tls_key=key),
               "tls+keys": AccessConfig(auth_keys_file=keys_file, tls_cert=cert, tls_key=key)}
    return engine, configs, pin


def start_servers(engine: Any, configs: dict[str, Any], order: list[str]) -> dict[str, Any]:
    """One server per config on loopback, started in `order`, all on the same engine."""
    from ngcx_runtime.serve import start_server

    servers: dict[str, Any] = {}
    try:
        for name in order:
            servers[name] = start_server(engine, "127.0.0.1", 0, name="mlp", max_queue_delay_ms=0,
                                         access=configs[name], transport="stdlib")
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def time_checks(servers: dict[str, Any], totals: dict[str, list[float]]) -> None:
    """Time every Policy.check each server makes while it serves (the same wrapper on all five, so the
    timing's own cost is alike): totals[name] = [calls, seconds]."""
    for name, handle in servers.items():
        policy, acc = handle._app.policy, totals.setdefault(name, [0, 0.0])

        def timed(call: Any, _check: Any = policy.check, _acc: list = acc) -> None:
            start = time.perf_counter()
            try:
                _check(call)
            finally:
                _acc[0] += 1
                _acc[1] += time.perf_counter() - start

        policy.check = timed


def stop_servers(servers: dict[str, Any]) -> None:
    for handle in servers.values():
        handle.stop(drain=False, timeout=2)


def client_round(servers: dict[str, Any], pin: str, slice_s: float = SLICE_S, cycles: int = CYCLES,
                 warmup: int = WARMUP) -> dict[str, dict]:
    """One client process, one keep-alive connection to each server (warmed in the servers' order), their
    turns interleaved in slices, the order rotated every cycle: {name: {"requests", "seconds", "tls"}}."""
    spec = {"pin": pin, "slice": slice_s, "cycles": cycles, "warmup": warmup,
            "targets": [{"name": name, "port": handle.port, "tls": "tls" in name,
                         "key": KEY if "keys" in name else None} for name, handle in servers.items()]}
    proc = subprocess.run([sys.executable, "-c", CLIENT, json.dumps(spec)], capture_output=True, text=True,
                          timeout=MAX_ROUND_S + slice_s * cycles * len(CONFIGS))
    if proc.returncode != 0:
        raise RuntimeError(f"the client exited {proc.returncode}: {proc.stderr.strip()[-400:]}")
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


def run(result: SuiteResult, work: Path, out: Path, slice_s: float = SLICE_S, cycles: int = CYCLES,
        warmup: int = WARMUP) -> None:
    """`repeat` rounds, each with fresh servers (order rotated) and one client over them in slices; rows,
    ratios, the check's cost."""
    engine, configs, pin = prepare(work)
    samples: dict[str, list[float]] = {name: [] for name in CONFIGS}
    slices: dict[str, list[float]] = {name: [] for name in CONFIGS}      # every slice's rate, cycle by cycle
    versions = set()
    refused = None
    in_server: dict[str, list[float]] = {}
    for r in range(result.repeat):
        order = list(CONFIGS[r % len(CONFIGS):] + CONFIGS[:r % len(CONFIGS)])
        servers = start_servers(engine, configs, order)
        time_checks(servers, in_server)
        try:
            for name, doc in client_round(servers, pin, slice_s, cycles, warmup).items():
                samples[name].append(doc["requests"] / doc["seconds"])
                slices[name] += doc["slices"]
                if doc["tls"]:
                    versions.add(doc["tls"])
            refused = refused or _refused_without_key(servers["keys"])
        finally:
            stop_servers(servers)
    command = (f"in-process start_server x5 (stdlib transport, mlp, ONNX Runtime CPU) + one http.client process "
               f"per round, batch 1 JSON, 1 keep-alive connection each, {cycles} x {slice_s:g} s slices per server")
    notes = {"open": "no key, plain HTTP (as before issue 20)",
             "open (control)": "a second open server: its ratio to open is this machine's noise floor",
             "keys": "Authorization: Bearer, keys file of 2 hashes",
             "tls": f"HTTPS ({', '.join(sorted(versions)) or 'TLS'}), EC P-256 self-signed, pinned",
             "tls+keys": "HTTPS and the key: what ngcx deploy runs on a cloud"}
    result.measurements = [Measurement(name=f"{name}, batch 1, 1 connection", tool="ngcx-runtime", unit="inf/s",
                                       better="higher", wall=Stats.of(samples[name]), command=command,
                                       note=notes[name]) for name in CONFIGS]
    by = {name: m for name, m in zip(CONFIGS, result.measurements, strict=True)}
    pairs = (("keys / open", "keys", "open"), ("TLS / plain", "tls", "open"),
             ("TLS + keys / open", "tls+keys", "open"), ("control / open (noise floor)", "open (control)", "open"))
    result.ratios = [_ratio(label, by[num], by[den]) for label, num, den in pairs]
    paired = {label: [round(a / b, 4) for a, b in zip(samples[num], samples[den], strict=True)]
              for label, num, den in pairs}
    # within one cycle the five slices are adjacent (about 1 s apart at most): their ratio is the least disturbed
    # by a load that comes and goes; its median and quartiles over every cycle of every round
    per_cycle = {label: _spread([a / b for a, b in zip(slices[num], slices[den], strict=True)])
                 for label, num, den in pairs}
    cost = check_cost(work)
    per_request_us = 1e6 / by["open"].wall.median
    served = {name: round(seconds / calls * 1e6, 2) for name, (calls, seconds) in in_server.items() if calls}
    result.extra = {"paired_ratios_per_round": paired, "paired_ratios_per_cycle": per_cycle, "policy_check_us": cost,
                    "policy_check_us_while_serving": served,
                    "open_request_us": round(per_request_us, 1), "unauthenticated_status": refused,
                    "tls_versions": sorted(versions),
                    "model": "tests/runtime/models.py mlp (32 -> 64 -> 10), ONNX Runtime CPU EP"}
    result.notes = [
        "Throughput (inferences/s, higher is better) of one keep-alive client at batch 1 on the smallest model: "
        "the worst case for per-request overhead; a real model's inference makes the same overhead a smaller share.",
        f"Policy.check alone: {cost['open']:.2f} us per call without keys, {cost['keys']:.2f} us with a valid key "
        f"from a keys file (header lookup, parse, SHA-256, compare_digest against every hash); in the running servers "
        f"(caches cold between requests, the engine's threads beside it) {served.get('open', 0):.1f} us without "
        f"keys and {served.get('keys', 0):.1f} us with them, against {per_request_us:.0f} us per open request here.",
        "A ratio below 1 is the cost; its spread is in paired_ratios_per_round (each round measures all five in "
        "turn). The control is a second open server: how far its ratio to open is from 1 is what two identical "
        "servers differ by on this machine, so a cost within that distance is not measurable here.",
        "Adjacent slices (one cycle) compared, median [quartiles] over all cycles: "
        + "; ".join(f"{label} {v['median']:.3f} [{v['q1']:.3f}, {v['q3']:.3f}]" for label, v in per_cycle.items())
        + ".",
    ]


def _refused_without_key(handle: Any) -> int:
    """The keys server's answer to an inference without a key (401 expected): the figure is of a guarded server."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", handle.port, timeout=30)
    conn.request("POST", "/v2/models/mlp/infer", body=b"{}", headers={"Content-Type": "application/json"})
    status = conn.getresponse().status
    conn.close()
    return status


def _spread(values: list[float]) -> dict[str, float]:
    """Median and quartiles (and how many values) of per-cycle ratios."""
    qs = statistics.quantiles(values, n=4) if len(values) >= 2 else [values[0]] * 3
    return {"median": round(statistics.median(values), 4), "q1": round(qs[0], 4), "q3": round(qs[2], 4),
            "cycles": len(values)}


def _ratio(name: str, num: Measurement, den: Measurement) -> Ratio:
    return Ratio(name=name, numerator=num.name, denominator=den.name,
                 wall=round(num.wall.median / den.wall.median, 3), better="higher", unit="inf/s")
