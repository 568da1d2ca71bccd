"""The admission policy `--cloud kubernetes` writes beside the manifests: the cluster refuses a pod whose image from
the pushed repository is not signed by ngcx's key or lacks ngcx's SLSA provenance (issue 48, item 4).

Why an admission policy and not a check in the pod: the CLI verifies before it writes (deploy/gate.py) and a cloud
host verifies before `docker run`, but a cluster starts pods on its own (a rolling update, the HPA, a node drain, a
user's `kubectl set image`); only the API server's admission webhook sees every one of them. KServe and SkyPilot
leave this to Kyverno or sigstore's policy-controller, so ngcx writes the policy for either, with the public key
that verifies its signatures (keys.py: cosign's ECDSA P-256 format, the one both controllers read). The key is
public: it may sit in the folder that is committed and applied by CI.

`--policy kyverno` (the default), `--policy sigstore`, `--policy none`. Why Kyverno by default:
- it enforces in every namespace once applied, while policy-controller's webhook only looks at namespaces labelled
  `policy.sigstore.dev/include=true` (its config/500-webhook-configuration.yaml namespaceSelector): a policy
  written for it protects nothing until someone labels the namespace;
- its attestation check reads the provenance's content (a condition that the SLSA v1 statement names ngcx's
  builder, cli/trust/attest.py BUILDER_ID), and `mutateDigest`/`verifyDigest` keep a tag from ever reaching a node;
  policy-controller needs a CUE policy for the same (written, but evaluated only by its webhook).
Both are written from templates (recipes/deploy/kubernetes/*-policy.yaml.j2) and validated in tests against each
project's own CRD schema (tests/deploy/data/README.md says which file at which commit).

Facts the templates rest on, read from the projects' sources:
- No transparency log: `ngcx push` signs offline (nothing goes to Rekor), so Kyverno's key attestor sets
  `rekor.ignoreTlog` and `ctlog.ignoreSCT` (the CRD's "Set to true if this was opted out during signing"). The
  ClusterImagePolicy v1beta1 CRD has no skip field: a `key` authority without `ctlog` is verified with no tlog
  (pkg/webhook/validator.go: no Rekor client and no keys -> IgnoreTlog), as the project's own e2e policy
  test/testdata/policy-controller/e2e/cip-key-with-attestations-no-rekor.yaml does; so `ctlog` is left out.
- Image patterns: `REPO:*` and `REPO@*`, not `REPO*`, which would also catch a sibling repository (team/resnet50
  under a policy for team/resnet) and refuse its pods under a key that never signed them.
- Kyverno's rule-level `failureAction: Enforce` (spec-level `validationFailureAction` is deprecated in its CRD):
  Kyverno 1.13 or newer.
- `--allow-unsigned` deploys what nothing vouches for, so no policy is written then (it would refuse the pod).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from ...core.errors import UserError

POLICIES = ("kyverno", "sigstore", "none")
DEFAULT_POLICY = "kyverno"
FOLDER = "policy"   # cluster-scoped and needing the controller's CRDs: a cluster admin applies it, once per repository
FILES = {"kyverno": "kyverno-clusterpolicy.yaml", "sigstore": "sigstore-clusterimagepolicy.yaml"}
KINDS = {"kyverno": "Kyverno ClusterPolicy", "sigstore": "policy-controller ClusterImagePolicy"}
KEY_HINT = ("push the image first (ngcx push signs it with ngcx's key, made on first use), pass the signer's "
            "--verify-key, or add --policy none")
NAME_MAX = 63       # Kyverno refuses a longer policy name (api/kyverno/v1/utils.go ValidatePolicyName)


@dataclass(frozen=True)
class Admission:
    """What the policy says: which controller, which repository, which key."""

    kind: str                  # kyverno | sigstore
    repository: str            # REGISTRY/REPO the pods pull from
    public_pem: str            # PEM SubjectPublicKeyInfo, canonical (re-encoded), no trailing newline
    fingerprint: str           # sha256:HEX of the key's DER (keys.fingerprint)

    @property
    def file(self) -> str:
        return f"{FOLDER}/{FILES[self.kind]}"

    @property
    def name(self) -> str:
        return policy_name(self.repository)


def check_choice(policy: str) -> None:
    if policy not in POLICIES:
        raise UserError(f"unknown --policy {policy!r}", hint=f"use one of: {', '.join(POLICIES)}")


def decide(config: Any, policy: str, image_ref: str) -> Admission | None:
    """The policy to write for the pushed REPO@DIGEST, or None (--policy none, or --allow-unsigned).

    The key is read before anything is made or written, so a missing one leaves nothing behind. It is the key the
    trust gate verified the push with (DeployConfig.trust_key: --verify-key, else ngcx's own; deploy/gate.py)."""
    check_choice(policy)
    if policy == "none" or config.allow_unsigned:
        return None
    repository = image_ref.rsplit("@", 1)[0]
    pem = public_pem(config.trust_key, repository)
    from ...trust.keys import fingerprint

    return Admission(kind=policy, repository=repository, public_pem=pem.decode().strip(),
                     fingerprint=fingerprint(pem))


def public_pem(key: str | None, repository: str) -> bytes:
    """The verifying key as canonical PEM: --verify-key's, else this machine's STATE/signing/cosign.pub (trust/keys.py).

    Re-encoded from the parsed key, so the text put into YAML is base64 lines and the PEM armour only, whatever
    else the file held; a key that is not EC P-256 is refused (the controllers verify cosign's ECDSA scheme)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from ...trust.keys import public_key_for

    try:
        data = public_key_for(key)
    except UserError as exc:
        raise UserError(f"the admission policy for {repository} needs the public key its pushes are signed with: "
                        f"{exc.message}", hint=KEY_HINT) from None
    try:
        parsed = serialization.load_pem_public_key(data)
    except ValueError:
        raise UserError(f"key {key} is not a PEM public key", hint="pass the signer's cosign.pub") from None
    if not isinstance(parsed, ec.EllipticCurvePublicKey) or parsed.curve.name != "secp256r1":
        raise UserError(f"key {key} is not an ECDSA P-256 key (cosign's scheme, which the admission controllers "
                        "verify)", hint="pass the signer's cosign.pub")
    return parsed.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def policy_name(repository: str) -> str:
    """`ngcx-verify-<repository>` as a DNS-1123 name of at most 63 characters (a hash keeps long ones apart).

    One per repository, not per deploy: a second deploy of the same repository applies the same object again."""
    base = "ngcx-verify-" + re.sub(r"[^a-z0-9]+", "-", repository.lower()).strip("-")
    if len(base) <= NAME_MAX:
        return base
    tag = hashlib.sha256(repository.encode()).hexdigest()[:8]
    return f"{base[:NAME_MAX - 9].rstrip('-')}-{tag}"


def values(admission: Admission, labels: dict[str, str]) -> dict[str, Any]:
    """Everything the policy templates write, decided here."""
    from ...trust.attest import BUILDER_ID, SLSA_PROVENANCE

    repo = admission.repository
    return {"name": admission.name, "repository": repo, "patterns": [f"{repo}:*", f"{repo}@*"],
            "public_key": admission.public_pem, "fingerprint": admission.fingerprint,
            "labels": {"app.kubernetes.io/managed-by": labels["app.kubernetes.io/managed-by"]},
            "provenance_type": SLSA_PROVENANCE, "builder_id": BUILDER_ID,
            # Kyverno's JMESPath over the statement's predicate (not Jinja: the template writes it as a value)
            "builder_key": "{{ runDetails.builder.id }}"}


def render(admission: Admission, labels: dict[str, str], env: Any) -> dict[str, str]:
    """{file: YAML text} of the policy (manifests.py's Jinja environment: StrictUndefined, the `y` filter)."""
    template = env.get_template(f"{admission.kind}-policy.yaml.j2")
    return {admission.file: template.render(**values(admission, labels))}


def summary(admission: Admission | None, out: str, why_none: str) -> str:
    """The line `deploy` prints about the policy."""
    if admission is None:
        return f"no admission policy written ({why_none}): the cluster admits any image"
    where = ("; policy-controller enforces only in namespaces labelled policy.sigstore.dev/include=true"
             if admission.kind == "sigstore" else "")
    return (f"admission policy ({KINDS[admission.kind]} {admission.name}): pods from {admission.repository} run "
            f"only when signed by key {admission.fingerprint[:19]}… with ngcx's SLSA provenance; a cluster admin "
            f"applies it once: kubectl apply -f {out}/{FOLDER}{where}")
