"""A service on a VM cloud (aws/, aliyun/ over vm.py), without a cloud: what its balancer spec says, what
is refused before any cloud call, and the client side of a balancer's CA-signed certificate.

What a user notices (issue 21): `--replicas N` without `--certificate` on a cloud is one line naming what to
pass, before anything is made; with one, the balancer listens HTTPS on 443 with that certificate and reaches
the replicas over their own TLS on 8000, checking the keyless health route; a client sends the service key
through a balancer whose certificate the user's CA verifies, and never through one it cannot verify.
"""

from __future__ import annotations

import http.server
import ssl
import threading
from collections.abc import Iterator

import pytest
from emulators.traffic import certs

from ngcx.core.errors import UserError
from ngcx.deploy import vm
from ngcx.deploy.aliyun import verbs as aliyun
from ngcx.deploy.aws import verbs as aws
from ngcx.deploy.common import SERVE_PORT, DeployConfig, DeployRecord
from ngcx.deploy.service import Options
from ngcx.project.client import Client

TAGS = {"ngcx:owner": "o", "ngcx:service": "1"}


def config() -> DeployConfig:
    return DeployConfig(cloud="aws", image="ngcx-app/x:latest", pull_ref=None, registry=None, labels={}, model="x",
                        region="us-east-1")


@pytest.mark.parametrize(("module", "what"), [(aws, "an ACM certificate ARN"), (aliyun, "(CAS) certificate id")])
def test_a_cloud_service_without_a_certificate_is_refused_in_one_line(module, what) -> None:
    for check in (lambda: module.check_service(config(), Options()),
                  lambda: module.service_spec("ngcx-svc-1", ("a", "b"), TAGS, Options(), config())):
        with pytest.raises(UserError) as caught:
            check()
        assert f"a service on {module.NAME} needs --certificate" in str(caught.value) and what in str(caught.value)
        assert "\n" not in str(caught.value) and "--certificate" in (caught.value.hint or "")


@pytest.mark.parametrize("module", [aws, aliyun])
def test_a_cloud_service_listens_https_with_the_users_certificate_and_reaches_the_hosts_tls(module) -> None:
    options = Options(drain_s=7, health_interval_s=6, healthy_threshold=3, unhealthy_threshold=4, certificate_id="C")
    spec = module.service_spec("ngcx-svc-1", ("z1", "z2"), TAGS, options, config())
    assert (spec.protocol, spec.port, spec.certificate_id) == ("HTTPS", 443, "C")
    assert (spec.target_protocol, spec.target_port, spec.health_path) == ("HTTPS", SERVE_PORT, "/v2/health/ready")
    assert (spec.drain_s, spec.health_interval_s, spec.healthy_threshold, spec.unhealthy_threshold) == (7, 6, 3, 4)
    assert (spec.zones, spec.tags, spec.name) == (("z1", "z2"), TAGS, "ngcx-svc-1")


def test_a_replica_is_registered_as_its_instance_on_the_serve_port() -> None:
    record = DeployRecord(id=3, cloud="aws", image="i", status="ready", created_at=0.0, updated_at=0.0,
                          instance_id="i-0abc")
    assert vm.member(record) == aws.member(record) == aliyun.member(record) == ("i-0abc", SERVE_PORT)


@pytest.fixture
def balancer_tls(tmp_path) -> Iterator[tuple[str, str, list]]:
    """An HTTPS server with a CA-signed certificate for 127.0.0.1 (a balancer's): (url, ca.pem, Authorization seen)."""
    ca, cert, key = certs().ca_signed(tmp_path, ["127.0.0.1"])
    seen: list = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:            # noqa: N802 - http.server's naming
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", str(ca), seen
    finally:
        server.shutdown()


def test_a_ca_verified_balancer_gets_the_key_and_an_unverified_one_never(balancer_tls, monkeypatch, tmp_path) -> None:
    url, ca, seen = balancer_tls
    monkeypatch.setenv("SSL_CERT_FILE", ca)
    assert Client(url, key="k", verify=True).status("GET", "/v2") == 200
    assert seen == ["Bearer k"]
    with pytest.raises(ValueError, match="not pinned"):
        Client(url, key="k").status("GET", "/v2")
    other, _, _ = certs().ca_signed(tmp_path / "other", ["127.0.0.1"])    # a CA that did not sign it
    monkeypatch.setenv("SSL_CERT_FILE", str(other))
    with pytest.raises(ssl.SSLCertVerificationError):
        Client(url, key="k", verify=True).status("GET", "/v2")
    assert seen == ["Bearer k"], "the key went nowhere else"
