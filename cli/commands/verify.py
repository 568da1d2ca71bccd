"""`ngcx verify REF`: is the image REF serves now signed by the key, with its provenance (trust/verify.py)?"""

from __future__ import annotations

import typer

from .options import JsonOpt


def register(app: typer.Typer) -> None:
    app.command("verify")(verify_command)


def verify_command(
    ref: str = typer.Argument(..., help="HOST[:PORT]/REPOSITORY[:TAG|@sha256:DIGEST] in a registry, e.g. "
                                         "127.0.0.1:5000/team/pytorch:25.08-runtime."),
    key: str | None = typer.Option(None, "--key", help="Public key (PEM, e.g. cosign.pub) or awskms:///alias/NAME; "
                                                       "default: the key ngcx signs with on this machine."),
    json_out: JsonOpt = False,
) -> None:
    """Check the signature and the signed attestations (SLSA provenance, SBOM) against the digest REF resolves to.

    Exit 0 when they verify; exit 1 with one line naming what failed (no signature, signature does not match
    the key, signed digest differs, attestation edited)."""
    from ..core import output
    from ..core.errors import CheckFailed
    from ..trust.verify import verify

    verdict = verify(ref, key)
    if json_out:
        output.emit_json(verdict.as_dict())
    elif verdict.ok:
        print(verdict.line())
    if not verdict.ok:
        import sys

        print(f"ngcx: error: {verdict.line()}", file=sys.stderr)
        raise CheckFailed()
