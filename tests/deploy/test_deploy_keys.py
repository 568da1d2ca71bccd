"""Endpoint keys and TLS pinning, without an engine: what a user (or an attacker) notices.

The key lives only in a 0600 file of a 0700 folder; a host gets its SHA-256 only; an interrupted
rotation resumes with the same new key; the CLI sends a key over TLS only to the pinned certificate
and refuses a connection to any other before a byte of the request is sent.
"""

from __future__ import annotations

import hashlib
import http.server
import os
import ssl
import stat
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ngcx.core.tls import PinMismatch, fingerprint, pem_fingerprint
from ngcx.deploy import keys
from ngcx.project.client import Client


def test_a_key_is_256_bits_in_a_0600_file_and_the_host_gets_only_its_sha256(isolated_state):
    key = keys.create(7)
    assert key.startswith("ngcx_") and len(key) == len("ngcx_") + 43        # 32 bytes, URL-safe base64
    path = keys.folder() / "7.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(keys.folder().stat().st_mode) == 0o700
    assert keys.get(7) == key and keys.create(8) != key
    text = keys.hashes_text(7, [key])
    assert hashlib.sha256(key.encode()).hexdigest() in text and key not in text


def test_an_interrupted_rotation_resumes_with_the_same_new_key_then_forget_deletes_everything(isolated_state):
    old = keys.create(3)
    new = keys.begin_rotation(3)
    assert keys.begin_rotation(3) == new and keys.get(3) == old                # ngcx was killed: same new key
    assert stat.S_IMODE((keys.folder() / "3.next").stat().st_mode) == 0o600
    keys.finish_rotation(3)
    assert keys.get(3) == new and keys.pending(3) is None
    keys.save_certificate(3, "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----")
    keys.forget(3)
    assert keys.get(3) is None and keys.certificate_path(3) is None and 3 not in keys.kept()


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory) -> Iterator[tuple[str, str]]:
    """A real HTTPS server with a self-signed certificate made by openssl (as a host makes its own); it
    answers 200 only with the right bearer key: (URL, the certificate's pinned fingerprint)."""
    folder = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-days", "1", "-subj", "/CN=ngcx-host", "-keyout", str(folder / "k.pem"), "-out",
                    str(folder / "c.pem")], check=True, capture_output=True)
    seen: list[str | None] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:            # noqa: N802 - http.server's naming
            seen.append(self.headers.get("Authorization"))
            ok = self.headers.get("Authorization") == "Bearer right" or self.path.startswith("/v2/health/")
            body = b"nv_inference_count 1\n" if ok and self.path == "/metrics" else b""
            self.send_response(200 if ok else 401)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(folder / "c.pem", folder / "k.pem")
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    server.seen = seen  # type: ignore[attr-defined]
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", pem_fingerprint((folder / "c.pem").read_text())
    finally:
        server.shutdown()


def test_the_pinned_certificate_gets_the_key_and_any_other_gets_nothing(tls_server):
    url, pin = tls_server
    assert len(pin) == 95 and pin == fingerprint(ssl.PEM_cert_to_DER_cert(ssl.get_server_certificate(
        ("127.0.0.1", int(url.rsplit(":", 1)[1])))))
    assert Client(url, key="right", pin=pin).status("GET", "/v2") == 200
    assert Client(url, key="right", pin=pin).status("GET", "/v2", with_key=False) == 401
    wrong_pin = ("11" if pin[:2] != "11" else "22") + pin[2:]      # always another certificate's
    with pytest.raises(PinMismatch):
        Client(url, key="right", pin=wrong_pin).status("GET", "/v2")


def test_get_returns_the_status_and_body_with_the_key_over_the_pinned_certificate_only(tls_server):
    url, pin = tls_server
    client = Client(url, timeout=5, key="right", pin=pin)
    try:
        assert client.get("/metrics") == (200, b"nv_inference_count 1\n")
        assert client.get("/metrics") == (200, b"nv_inference_count 1\n"), "again on the kept-alive connection"
    finally:
        client.close()
    assert Client(url, timeout=5, key="wrong", pin=pin).get("/metrics") == (401, b""), "a status, not raised"
    with pytest.raises(ValueError, match="not pinned"):
        Client(url, timeout=5, key="right").get("/metrics")


def test_without_a_pin_the_client_asks_health_only_and_never_sends_the_key(tls_server):
    url, _pin = tls_server
    client = Client(url, key="right")
    assert client.ready()                                    # keyless health over unverified TLS: fine
    with pytest.raises(ValueError, match="not pinned"):
        client.status("GET", "/v2")


def test_ngcx_deployments_key_of_an_unknown_or_keyless_deployment_is_one_line(isolated_state):
    done = subprocess.run([sys.executable, "-m", "ngcx", "deployments", "key", "41"], capture_output=True,
                          text=True, env=dict(os.environ), cwd=Path(__file__).parent)
    assert done.returncode == 2 and "no deployment 41" in done.stderr and "Traceback" not in done.stderr


def test_prune_keeps_the_key_files_of_a_deployment_made_while_it_runs(isolated_state, monkeypatch):
    """A concurrent deploy (a service's roll starts replicas in parallel) creates its record and then its key
    files between prune's two reads: they must survive, and a gone deployment's files must not."""
    from ngcx.deploy import security, store
    from ngcx.deploy.common import DeployConfig

    def config() -> DeployConfig:
        return DeployConfig(cloud="local", image="x:1", pull_ref=None, registry=None, labels={}, model="m")

    gone = store.create_intent(config())
    keys.create(gone.id)
    keys.write_local_hashes(gone.id, "# gone\n")
    store.mark_destroyed(gone.id, "test")
    records = store.records
    made: list[int] = []

    def records_while_a_deploy_starts(*args, **kwargs):
        found = records(*args, **kwargs)
        if not made:                                   # the other deploy: its record, then its files
            rec = store.create_intent(config())
            keys.create(rec.id)
            keys.write_local_hashes(rec.id, "# new\n")
            made.append(rec.id)
        return found

    monkeypatch.setattr(store, "records", records_while_a_deploy_starts)
    security.prune()
    assert (keys.folder() / f"{made[0]}.auth" / "keys").is_file() and made[0] in keys.kept()
    assert gone.id not in keys.kept()
