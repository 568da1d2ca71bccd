"""The admission policy `ngcx deploy --cloud kubernetes --dry-run -o DIR` writes beside the manifests.

No cluster and no admission controller run here. The policy is checked the way each project's API server would
check it: Kyverno's ClusterPolicy against Kyverno's own CRD schema, policy-controller's ClusterImagePolicy against
sigstore's (tests/deploy/data/README.md: which file at which commit, and how the Kyverno one is pruned), with
unknown fields refused as the API server prunes them. The rest ties the policy to what the registry really holds:
the image is a real signed push in the loopback registry (kubernetes_signed.py), the key in the policy verifies
its cosign signature (checked with `cryptography` from the signature tag's layer, not with ngcx's verifier), the
provenance condition holds for the SLSA statement ngcx attested, and the image patterns match the pod's image
and not a sibling repository's.
"""

from __future__ import annotations

import base64
import copy
import fnmatch
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_signed import SignedPush, loopback_registry, signed_push

from ngcx.deploy import keys
from ngcx.deploy.common import DeployConfig
from ngcx.deploy.kubernetes import manifests as kubernetes
from ngcx.deploy.kubernetes import policy

DATA = Path(__file__).parent / "data"
LABELS = {"ai.ngcx.compute-capabilities": "6.0+PTX", "ai.ngcx.min-driver": "535", "ai.ngcx.project.name": "resnet"}
CMD = ["ngcx-runtime", "serve", "/opt/ngcx/model/resnet.onnx", "--host", "0.0.0.0", "--name", "resnet"]
SCHEMAS = {"kyverno": "kyverno-clusterpolicy-v1.schema.json",
           "sigstore": "sigstore-clusterimagepolicy-v1beta1.schema.json"}
# policy-controller's own glob grammar (pkg/apis/glob/glob.go validGlob, at the commit data/README.md names)
SIGSTORE_GLOB = re.compile(r"^[a-zA-Z0-9-_:\/\*\.@]+$")


@pytest.fixture(scope="session")
def signed(tmp_path_factory) -> SignedPush:
    return signed_push(loopback_registry(), tmp_path_factory.mktemp("signer"))


@pytest.fixture(autouse=True)
def state(monkeypatch, tmp_path, signed) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NGCX_STATE_DIR", str(tmp_path / "state"))
    signed.share_key(tmp_path / "state")
    return tmp_path / "state"


def _config(signed: SignedPush, **trust: Any) -> DeployConfig:
    return DeployConfig(cloud="kubernetes", image="resnet:latest", pull_ref=None, registry=None, labels=dict(LABELS),
                        model="resnet", cmd=list(CMD), gpu="A10", pushes=[(signed.repository, signed.digest)],
                        **trust)


def _write(out: Path, signed: SignedPush, choice: str = policy.DEFAULT_POLICY,
           **trust: Any) -> tuple[kubernetes.Written, dict[str, Any]]:
    done = kubernetes.write(_config(signed, **trust), kubernetes.Options(out=out, policy=choice))
    return done, {rel: yaml.safe_load((out / rel).read_text()) for rel in done.files}


def _strict(node: Any) -> Any:
    """The CRD's structural schema as JSON Schema that refuses unknown fields where the API server prunes them."""
    if isinstance(node, dict):
        node = {k: _strict(v) for k, v in node.items()}
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


def _validator(controller: str) -> Any:
    import jsonschema

    schema = json.loads((DATA / SCHEMAS[controller]).read_text())
    for field, kind in (("apiVersion", "string"), ("kind", "string"), ("metadata", "object")):
        schema["properties"].setdefault(field, {"type": kind})   # the API server's own, whatever the CRD says
    return jsonschema.Draft7Validator(_strict(schema))


@pytest.fixture(scope="module")
def validators() -> dict[str, Any]:
    return {controller: _validator(controller) for controller in SCHEMAS}


def _errors(validator: Any, doc: dict[str, Any]) -> list[str]:
    return [f"{e.message} at {list(e.path)}" for e in sorted(validator.iter_errors(doc), key=str)]


# --------------------------------------------------------------------------------------------- the schemas


@pytest.mark.parametrize("controller, kind, api", [("kyverno", "ClusterPolicy", "kyverno.io/v1"),
                                                   ("sigstore", "ClusterImagePolicy", "policy.sigstore.dev/v1beta1")])
def test_the_policy_is_valid_against_its_projects_crd(tmp_path, signed, validators, controller, kind, api):
    done, docs = _write(tmp_path / "k8s", signed, controller)
    doc = docs[f"policy/{policy.FILES[controller]}"]
    assert (doc["kind"], doc["apiVersion"]) == (kind, api)
    assert not _errors(validators[controller], doc)
    assert done.admission is not None and doc["metadata"]["name"] == done.admission.name
    assert len(doc["metadata"]["name"]) <= 63          # Kyverno's webhook: api/kyverno/v1/utils.go ValidatePolicyName
    if controller == "kyverno":     # its webhook refuses mutateDigest under Audit (pkg/validation/policy/validate.go)
        rule = doc["spec"]["rules"][0]["verifyImages"][0]
        assert rule["mutateDigest"] and rule["verifyDigest"] and rule["required"]
        assert rule["failureAction"] == "Enforce"


@pytest.mark.parametrize("controller, edit", [
    ("kyverno", lambda d: d["spec"]["rules"][0]["verifyImages"][0].update(mutateDigests=True)),
    ("kyverno", lambda d: d["spec"]["rules"][0]["verifyImages"][0]["attestors"][0]["entries"][0]["keys"].update(
        publicKey="x")),
    ("kyverno", lambda d: d["spec"]["rules"][0]["verifyImages"][0].update(failureAction="Deny")),
    ("kyverno", lambda d: d["spec"]["rules"][0]["verifyImages"][0].update(required="yes")),
    ("sigstore", lambda d: d["spec"]["authorities"][0]["key"].update(pem="x")),
    ("sigstore", lambda d: d["spec"]["authorities"][0].update(ctlog={"skip": True})),   # no such field in v1beta1
    ("sigstore", lambda d: d["spec"]["images"][0].update(regex="x")),
])
def test_the_schemas_would_catch_a_misspelled_or_unknown_field(tmp_path, signed, validators, controller, edit):
    _, docs = _write(tmp_path / "k8s", signed, controller)
    bad = copy.deepcopy(docs[f"policy/{policy.FILES[controller]}"])
    edit(bad)
    assert _errors(validators[controller], bad)


# --------------------------------------------------------------------------------------------- what it enforces


def _policy_key(doc: dict[str, Any]) -> str:
    if doc["kind"] == "ClusterPolicy":
        rule = doc["spec"]["rules"][0]["verifyImages"][0]
        keys_ = [rule["attestors"][0]["entries"][0]["keys"],
                 rule["attestations"][0]["attestors"][0]["entries"][0]["keys"]]
        assert all(k["rekor"] == {"ignoreTlog": True} and k["ctlog"] == {"ignoreSCT": True} for k in keys_)
        assert keys_[0]["publicKeys"] == keys_[1]["publicKeys"]
        return keys_[0]["publicKeys"]
    authority = doc["spec"]["authorities"][0]
    assert "ctlog" not in authority      # a key authority without ctlog is checked with no transparency log
    return authority["key"]["data"]


@pytest.mark.parametrize("controller", ["kyverno", "sigstore"])
def test_the_key_in_the_policy_verifies_the_pushed_signature(tmp_path, signed, controller):
    """The signature at cosign's sha256-HEX.sig tag, checked as an admission controller would: the layer is the
    simple-signing payload naming the digest, the annotation its ECDSA P-256 signature over SHA-256."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    from ngcx.trust.ociref import Repo, parse_ref, sig_tag

    _, docs = _write(tmp_path / "k8s", signed, controller)
    public = load_pem_public_key(_policy_key(docs[f"policy/{policy.FILES[controller]}"]).encode())
    repo = Repo.of(parse_ref(f"{signed.repository}@{signed.digest}"))
    signature_layer = repo.manifest_json(sig_tag(signed.digest))["layers"][0]
    payload = repo.blob(signature_layer["digest"])
    assert json.loads(payload)["critical"]["image"]["docker-manifest-digest"] == signed.digest
    signature = base64.b64decode(signature_layer["annotations"]["dev.cosignproject.cosign/signature"])
    public.verify(signature, payload, ec.ECDSA(hashes.SHA256()))        # raises InvalidSignature otherwise
    private = (signed.state / "signing" / "cosign.key").read_text()
    body = "".join(line for line in private.splitlines() if not line.startswith("-----"))
    for path in (tmp_path / "k8s").rglob("*"):
        if path.is_file():
            assert body[:40] not in path.read_text().replace("\n", ""), path    # the private key is in no file


def _provenance(signed: SignedPush) -> dict[str, Any]:
    """The SLSA v1 statement ngcx attested for the digest (the .att tag's DSSE envelope)."""
    from ngcx.trust.ociref import Repo, att_tag, parse_ref

    repo = Repo.of(parse_ref(f"{signed.repository}@{signed.digest}"))
    for layer in repo.manifest_json(att_tag(signed.digest))["layers"]:
        if layer["annotations"]["predicateType"] == "https://slsa.dev/provenance/v1":
            envelope = json.loads(repo.blob(layer["digest"]))
            return json.loads(base64.b64decode(envelope["payload"]))
    raise AssertionError("no SLSA provenance attested")


def test_the_provenance_conditions_hold_for_what_ngcx_attested(tmp_path, signed):
    statement = _provenance(signed)
    _, kyverno = _write(tmp_path / "kyverno", signed, "kyverno")
    attestation = kyverno["policy/kyverno-clusterpolicy.yaml"]["spec"]["rules"][0]["verifyImages"][0][
        "attestations"][0]
    assert attestation["type"] == statement["predicateType"]
    condition = attestation["conditions"][0]["all"][0]
    path = re.fullmatch(r"\{\{ ([\w.]+) \}\}", condition["key"])[1]    # Kyverno's JMESPath over the predicate
    value: Any = statement["predicate"]
    for part in path.split("."):
        value = value[part]
    assert condition["operator"] == "Equals" and value == condition["value"]
    _, sigstore = _write(tmp_path / "sigstore", signed, "sigstore")
    wanted = sigstore["policy/sigstore-clusterimagepolicy.yaml"]["spec"]["authorities"][0]["attestations"][0]
    assert wanted["predicateType"] == statement["predicateType"]
    cue = wanted["policy"]["data"]     # CUE: `predicateType: "…"` and `predicate: runDetails: builder: id: "…"`
    kind = re.search(r'^predicateType: (".*")$', cue, re.M)
    builder = re.search(r'^predicate: runDetails: builder: id: (".*")$', cue, re.M)
    assert kind and json.loads(kind[1]) == statement["predicateType"]
    assert builder and json.loads(builder[1]) == statement["predicate"]["runDetails"]["builder"]["id"]


def test_the_patterns_match_the_pods_image_and_no_sibling_repository(tmp_path, signed):
    _, docs = _write(tmp_path / "kyverno", signed, "kyverno")
    image = docs["01-deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"{signed.repository}@{signed.digest}"
    sibling = f"{signed.repository}50@{signed.digest}"
    tagged = f"{signed.repository}:latest"
    patterns = docs["policy/kyverno-clusterpolicy.yaml"]["spec"]["rules"][0]["verifyImages"][0]["imageReferences"]
    kyverno = [lambda ref, p=p: fnmatch.fnmatchcase(ref, p) for p in patterns]   # Kyverno: '*' is any run
    _, docs = _write(tmp_path / "sigstore", signed, "sigstore")
    globs = [g["glob"] for g in docs["policy/sigstore-clusterimagepolicy.yaml"]["spec"]["images"]]
    assert all(SIGSTORE_GLOB.match(g) for g in globs)

    def sigstore_match(ref: str, glob: str) -> bool:   # glob.go Compile: '*' is any run without '/'
        return re.fullmatch(re.escape(glob).replace(r"\*", "[^/]*"), ref) is not None

    sigstore = [lambda ref, g=g: sigstore_match(ref, g) for g in globs]
    for matchers in (kyverno, sigstore):
        assert any(m(image) for m in matchers) and any(m(tagged) for m in matchers)
        assert not any(m(sibling) for m in matchers)


def test_the_policy_name_is_a_dns_label_per_repository():
    assert policy.policy_name("127.0.0.1:5000/team/resnet") == "ngcx-verify-127-0-0-1-5000-team-resnet"
    long_a, long_b = (f"registry.example.com/{'x' * 60}/{last}" for last in ("a", "b"))
    names = {policy.policy_name(long_a), policy.policy_name(long_b)}
    assert len(names) == 2
    assert all(len(n) <= 63 and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", n) for n in names)


# --------------------------------------------------------------------------------------------- when there is none


def test_policy_none_and_allow_unsigned_write_no_policy(tmp_path, signed, capsys):
    done, docs = _write(tmp_path / "none", signed, "none")
    assert done.admission is None and not any(rel.startswith("policy/") for rel in docs)
    assert any("no admission policy written (--policy none)" in line for line in kubernetes.summary(done, False))
    done, docs = _write(tmp_path / "unsigned", signed, allow_unsigned=True)
    assert done.admission is None and not any(rel.startswith("policy/") for rel in docs)
    assert any("(--allow-unsigned)" in line for line in kubernetes.summary(done, False))
    assert done.as_json()["admission_policy"] is None


def test_an_unknown_policy_is_one_line_before_anything(tmp_path, signed):
    from ngcx.core.errors import UserError

    with pytest.raises(UserError, match="unknown --policy 'opa'"):
        _write(tmp_path / "k8s", signed, "opa")
    assert not (tmp_path / "k8s").exists() and keys.get("k8s-resnet") is None


def test_a_missing_signing_key_writes_nothing(tmp_path, signed, state):
    """No key here: `policy.decide` refuses in one line before the endpoint key is made or a file written (the
    trust gate, which runs first in a fresh process, refuses the same way; this process may have its verdict)."""
    from ngcx.core.errors import UserError

    for name in ("cosign.key", "cosign.pub"):
        (state / "signing" / name).unlink()
    with pytest.raises(UserError, match="no signing key") as raised:
        _write(tmp_path / "k8s", signed)
    assert raised.value.exit_code == 2
    assert not (tmp_path / "k8s").exists() and not list(tmp_path.glob(".k8s*")) and keys.get("k8s-resnet") is None
    with pytest.raises(UserError, match="needs the public key its pushes are signed with: no signing key"):
        policy.decide(_config(signed), "kyverno", f"{signed.repository}@{signed.digest}")


def _ngcx(monkeypatch, capsys, signed: SignedPush, out: Path, *flags: str) -> tuple[int, str, str]:
    """`ngcx deploy resnet --cloud kubernetes --dry-run -o OUT` in this process, the image's labels and pushes from
    the test instead of Docker and the state."""
    import ngcx.deploy.image as image
    import ngcx.main

    monkeypatch.setattr(image, "resolve", lambda *a: ("resnet:latest", dict(LABELS)))
    monkeypatch.setattr(image, "pushes", lambda *a, **k: [(signed.repository, signed.digest)])
    args = ["deploy", "resnet", "--cloud", "kubernetes", "--dry-run", "-o", str(out), "--gpu", "A10", *flags, "--",
            *CMD]
    monkeypatch.setattr(sys, "argv", ["ngcx", *args])
    with pytest.raises(SystemExit) as exit_:
        ngcx.main.main(args)
    stdout, stderr = capsys.readouterr()
    return exit_.value.code or 0, stdout, stderr


def test_cli_writes_the_policy_and_says_who_applies_it(monkeypatch, capsys, tmp_path, signed):
    code, stdout, stderr = _ngcx(monkeypatch, capsys, signed, tmp_path / "k8s")
    assert code == 0, stderr
    out = tmp_path / "k8s"
    assert stdout.strip() == str(out) and (out / "policy" / "kyverno-clusterpolicy.yaml").is_file()
    line = next(line for line in stderr.splitlines() if "admission policy" in line)
    assert "Kyverno ClusterPolicy" in line and signed.repository in line
    assert f"kubectl apply -f {out}/policy" in line


def test_cli_policy_flag_picks_the_controller_or_none(monkeypatch, capsys, tmp_path, signed):
    code, _, stderr = _ngcx(monkeypatch, capsys, signed, tmp_path / "k8s", "--policy", "sigstore")
    assert code == 0, stderr
    assert [p.name for p in (tmp_path / "k8s" / "policy").iterdir()] == ["sigstore-clusterimagepolicy.yaml"]
    code, _, stderr = _ngcx(monkeypatch, capsys, signed, tmp_path / "none", "--policy", "none")
    assert code == 0 and not (tmp_path / "none" / "policy").exists(), stderr
    code, _, stderr = _ngcx(monkeypatch, capsys, signed, tmp_path / "bad", "--policy", "opa")
    assert code == 2 and "unknown --policy 'opa'" in stderr and len(stderr.strip().splitlines()) == 1


def test_cli_a_missing_signing_key_is_one_line_exit_2(monkeypatch, capsys, tmp_path, signed, state):
    for name in ("cosign.key", "cosign.pub"):
        (state / "signing" / name).unlink()
    code, _, err = _ngcx(monkeypatch, capsys, signed, tmp_path / "k8s")
    assert code == 2 and "no signing key" in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "k8s").exists() and not list(tmp_path.glob(".k8s*"))


def test_json_names_the_policy_and_its_key(tmp_path, signed):
    from ngcx.trust.keys import fingerprint

    done, _ = _write(tmp_path / "k8s", signed)
    shown = done.as_json()["admission_policy"]
    public = (signed.state / "signing" / "cosign.pub").read_bytes()
    assert shown == {"controller": "kyverno", "name": done.admission.name,
                     "file": "policy/kyverno-clusterpolicy.yaml", "key": fingerprint(public)}
