"""A self-signed certificate made on the spot (the `cryptography` package) for the TLS tests and the bench.

Why made, not shipped: a certificate in the repository would expire and would teach copying a
private key around; this one lives for a day, names localhost and 127.0.0.1, and is pinned by
its SHA-256 fingerprint, as `ngcx deploy` pins a host's certificate.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import ssl
from pathlib import Path


def _certificate(subject: str, key, public_key, issuer: str, sans: list, ca: bool = False):  # noqa: ANN001, ANN202
    """One day's X.509 certificate for subject, signed by `key` in the name of `issuer`."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)])).public_key(public_key)
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1)))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if ca:
        builder = builder.add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
    return builder.sign(key, hashes.SHA256())


def _write(folder: Path, cert_name: str, key_name: str, cert, key) -> tuple[Path, Path]:  # noqa: ANN001
    from cryptography.hazmat.primitives import serialization

    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / cert_name, folder / key_name
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
            key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return cert_path, key_path


def self_signed(folder: Path) -> tuple[Path, Path, str]:
    """cert.pem and key.pem (EC P-256, unencrypted) in folder; returns their paths and the cert's SHA-256 (hex)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    cert = _certificate("localhost", key, key.public_key(), "localhost",
                        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert_path, key_path = _write(folder, "cert.pem", "key.pem", cert, key)
    return cert_path, key_path, hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def ca_signed(folder: Path, addresses: list[str], names: tuple[str, ...] = ("localhost",)) -> tuple[Path, Path, Path]:
    """A test CA (ca.pem; its key is not kept) and a server certificate it signed for `addresses` and `names`
    (server.pem, server-key.pem): a user's CA-signed certificate, as a service's balancer shows it. Returns
    (ca.pem, server.pem, server-key.pem); clients trust ca.pem (SSL_CERT_FILE)."""
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = _certificate("ngcx test CA", ca_key, ca_key.public_key(), "ngcx test CA", [], ca=True)
    sans = [x509.DNSName(n) for n in names] + [x509.IPAddress(ipaddress.ip_address(a)) for a in addresses]
    server = _certificate(names[0] if names else addresses[0], ca_key, key.public_key(), "ngcx test CA", sans)
    ca_path, _ = _write(folder, "ca.pem", "", ca, None)          # the CA's key is not kept: nothing signs again
    server_path, key_path = _write(folder, "server.pem", "server-key.pem", server, key)
    return ca_path, server_path, key_path


def pinning_context() -> ssl.SSLContext:
    """A client context that checks nothing by itself: the caller compares the peer's certificate with its pin."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def peer_fingerprint(sock: ssl.SSLSocket) -> str:
    """The SHA-256 (hex) of the certificate the server presented on this connection."""
    der = sock.getpeercert(binary_form=True)
    assert der is not None, "no certificate from the peer"
    return hashlib.sha256(der).hexdigest()
