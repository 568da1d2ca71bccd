"""What the deploy end-to-end tests share: the example project built once, the CLI, one real inference.

Why the onnx-zero-code example: it is the smallest project a user can build from the CI matrix's
onnxruntime:25.08 image (a convnet, no handler code), so a deploy test measures the deploy, not the
model; its examples.yaml carries the expected logits, so "answers" means "answers correctly".
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
MODEL = "convnet"


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


def one_inference(project: Path, url: str, env: dict[str, str] | None = None) -> np.ndarray:
    """Send examples.yaml's input to URL with the deployment's key (over TLS pinned to its host's
    certificate); the logits, checked against the example's expected values."""
    from ngcx.project.client import Client
    from ngcx.project.examples import load_examples

    [example] = load_examples(project / "examples.yaml")
    key, pin = access(project, url, env)
    client = Client(url, timeout=60, key=key, pin=pin)
    try:
        answer = client.infer(MODEL, {"image": example.inputs["image"]})
    finally:
        client.close()
    got = np.asarray(answer["logits"]).reshape(-1)
    want = example.outputs["logits"]
    np.testing.assert_allclose(got, want.array.reshape(-1), rtol=want.rtol, atol=want.atol)
    return got
