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


def self_signed(folder: Path) -> tuple[Path, Path, str]:
    """cert.pem and key.pem (EC P-256, unencrypted) in folder; returns their paths and the cert's SHA-256 (hex)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                        x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    folder.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path, hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


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
