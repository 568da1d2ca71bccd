"""`ngcx-runtime serve`'s access flags and their environment defaults, as a process.

What an operator notices: a wrong combination (TLS's two halves, explicit model control without an
admin key, a hash that is not one, a keys file missing or malformed, a bad environment value) is
one line and exit 2 before anything listens, never a traceback, and never echoes a key pasted
where its hash belongs. A server configured through the environment alone (as `ngcx deploy` does)
asks for keys over TLS; one left open on a public address says so at start.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import models
import pytest
from certs import pinning_context, self_signed
from keyring import USER_KEY

from ngcx_runtime.keys import sha256_hex

pytest.importorskip("onnxruntime")
pytest.importorskip("cryptography")

SERVE = [sys.executable, "-m", "ngcx_runtime.cli", "serve"]
SECRET = "my-secret-key-pasted-by-mistake"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NGCX_RUNTIME_") or k == "NGCX_RUNTIME_CACHE"}
    return {**env, **extra}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("access-cli")
    cert, key, _ = self_signed(d / "tls")
    (d / "bad.pem").write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    (d / "malformed-keys").write_text(f"{sha256_hex(USER_KEY)}\n{SECRET}\n")
    (d / "keys").write_text(f"# the deployer's key\n{sha256_hex(USER_KEY)}\n")
    return {"dir": d, "model": models.mlp(d / "mlp.onnx"), "cert": cert, "key": key, "bad": d / "bad.pem",
            "malformed": d / "malformed-keys", "keys": d / "keys", "missing": d / "missing"}


CASES = [  # (flags, environment, what the one line says)
    (["--tls-cert", "{cert}"], {}, "--tls-cert needs --tls-key too"),
    (["--tls-key", "{key}"], {}, "--tls-key needs --tls-cert too"),
    ([], {"NGCX_RUNTIME_TLS_CERT": "{cert}"}, "--tls-cert needs --tls-key too"),
    (["--tls-cert", "{missing}", "--tls-key", "{key}"], {}, "cannot read it"),
    (["--tls-cert", "{bad}", "--tls-key", "{bad}"], {}, "not a PEM certificate with its unencrypted PEM private key"),
    (["--tls-cert", "{key}", "--tls-key", "{cert}"], {}, "not a PEM certificate"),
    (["--model-control-mode", "explicit"], {}, "--model-control-mode explicit needs an admin key"),
    ([], {"NGCX_RUNTIME_MODEL_CONTROL": "explicit"}, "--model-control-mode explicit needs an admin key"),
    ([], {"NGCX_RUNTIME_MODEL_CONTROL": "auto"}, "$NGCX_RUNTIME_MODEL_CONTROL='auto': choose one of none, explicit"),
    (["--auth-key-sha256", SECRET], {}, "--auth-key-sha256 is not a SHA-256 in hex"),
    ([], {"NGCX_RUNTIME_AUTH_KEY_SHA256": f"{sha256_hex(USER_KEY)},{SECRET}"}, "is not a SHA-256 in hex"),
    (["--auth-keys-file", "{missing}"], {}, "cannot read the keys file"),
    ([], {"NGCX_RUNTIME_AUTH_KEYS": "{malformed}"}, "--auth-keys-file {malformed} line 2 is not a SHA-256"),
    (["--model-control-mode", "explicit", "--admin-keys-file", "{dir}"], {}, "--admin-keys-file"),
    (["--processes", "2", "--auth-keys-file", "{missing}"], {}, "cannot read the keys file"),
]


@pytest.mark.parametrize(("flags", "env", "fragment"), CASES)
def test_a_bad_access_setting_is_one_line_and_exit_2(files, flags, env, fragment):
    fill = {k: str(v) for k, v in files.items()}
    argv = [*SERVE, str(files["model"]), "--port", "0", *[f.format(**fill) for f in flags]]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60,
                       env=clean_env(**{k: v.format(**fill) for k, v in env.items()}))
    assert r.returncode == 2, (flags, env, r.stdout, r.stderr)
    assert fragment.format(**fill) in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == "", (r.stdout, r.stderr)
    assert SECRET not in r.stderr


def _start(argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, list[str], str]:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            seen.append(lines.get(timeout=1))
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        m = re.search(r"serving model .* at (https?)://[^:]+:(\d+)/v2/models/", seen[-1])
        if m:
            return proc, seen, f"{m.group(1)}://127.0.0.1:{m.group(2)}"
    proc.kill()
    pytest.fail(f"server did not start: {''.join(seen)}")


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()


def test_keys_and_tls_from_the_environment_alone(files):
    """What `ngcx deploy` does: the image's CMD untouched, the container's environment names the files."""
    env = clean_env(NGCX_RUNTIME_AUTH_KEYS=str(files["keys"]), NGCX_RUNTIME_TLS_CERT=str(files["cert"]),
                    NGCX_RUNTIME_TLS_KEY=str(files["key"]))
    proc, lines, url = _start([*SERVE, str(files["model"]), "--port", "0", "--name", "mlp"], env)
    try:
        text = "".join(lines)
        assert url.startswith("https://") and "TLS on every port (certificate SHA-256 fingerprint" in text, text
        assert "bearer keys required on every endpoint but health (1 in " in text, text
        assert sha256_hex(USER_KEY) not in text
        ctx = pinning_context()
        with urllib.request.urlopen(f"{url}/v2/health/ready", context=ctx, timeout=30) as r:
            assert r.status == 200
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(f"{url}/v2/models/mlp", context=ctx, timeout=30)
        assert exc.value.code == 401 and exc.value.headers["WWW-Authenticate"] == 'Bearer realm="ngcx-runtime"'
        req = urllib.request.Request(f"{url}/v2/models/mlp", headers={"Authorization": f"Bearer {USER_KEY}"})
        with urllib.request.urlopen(req, context=ctx, timeout=30) as r:
            assert json.load(r)["name"] == "mlp"
    finally:
        _stop(proc)


def test_an_open_server_off_loopback_says_so(files):
    proc, lines, url = _start([*SERVE, str(files["model"]), "--port", "0", "--host", "0.0.0.0"], clean_env())
    try:
        text = "".join(lines)
        assert "no bearer key is configured: every endpoint at http://0.0.0.0:" in text, text
        assert "--auth-keys-file PATH ($NGCX_RUNTIME_AUTH_KEYS)" in text
    finally:
        _stop(proc)
    proc, lines, url = _start([*SERVE, str(files["model"]), "--port", "0"], clean_env())
    try:
        assert "open to anyone" not in "".join(lines), "on loopback only this machine can reach it"
    finally:
        _stop(proc)
