"""What the deploy end-to-end tests share: the example project built once, the CLI, one real inference.

Why the onnx-zero-code example: it is the smallest project a user can build from the CI matrix's
onnxruntime:25.08 image (a convnet, no handler code), so a deploy test measures the deploy, not the
model; its examples.yaml carries the expected logits, so "answers" means "answers correctly".
"""

from __future__ import annotations

import http.client
import os
import shutil
import ssl
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np

REPO = Path(__file__).resolve().parents[2]
MODEL = "convnet"
LOAD_CLIENTS = 4
LOAD_MAX_S = 600.0
LOAD_MAX_REQUESTS = 200_000


def ngcx(cwd: Path, *args: str, env: dict[str, str] | None = None,
         timeout: float = 1200) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "ngcx", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "NGCX_BASE": "offline", **(env or {})})
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def built_zero_code(tmp_path_factory) -> Path:
    """examples/onnx-zero-code exported and built (the image ngcx-app/onnx-zero-code:latest)."""
    root = tmp_path_factory.mktemp("deploy") / "onnx-zero-code"
    shutil.copytree(REPO / "examples" / "onnx-zero-code", root, ignore=shutil.ignore_patterns("model", "calib.npz"))
    done = subprocess.run([sys.executable, "export.py"], cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    built = ngcx(root, "build", "--progress", "plain")
    assert built.returncode == 0, (built.stdout + built.stderr)[-3000:]
    return root


def access(project: Path, url: str, env: dict[str, str] | None = None) -> tuple[str | None, str | None]:
    """(key, pinned fingerprint) of the newest deployment serving URL, as a user gets them: `ngcx deployments
    ls --json` (the pin, in its spec) and `ngcx deployments key ID`."""
    import json

    listed = ngcx(project, "deployments", "ls", "--json", env=env)
    assert listed.returncode == 0, listed.stderr
    [record] = [r for r in json.loads(listed.stdout) if r["endpoint"] == url][:1]
    key = ngcx(project, "deployments", "key", str(record["id"]), env=env)
    return (key.stdout.strip() if key.returncode == 0 else None), record["spec"].get("tls_sha256")


def one_inference(project: Path, url: str, env: dict[str, str] | None = None, *, deployed: bool = True) -> np.ndarray:
    """Send examples.yaml's input to URL with the deployment's key (over TLS pinned to its host's
    certificate); the logits, checked against the example's expected values. `deployed=False`: a container
    a user ran by hand (no deployment record, no key: the runtime's open development server)."""
    from ngcx.project.client import Client
    from ngcx.project.examples import load_examples

    [example] = load_examples(project / "examples.yaml")
    key, pin = access(project, url, env) if deployed else (None, None)
    client = Client(url, timeout=60, key=key, pin=pin)
    try:
        answer = client.infer(MODEL, {"image": example.inputs["image"]})
    finally:
        client.close()
    got = np.asarray(answer["logits"]).reshape(-1)
    want = example.outputs["logits"]
    np.testing.assert_allclose(got, want.array.reshape(-1), rtol=want.rtol, atol=want.atol)
    return got


class Load:
    """Constant inference load on a service URL: LOAD_CLIENTS threads, each on its own keep-alive connection
    (https with `context`: the balancer's certificate checked), sending the example's inference with the
    service's key back to back, bounded by LOAD_MAX_S and LOAD_MAX_REQUESTS; counts every answer and error
    (a failed request is any answer but 200, or a connection error)."""

    def __init__(self, url: str, key: str, payload: bytes, context: ssl.SSLContext | None = None, *,
                 clients: int = LOAD_CLIENTS, rate: float | None = None) -> None:
        """`rate`: requests per second per client (paced); None sends back to back."""
        parts = urlsplit(url)
        self.https, self.context = parts.scheme == "https", context
        self.address = (parts.hostname, parts.port or (443 if self.https else 80))
        self.key, self.payload = key, payload
        self.seen: Counter[str] = Counter()
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.pause = 1.0 / rate if rate else 0.0
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def __enter__(self) -> Load:
        self.started = time.monotonic()
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)
        assert not any(t.is_alive() for t in self.threads), "a load client hung"

    def total(self) -> int:
        return sum(self.seen.values())

    def _client(self) -> None:
        conn = None
        due = time.monotonic()
        while not self.stop.is_set() and time.monotonic() - self.started < LOAD_MAX_S and \
                self.total() < LOAD_MAX_REQUESTS:
            if self.pause:
                due += self.pause
                if self.stop.wait(max(0.0, due - time.monotonic())):
                    break
            conn = conn or self._connect()
            try:
                conn.request("POST", "/v2/models/convnet/infer", self.payload,
                             {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"})
                reply = conn.getresponse()
                data = reply.read()
                outcome = str(reply.status)
                if reply.status != 200:
                    self.errors.append(f"{reply.status}: {data[:200]!r}")
                if reply.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException) as exc:
                outcome = type(exc).__name__
                self.errors.append(f"{type(exc).__name__}: {exc}")
                conn.close()
                conn = None
            with self.lock:
                self.seen[outcome] += 1

    def _connect(self) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(*self.address, timeout=30, context=self.context)
        return http.client.HTTPConnection(*self.address, timeout=30)

    def settle(self, at_least: int = 20) -> None:
        """Until at least `at_least` more requests were answered (the load is flowing)."""
        goal, deadline = self.total() + at_least, time.monotonic() + 60
        while self.total() < goal and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.total() >= goal, f"the load stalled: {self.seen}"
