"""A project's model signed at `ngcx build` in the OpenSSF Model Signing format (issue 48, item 5).

Why this format and this library: NGC signs its models with OpenSSF Model Signing (OMS); its reference
implementation is PyPI's `model-signing` (sigstore/model-transparency), whose key-based signer
(`model_signing.signing.Config().use_elliptic_key_signer(private_key=PATH)`) writes a Sigstore bundle JSON:
a DSSE envelope over an in-toto statement that lists each model file with its sha256, signed ECDSA P-256.
The key is ngcx's own signing key (cli/trust/keys.py: STATE/signing/cosign.key, made on first use), the one
that signs pushed images, so one public key (cosign.pub) vouches for both. `model-signing` is imported only here,
only when a project with a model builds.

What goes into the image (recipes/project.Dockerfile.j2, right after the model's own layer, so a code edit never
re-runs it): MODEL.sig and MODEL.pub beside the model in /opt/ngcx/model; `ngcx-runtime serve` verifies the model
against them before it loads (runtime/modelsig.py) and refuses to start when a byte changed. The public key is
public (allowed in a layer); the private key never leaves the state folder.

Why a cached signature: ECDSA signatures are randomized, so signing again on every build would change the
signature's layer and with it every later layer (and the image ID) on a build where nothing changed. The bundle is
kept in the project's state folder (projects/NAME/model-signature.json) keyed by the model's sha256 and the key's
fingerprint, and made again only when either changes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import UserError

if TYPE_CHECKING:
    from .render import Plan
    from .spec import Project

CACHE_FILE = "model-signature.json"
SIG_SUFFIX, KEY_SUFFIX = ".sig", ".pub"        # as runtime/modelsig.py looks for them beside the model
LABEL_SIGNATURE = "ai.ngcx.project.model-signature"        # where the .sig is in the image
LABEL_SIGNING_KEY = "ai.ngcx.project.model-signing-key"    # sha256:HEX of the public key (keys.fingerprint)
INSTALL_HINT = "install it: pip install 'model-signing' pyopenssl (ngcx's dependencies; reinstall ngcx)"


@dataclass(frozen=True)
class ModelSignature:
    """The signature and public key for the build context, and the labels that say where they are."""

    bundle: bytes
    public_pem: bytes
    model_name: str
    key_fingerprint: str

    def context_files(self) -> dict[str, bytes]:
        """Context paths beside model/NAME, copied to the image's model folder."""
        return {f"model/{self.model_name}{SIG_SUFFIX}": self.bundle,
                f"model/{self.model_name}{KEY_SUFFIX}": self.public_pem}

    def labels(self, model_dir: str) -> dict[str, str]:
        return {LABEL_SIGNATURE: f"{model_dir}/{self.model_name}{SIG_SUFFIX}",
                LABEL_SIGNING_KEY: self.key_fingerprint}


def sign_model(project: Project, folder: Path, model_sha: str | None) -> ModelSignature | None:
    """The project's model signed with ngcx's key (None for a project without a model); reused from the last
    build while the model's sha256 and the key are the same."""
    from ..trust import keys

    if project.model is None or model_sha is None:
        return None
    key_path = keys.ensure_default_key()
    public = keys.FileSigner(key_path).public_pem()
    fingerprint = keys.fingerprint(public)
    cached = _cached(folder, model_sha, fingerprint)
    bundle = cached if cached is not None else _sign(project.model, key_path)
    if cached is None:
        _save(folder, model_sha, fingerprint, bundle)
    return ModelSignature(bundle, public, project.model.name, fingerprint)


def annotate(plan: Plan, signed: ModelSignature | None) -> Plan:
    """The plan with the signature's COPY step and labels (render.Plan.model_signature)."""
    from .render import quote

    if signed is None:
        return plan
    extra = tuple((k, quote(v, f"label {k}")) for k, v in signed.labels(plan.model_dir).items())
    return dataclasses.replace(plan, model_signature=True, labels=plan.labels + extra)


def context_files(signed: ModelSignature | None) -> dict[str, bytes]:
    """What the build context adds for the signature (nothing without one)."""
    return signed.context_files() if signed is not None else {}


def _sign(model: Path, key_path: Path) -> bytes:
    """model_signing's key-based signer over the model file or folder; the bundle's bytes."""
    try:
        from model_signing import signing
    except ImportError as exc:
        raise UserError(f"cannot sign the model: the model-signing library is not importable ({exc})",
                        hint=INSTALL_HINT) from None
    with tempfile.TemporaryDirectory(prefix="ngcx-modelsig-") as tmp:
        out = Path(tmp) / "model.sig"
        try:
            signing.Config().use_elliptic_key_signer(private_key=key_path).sign(model, out)
        except (ValueError, OSError) as exc:
            first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            raise UserError(f"cannot sign model {model}: {first}",
                            hint="a model folder must hold regular files (no symbolic links)") from None
        return out.read_bytes()


def _cached(folder: Path, model_sha: str, fingerprint: str) -> bytes | None:
    try:
        data = json.loads((folder / CACHE_FILE).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("model_sha256") != model_sha or data.get("key") != fingerprint:
        return None
    bundle = data.get("bundle")
    return bundle.encode() if isinstance(bundle, str) else None


def _save(folder: Path, model_sha: str, fingerprint: str, bundle: bytes) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{CACHE_FILE}.tmp"
    tmp.write_text(json.dumps({"model_sha256": model_sha, "key": fingerprint, "bundle": bundle.decode()}))
    os.replace(tmp, folder / CACHE_FILE)
