"""Each server of the comparison: its requirements, its virtual environment, and the command that starts it.

A Peer starts with a model, a port, a batch limit and a batching window, and answers KServe v2 JSON at
/v2/models/model/infer (ngcx, MLServer and KServe natively; LitServe and Ray Serve through the route and body
their programs in servers/ choose). `binary` says whether it takes the binary tensor extension. Every peer's
per-request access log is off (MLServer's `debug`, uvicorn's and Ray Serve's access logs), as ngcx-runtime
writes none: a log line per request would measure the log, not the server.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent
REPO = HERE.parents[1]
ROUTE = "/v2/models/model/infer"


@dataclass(frozen=True)
class Peer:
    name: str
    requirements: tuple[str, ...]         # pip requirements of its venv (onnxruntime and numpy are added)
    binary: bool                          # takes the binary tensor extension
    batching: str                         # how it batches, in words (the report says it)

    def venv(self) -> Path:
        digest = hashlib.sha256(json.dumps([self.requirements, _pins()]).encode()).hexdigest()[:10]
        base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ngcx" / "bench-peers"
        return base / f"{self.name}-{digest}"

    def python(self) -> Path:
        return self.venv() / "bin" / "python"


PEERS = {
    "ngcx": Peer("ngcx", (), True, "ngcx-runtime's dynamic batcher (--max-batch, --max-queue-delay-ms)"),
    # uvloop<0.22: MLServer 1.7.1's inference workers call asyncio.get_event_loop(), which uvloop 0.22 refuses
    "mlserver": Peer("mlserver", ("mlserver", "uvloop<0.22"), False,
                     "adaptive batching (max_batch_size, max_batch_time)"),
    "kserve": Peer("kserve", ("kserve",), True, "none in the ModelServer (KServe batches in a sidecar agent)"),
    "litserve": Peer("litserve", ("litserve",), False, "LitAPI max_batch_size, batch_timeout"),
    "rayserve": Peer("rayserve", ("ray[serve]",), False, "@serve.batch(max_batch_size, batch_wait_timeout_s)"),
}

SCRIPTS = {"kserve": "kserve_onnx.py", "litserve": "litserve_onnx.py", "rayserve": "rayserve_onnx.py"}  # servers/


def _pins() -> list[str]:
    """The same onnxruntime and numpy versions as this interpreter's (the engine under every server)."""
    from importlib.metadata import version

    return [f"onnxruntime=={version('onnxruntime')}", f"numpy=={version('numpy')}"]


def ensure_venv(peer: Peer, log: Path) -> str | None:
    """Make the peer's venv once; None when it is ready, else one line saying why it could not be installed."""
    if peer.name == "ngcx" or peer.python().exists():
        return None
    venv = peer.venv()
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [[sys.executable, "-m", "venv", str(venv)],
             [str(peer.python()), "-m", "pip", "install", "-q", *peer.requirements, *_pins()]]
    with log.open("a") as out:
        for argv in steps:
            done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=1800)
            if done.returncode != 0:
                subprocess.run(["rm", "-rf", str(venv)], check=False)
                return f"`{' '.join(argv[:5])} …` failed (exit {done.returncode}; see {log})"
    return None


def version(peer: Peer) -> str:
    """The peer's own package version in its venv (ngcx: this checkout's), for the report."""
    if peer.name == "ngcx":
        from ngcx_runtime import __version__

        return __version__
    dist = {"rayserve": "ray"}.get(peer.name, peer.name)
    try:
        done = subprocess.run([str(peer.python()), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):        # no venv (a report built from given rounds)
        return "unknown"
    return done.stdout.strip() or "unknown"


def command(peer: Peer, model: Path, port: int, max_batch: int, delay_ms: float, work: Path) -> list[str]:
    """The command line that serves `model` as "model" on 127.0.0.1:port."""
    servers = HERE / "servers"
    if peer.name == "ngcx":
        return [sys.executable, "-m", "ngcx_runtime.serve", str(model), "--port", str(port), "--host", "127.0.0.1",
                "--name", "model", "--max-batch", str(max_batch), "--max-queue-delay-ms", str(delay_ms)]
    if peer.name == "mlserver":
        folder = _mlserver_folder(model, port, max_batch, delay_ms, work)
        return [str(peer.venv() / "bin" / "mlserver"), "start", str(folder)]
    return [str(peer.python()), str(servers / SCRIPTS[peer.name]), str(model), str(port), str(max_batch), str(delay_ms)]


def shown(peer: Peer, max_batch: int, delay_ms: float) -> str:
    """`command`'s line as the report shows it: MODEL and PORT for the run's own, paths from the repo root."""
    if peer.name == "ngcx":
        return (f"python -m ngcx_runtime.serve MODEL --port PORT --host 127.0.0.1 --name model --max-batch {max_batch}"
                f" --max-queue-delay-ms {delay_ms}")
    if peer.name == "mlserver":
        return (f"mlserver start FOLDER (model-settings.json: max_batch_size {max_batch}, "
                f"max_batch_time {delay_ms / 1000.0})")
    return f"python bench/serve_peers/servers/{SCRIPTS[peer.name]} MODEL PORT {max_batch} {delay_ms}"


def _mlserver_folder(model: Path, port: int, max_batch: int, delay_ms: float, work: Path) -> Path:
    """settings.json (ports) + model-settings.json (the runtime, its file, adaptive batching) + the runtime."""
    folder = work / "mlserver"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "mlserver_onnx.py").write_text((HERE / "servers" / "mlserver_onnx.py").read_text())
    (folder / "settings.json").write_text(json.dumps({"http_port": port, "grpc_port": port + 1, "debug": False,
                                                      "metrics_port": port + 2, "host": "127.0.0.1"}))
    (folder / "model-settings.json").write_text(json.dumps({
        "name": "model", "implementation": "mlserver_onnx.OnnxModel", "parameters": {"uri": str(model)},
        "max_batch_size": max_batch, "max_batch_time": delay_ms / 1000.0}))
    return folder
