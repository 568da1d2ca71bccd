"""serve-peers: ngcx-runtime against the servers a user would pick instead, side by side in one run (issue 24).

Usage: `.venv/bin/python -m bench serve-peers --repeat 3` from the repository root (each peer's virtual environment
is made on first use from PyPI, bench/serve_peers/peers.py; the suite puts tests/runtime on the import path for
its models).

Same ONNX models (tests/runtime/models.py: a small MLP and a small conv net; bench/serve_peers/image_model.py: an
image-sized one, ResNet's 3x224x224 FP32 input and 1000-way output, issue 50), the same onnxruntime version and
CPU provider under every server, the same batch limit and batching window where the peer batches, KServe v2 over
HTTP. Per round, the servers run one at a time in a rotated order; each is checked for correct answers (against
onnxruntime in this process) before it is timed. Points: CLIENTS closed-loop clients x JSON (and the binary tensor
extension where the peer has it) x every model. Figures: requests/s, p50 / p99 latency, idle and peak RSS of the
server's process session, and seconds from start to the first correct answer. Ratios: ngcx / the best peer, per
point, from the same run.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..core import ROOT, Measurement, Ratio, Stats, SuiteResult
from ..serve_peers import image_model, load
from ..serve_peers.peers import PEERS, Peer, command, ensure_venv, shown, version

CLIENTS = (1, 8, 32)
SECONDS = 5.0
MAX_BATCH, DELAY_MS = 32, 1.0
READY_S = 180.0
IMAGE_NOTE = ("image: ResNet's request and answer (input 1x3x224x224 FP32, 1000 logits; "
              "bench/serve_peers/image_model.py says why its compute is small): 3.1 MB of JSON per request "
              "as json.dumps writes the floats, 602 KB binary. ngcx reads such a float tensor from the text "
              "straight into numpy with simdjson (runtime/jsonbody.py has the figures; orjson and one numpy "
              "conversion before, runtime/jsontensor.py), on one core: the GIL holds the parse.")


def _models(work: Path) -> dict[str, tuple[Path, np.ndarray]]:
    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    import models

    return {"mlp": (models.mlp(work / "mlp.onnx"), models.sample_inputs("mlp", 1)["x"]),
            "convnet": (models.conv_net(work / "convnet.onnx"), models.sample_inputs("conv", 1)["input"]),
            "image": (image_model.image_net(work / "image.onnx"), image_model.sample(1))}


def _chosen(models: dict[str, Any], names: str) -> dict[str, Any]:
    """NGCX_BENCH_SERVE_MODELS=image (comma-separated names) runs those models only: a rerun of one point set
    in a quiet spell of a shared machine, written with --out to a folder of its own; empty: every model."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in models]
    if unknown:
        raise ValueError(f"NGCX_BENCH_SERVE_MODELS: unknown model(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(models)}")
    return {n: models[n] for n in wanted} if wanted else models


def _bodies(name: str, x: np.ndarray) -> dict[str, tuple[bytes, dict[str, str]]]:
    """The request in JSON and with the binary tensor extension (same tensor)."""
    tensor = {"name": name, "shape": list(x.shape), "datatype": "FP32"}
    plain = json.dumps({"inputs": [dict(tensor, data=x.ravel().tolist())]}).encode()
    header = json.dumps({"inputs": [dict(tensor, parameters={"binary_data_size": x.nbytes})]}).encode()
    return {"json": (plain, {"Content-Type": "application/json"}),
            "binary": (header + x.astype(np.float32).tobytes(), {"Content-Type": "application/octet-stream",
                                                                 "Inference-Header-Content-Length": str(len(header))})}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _session_rss(sid: int) -> int:
    """Resident bytes of every process in session `sid` (the server and whatever it started)."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:
                total += int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    return total


class Server:
    """One peer serving one model, started in its own session (so its whole tree is measured and stopped)."""

    def __init__(self, peer: Peer, model: Path, work: Path, log: Path) -> None:
        self.port = _free_port()
        argv = command(peer, model, self.port, MAX_BATCH, DELAY_MS, work)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "NO_PROXY": "*", "no_proxy": "*"}
        self.log = log.open("a")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=work,
                                     start_new_session=True)

    def first_answer(self, body: bytes, headers: dict[str, str]) -> tuple[float, dict]:
        """Seconds until a 200 answer to `body`, and that answer."""
        import http.client

        while time.monotonic() - self.started < READY_S:
            if self.proc.poll() is not None:
                raise RuntimeError(f"exited {self.proc.returncode} while starting")
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                conn.request("POST", "/v2/models/model/infer", body, headers)
                reply = conn.getresponse()
                data = reply.read()
                conn.close()
                if reply.status == 200:
                    return time.monotonic() - self.started, json.loads(data)
            except (OSError, ValueError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"no answer within {READY_S:.0f} s")

    def rss(self) -> int:
        return _session_rss(self.proc.pid)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.log.close()


def _check(answer: dict, want: np.ndarray) -> None:
    out = answer["outputs"][0]
    got = np.asarray(out["data"], dtype=np.float32).reshape(out["shape"])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _peak(server: Server, stop: threading.Event, peak: list[int]) -> None:
    while not stop.wait(0.25):
        peak[0] = max(peak[0], server.rss())


def _one(peer: Peer, model: str, path: Path, x: np.ndarray, work: Path, log: Path,
         clients: tuple[int, ...] = CLIENTS, seconds: float = SECONDS) -> dict[str, Any]:
    """One server: time to the first correct answer (and a correct binary answer where it takes binary),
    idle RSS, then every point, peak RSS over them."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    want = session.run(None, {session.get_inputs()[0].name: x})[0]
    bodies = _bodies(session.get_inputs()[0].name, x)
    server = Server(peer, path, work, log)
    row: dict[str, Any] = {"points": {}}
    try:
        row["ready_s"], answer = server.first_answer(*bodies["json"])
        _check(answer, want)
        if peer.binary:
            _check(server.first_answer(*bodies["binary"])[1], want)
        row["idle_rss"] = server.rss()
        stop, peak = threading.Event(), [row["idle_rss"]]
        watcher = threading.Thread(target=_peak, args=(server, stop, peak), daemon=True)
        watcher.start()
        for encoding in ("json", "binary") if peer.binary else ("json",):
            for n in clients:
                res = load.run(server.port, *bodies[encoding], n, seconds)
                row["points"][f"{model} {encoding} c{n}"] = {
                    "rps": res.rps, "p50_ms": res.percentile(0.5), "p99_ms": res.percentile(0.99),
                    "errors": len(res.errors), "first_error": (res.errors or [""])[0]}
        stop.set()
        watcher.join(5)
        row["peak_rss"] = peak[0]
    finally:
        server.stop()
    return row


def run(result: SuiteResult, work: Path, out: Path, peers: dict[str, Peer] | None = None,
        clients: tuple[int, ...] = CLIENTS, seconds: float = SECONDS) -> None:
    """Every peer that installs, `result.repeat` rounds; peers, clients and seconds are smaller in the test."""
    log = out / "serve-peers.log"
    log.write_text("")
    models = _chosen(_models(work), os.environ.get("NGCX_BENCH_SERVE_MODELS", ""))
    installed, missing = [], {}
    for peer in (peers or PEERS).values():
        reason = ensure_venv(peer, log)
        (missing.__setitem__(peer.name, reason) if reason else installed.append(peer))
    rounds: list[dict[str, dict]] = []
    for r in range(result.repeat):
        order = installed[r % len(installed):] + installed[:r % len(installed)]
        this: dict[str, dict] = {}
        for peer in order:
            for model, (path, x) in models.items():
                try:
                    this[f"{peer.name} {model}"] = _one(peer, model, path, x, work, log, clients, seconds)
                except Exception as exc:  # noqa: BLE001 - a peer that fails is a row saying why, not a lost run
                    this[f"{peer.name} {model}"] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        rounds.append(this)
    _report(result, rounds, installed, missing, clients, seconds)


def _report(result: SuiteResult, rounds: list[dict[str, dict]], installed: list[Peer],
            missing: dict[str, str], clients: tuple[int, ...] = CLIENTS, seconds: float = SECONDS) -> None:
    """Medians over rounds per (peer, point); ratios ngcx / best peer per point."""
    series: dict[tuple[str, str, str], list[float]] = {}
    for this in rounds:
        for key, row in this.items():
            peer = key.split()[0]
            for point, fig in row.get("points", {}).items():
                for figure in ("rps", "p50_ms", "p99_ms"):
                    if fig[figure] is not None and not fig["errors"]:
                        series.setdefault((peer, point, figure), []).append(fig[figure])
            for figure in ("ready_s", "idle_rss", "peak_rss"):
                if figure in row:
                    series.setdefault((peer, key.split()[1], figure), []).append(float(row[figure]))
    units = {"rps": ("req/s", "higher"), "p50_ms": ("ms", "lower"), "p99_ms": ("ms", "lower"),
             "ready_s": ("s", "lower"), "idle_rss": ("MB", "lower"), "peak_rss": ("MB", "lower")}
    ms = {}
    for (peer, point, figure), values in sorted(series.items()):
        unit, better = units[figure]
        values = [v / 1e6 for v in values] if unit == "MB" else values
        ms[(peer, point, figure)] = Measurement(f"{peer}: {point} {figure}", peer, unit, better, Stats.of(values),
                                                command=shown(PEERS[peer], MAX_BATCH, DELAY_MS))
    result.measurements = list(ms.values())
    ratios: list[tuple[str, Ratio]] = []
    for (peer, point, figure), m in ms.items():
        if peer != "ngcx":
            continue
        others = [o for (p, pt, f), o in ms.items() if p != "ngcx" and pt == point and f == figure]
        if others:
            best = max(others, key=lambda o: o.wall.median) if figure == "rps" else min(others,
                                                                                    key=lambda o: o.wall.median)
            ratios.append((figure, Ratio(f"{point} {figure}: ngcx / {best.tool}", m.name, best.name,
                                         round(m.wall.median / best.wall.median, 3), better=m.better, unit=m.unit)))
    result.ratios = _headline_first(ratios)
    result.extra.update(peers=[p.name for p in installed], not_installed=missing, clients=list(clients),
                        seconds=seconds, max_batch=MAX_BATCH, delay_ms=DELAY_MS,
                        batching={p.name: p.batching for p in installed},
                        errors={k: v["error"] for this in rounds for k, v in this.items() if "error" in v})
    versions = {p.name: version(p) for p in installed}
    result.extra["versions"] = versions
    result.notes = [f"Not installed: {name}: {why}" for name, why in missing.items()]
    result.notes += [f"{p.name} {versions[p.name]}: batching: {p.batching}." for p in installed]
    result.notes += ["Every server runs on onnxruntime's CPU provider in its own virtual environment (the same "
                     "onnxruntime and numpy), with max batch "
                     f"{MAX_BATCH} and a {DELAY_MS:g} ms window where it batches, and per-request logging off "
                     "(ngcx-runtime writes none). Clients: 2 forked processes of keep-alive http.client "
                     f"connections, {seconds:g} s per point after 1 s of warm-up; a point with any error is left out.",
                     IMAGE_NOTE]


def _headline_first(ratios: list[tuple[str, Ratio]]) -> list[Ratio]:
    """The worst req/s point and the worst p50 point first (BENCHMARKS.md's summary shows the first two), then
    every ratio by figure and point. `ratios`: (figure, ratio) pairs, as the loop that builds them knows them."""
    order = {"rps": 0, "p50_ms": 1, "p99_ms": 2, "ready_s": 3, "peak_rss": 4, "idle_rss": 5}
    rest = sorted(ratios, key=lambda fr: (order[fr[0]], fr[1].name))
    heads = [min((r for f, r in rest if f == "rps"), key=lambda r: r.wall, default=None),
             max((r for f, r in rest if f == "p50_ms"), key=lambda r: r.wall, default=None)]
    heads = [h for h in heads if h is not None]
    return heads + [r for _, r in rest if all(r is not h for h in heads)]
