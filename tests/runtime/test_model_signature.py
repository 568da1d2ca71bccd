"""A signed model is checked before `ngcx-runtime serve` loads it (issue 48 item 5; runtime/modelsig.py).

The signatures here are made by the PyPI `model-signing` library itself (the OpenSSF Model Signing reference
implementation, key-based), and every verdict of the runtime's own pure-Python verifier is compared with that
library's verifier: the same models pass, the same tampered ones fail. What a user notices: a model whose bytes
changed after signing is one line and exit 2, naming the file and both sha256, and no server starts.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import subprocess
import sys
import urllib.request
from pathlib import Path

import models
import pytest

from ngcx_runtime import modelsig
from ngcx_runtime.errors import RuntimeUserError

model_signing = pytest.importorskip("model_signing")
pytest.importorskip("onnxruntime")

SERVE = [sys.executable, "-m", "ngcx_runtime.cli", "serve"]


def _keypair(folder: Path, name: str = "key") -> tuple[Path, Path]:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP256R1())
    private, public = folder / f"{name}.pem", folder / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


def _sign(model: Path, private: Path, public: Path) -> Path:
    """MODEL.sig and MODEL.pub beside the model, as `ngcx build` lays them out, signed by model-signing."""
    sig = modelsig.signature_path(model)
    model_signing.signing.Config().use_elliptic_key_signer(private_key=private).sign(model, sig)
    modelsig.key_path(model).write_bytes(public.read_bytes())
    return sig


def _library_accepts(model: Path, public: Path, sig: Path) -> bool:
    """The reference verdict: model-signing's own key-based verifier (ValueError for a model or key that does not
    match, cryptography's InvalidSignature for a signature that does not verify)."""
    from cryptography.exceptions import InvalidSignature

    try:
        model_signing.verifying.Config().use_elliptic_key_verifier(public_key=public).verify(model, sig)
    except (ValueError, InvalidSignature):
        return False
    return True


def _runtime_accepts(model: Path, public: Path | None = None) -> bool:
    try:
        return modelsig.check_model(model, public) is not None
    except RuntimeUserError:
        return False


@pytest.fixture
def signed_file(tmp_path) -> tuple[Path, Path, Path]:
    private, public = _keypair(tmp_path)
    model = models.mlp(tmp_path / "model" / "mlp.onnx")
    return model, public, _sign(model, private, public)


def test_a_signed_model_verifies_and_a_changed_byte_is_named_with_both_sha256(signed_file):
    model, public, sig = signed_file
    assert _library_accepts(model, public, sig) and _runtime_accepts(model)
    before = hashlib.sha256(model.read_bytes()).hexdigest()
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0x01
    model.write_bytes(bytes(data))
    after = hashlib.sha256(data).hexdigest()
    assert not _library_accepts(model, public, sig)
    with pytest.raises(RuntimeUserError) as refused:
        modelsig.check_model(model)
    line = str(refused.value)
    assert "\n" not in line and str(model) in line and before in line and after in line, line


def test_a_folder_model_verifies_and_an_added_or_changed_file_is_refused_as_the_library_does(tmp_path):
    private, public = _keypair(tmp_path)
    folder = tmp_path / "saved"
    (folder / "variables").mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(secrets.token_bytes(4096))
    (folder / "variables" / "data-00000").write_bytes(secrets.token_bytes(10000))
    (folder / ".gitattributes").write_text("*.pb lfs\n")         # model-signing leaves git files out
    sig = _sign(folder, private, public)
    assert _library_accepts(folder, public, sig) and _runtime_accepts(folder)
    (folder / ".gitattributes").write_text("changed\n")
    assert _library_accepts(folder, public, sig) and _runtime_accepts(folder)
    extra = folder / "variables" / "extra.bin"
    extra.write_bytes(b"x")
    assert not _library_accepts(folder, public, sig) and not _runtime_accepts(folder)
    extra.unlink()
    with open(folder / "variables" / "data-00000", "r+b") as f:
        f.seek(5000)
        f.write(b"\0")
    assert not _library_accepts(folder, public, sig)
    with pytest.raises(RuntimeUserError, match="variables/data-00000 changed after signing"):
        modelsig.check_model(folder)


def test_another_key_an_edited_statement_and_a_replaced_signature_are_refused_as_the_library_does(signed_file,
                                                                                                  tmp_path):
    model, public, sig = signed_file
    _, other = _keypair(tmp_path, "other")
    assert not _library_accepts(model, other, sig) and not _runtime_accepts(model, other)

    bundle = json.loads(sig.read_text())
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    statement["predicate"]["resources"][0]["digest"] = "0" * 64      # vouch for other bytes
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    edited = sig.with_name("edited.sig")
    edited.write_text(json.dumps(bundle))
    assert not _library_accepts(model, public, edited)
    with pytest.raises(RuntimeUserError, match="does not verify"):
        modelsig.check_model(model, public, edited)

    bundle = json.loads(sig.read_text())
    der = bytearray(base64.b64decode(bundle["dsseEnvelope"]["signatures"][0]["sig"]))
    der[-1] ^= 0x01
    bundle["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(der)).decode()
    edited.write_text(json.dumps(bundle))
    assert not _library_accepts(model, public, edited) and not _runtime_accepts_sig(model, public, edited)


def _runtime_accepts_sig(model: Path, public: Path, sig: Path) -> bool:
    try:
        return modelsig.check_model(model, public, sig) is not None
    except RuntimeUserError:
        return False


def test_the_pure_python_ecdsa_agrees_with_cryptography_on_signatures_and_forgeries():
    """Checked against OpenSSL (through `cryptography`): its signatures verify; a changed message, a changed
    signature and another key's signature do not."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    for _ in range(8):
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
        point = modelsig.public_point(pem)
        message = secrets.token_bytes(64)
        sig = key.sign(message, ec.ECDSA(hashes.SHA256()))
        assert modelsig.ecdsa_verify(point, message, sig)
        assert not modelsig.ecdsa_verify(point, message + b"!", sig)
        other = ec.generate_private_key(ec.SECP256R1()).sign(message, ec.ECDSA(hashes.SHA256()))
        assert not modelsig.ecdsa_verify(point, message, other)
        assert not modelsig.ecdsa_verify(point, message, sig[:-1] + bytes([sig[-1] ^ 1]))
        assert modelsig.canonical_pem(pem.replace(b"\n", b"\r\n")) == pem


def test_a_p384_key_is_refused_in_one_line(tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = ec.generate_private_key(ec.SECP384R1()).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    with pytest.raises(RuntimeUserError, match="not an EC P-256 key"):
        modelsig.public_point(pem)


# ------------------------------------------------------------------------------------------------ the command


def test_serve_refuses_a_tampered_model_in_one_line_before_listening(signed_file):
    model, _public, _sig = signed_file
    with open(model, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0xFF]))
    done = subprocess.run([*SERVE, str(model), "--port", "0"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "listening" not in done.stdout and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("ngcx-runtime serve: model file ") and "changed after signing" in line, line


def test_serve_with_model_key_needs_a_signature_and_the_right_key(tmp_path):
    model = models.mlp(tmp_path / "mlp.onnx")
    _, public = _keypair(tmp_path)
    done = subprocess.run([*SERVE, str(model), "--port", "0", "--model-key", str(public)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "has no signature at" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    private, _ = _keypair(tmp_path, "signer")
    model_signing.signing.Config().use_elliptic_key_signer(private_key=private).sign(
        model, modelsig.signature_path(model))
    done = subprocess.run([*SERVE, str(model), "--port", "0", "--model-key", str(public)], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "made by another key" in done.stderr, done.stderr


def test_serve_verifies_a_signed_model_then_serves_it(signed_file):
    model, public, _sig = signed_file
    proc = subprocess.Popen([*SERVE, str(model), "--port", "0", "--model-key", str(public)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        first = proc.stdout.readline()
        assert first.startswith("model: signature verified (1 file(s)"), first
        listening = proc.stdout.readline()
        url = listening.split("listening at ")[1].split()[0]
        with urllib.request.urlopen(f"{url}/v2/health/live", timeout=10) as answer:
            assert answer.status == 200
    finally:
        proc.terminate()
        proc.wait(30)
