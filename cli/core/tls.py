"""TLS to a host that made its own certificate: pin its SHA-256 fingerprint instead of a CA chain.

Why pinning and not a CA: a cloud host makes its own key pair at first boot (recipes/deploy/host.sh.j2),
so no public CA has signed it and its name is an IP address that changes with every new host. ngcx
learns the certificate through the cloud's command channel (which the cloud authenticates) and then
accepts exactly that certificate, as `ssh` pins a host key; nothing else (another certificate, a
proxy re-signing TLS) gets the deployment's key. A service's balancer is the exception: it shows the
user's own CA-signed certificate, so it is checked the ordinary way (`verified_connection`).
Standard library only: the CLI does not depend on the `cryptography` package.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import ssl


class PinMismatch(ssl.SSLError):
    """The server's certificate is not the pinned one (a replaced host, or someone in between)."""


def fingerprint(der: bytes) -> str:
    """'AB:CD:…' (64 hex digits in pairs): what `openssl x509 -noout -fingerprint -sha256` prints."""
    digest = hashlib.sha256(der).hexdigest().upper()
    return ":".join(digest[i:i + 2] for i in range(0, len(digest), 2))


def pem_fingerprint(pem: str) -> str:
    """The fingerprint of a PEM certificate; ValueError when `pem` holds none."""
    return fingerprint(ssl.PEM_cert_to_DER_cert(pem.strip()))


def _no_ca_context() -> ssl.SSLContext:
    """A client context that checks no CA chain and no name: the pin (or nothing, for health) decides."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def verified_connection(host: str, port: int, timeout: float) -> http.client.HTTPSConnection:
    """An HTTPS connection checked the ordinary way: the CA chain (the system's, or SSL_CERT_FILE's) and the
    name in the URL. For a service's balancer, which shows the user's certificate, not a host's own."""
    context = ssl.create_default_context()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return http.client.HTTPSConnection(host, port, timeout=timeout, context=context)


class PinnedHTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection that closes before sending a byte unless the certificate matches `pin`.

    pin None: no check at all; only for requests that carry nothing secret (the keyless health
    endpoints a deploy polls while the host boots, before the certificate is known)."""

    def __init__(self, host: str, port: int, pin: str | None, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=_no_ca_context())
        self.pin = pin

    def connect(self) -> None:
        super().connect()
        if self.pin is None:
            return
        der = self.sock.getpeercert(binary_form=True) or b""
        if not hmac.compare_digest(fingerprint(der), self.pin.upper()):
            self.close()
            raise PinMismatch(f"the certificate of {self.host}:{self.port} is not the one pinned for it")
