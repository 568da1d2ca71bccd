"""`ngcx deploy --cloud kubernetes --dry-run -o DIR`: the manifests it writes, checked as a cluster would check them.

No cluster runs here. Every manifest, for every GPU kind of both offers tables under its provider's node labels
(ACK: aliyun's table, EKS: aws's), with and without --kserve and --min/--max, is validated against the OpenAPI
schemas of the three newest Kubernetes minors that kubernetes-validate ships, in strict mode (an unknown field
fails, as `kubectl apply --validate=strict` refuses it), and the InferenceService against KServe's CRD schema
(tests/deploy/data/, pruned to what the manifests use), with unknown fields rejected wherever the CRD does.
The rest is what a user would notice: the key is in no file, the Secret holds its hash, the probes, the GPU limit,
the node selection, and the one-line mistakes. The image is a real signed push in the loopback registry
(kubernetes_signed.py): the deploy's trust gate verifies it before a manifest is written. The admission policy
written beside the manifests has its own tests (test_kubernetes_policy.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_signed import SignedPush, loopback_registry, signed_push

from ngcx.deploy import keys, offers
from ngcx.deploy.common import DeployConfig
from ngcx.deploy.kubernetes import manifests as kubernetes

DATA = Path(__file__).parent / "data"
PUSHED: list[tuple[str, str]] = []   # (REGISTRY/REPO, digest) of the session's signed push (fixture `signed`)
LABELS = {"ai.ngcx.compute-capabilities": "6.0+PTX", "ai.ngcx.min-driver": "535", "ai.ngcx.project.name": "resnet"}
CMD = ["ngcx-runtime", "serve", "/opt/ngcx/model/resnet.onnx", "--host", "0.0.0.0", "--name", "resnet"]


def _minors() -> list[str]:
    from kubernetes_validate import utils

    minors = {utils.major_minor(v) for v in utils.all_versions()}
    return sorted(minors, key=lambda v: tuple(map(int, v.split("."))))[-3:]


MINORS = _minors()


@pytest.fixture(scope="session")
def signed(tmp_path_factory) -> SignedPush:
    push = signed_push(loopback_registry(), tmp_path_factory.mktemp("signer"))
    PUSHED[:] = [(push.repository, push.digest)]
    return push


@pytest.fixture(autouse=True)
def state(monkeypatch, tmp_path, signed) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NGCX_STATE_DIR", str(tmp_path / "state"))
    signed.share_key(tmp_path / "state")     # this machine's key: the one the push was signed with
    return tmp_path / "state"


def _config(gpu: str | None = None, auth: bool = True, **trust: Any) -> DeployConfig:
    return DeployConfig(cloud="kubernetes", image="resnet:latest", pull_ref=None, registry=None, labels=dict(LABELS),
                        model="resnet", cmd=list(CMD), gpu=gpu, auth=auth, pushes=list(PUSHED), **trust)


def _write(out: Path, gpu: str | None = None, provider: str | None = None, auth: bool = True,
           **flags: Any) -> tuple[kubernetes.Written, dict[str, Any]]:
    done = kubernetes.write(_config(gpu, auth), kubernetes.Options(out=out, provider=provider, **flags))
    docs = {rel: yaml.safe_load((out / rel).read_text()) for rel in done.files}
    return done, docs


def _matrix() -> list[tuple[str, str]]:
    table = kubernetes.node_table()["providers"]
    return [(provider, gpu) for provider in kubernetes.PROVIDERS for gpu in table[provider]["gpus"]]


# --------------------------------------------------------------------------------------------- the data


def test_every_gpu_kind_of_both_offers_tables_has_node_label_values():
    table = kubernetes.node_table()["providers"]
    for provider in kubernetes.PROVIDERS:
        kinds = {t.gpu for t in offers.load_table(table[provider]["offers"])[0]}
        assert set(table[provider]["gpus"]) == kinds, provider


# --------------------------------------------------------------------------------------------- the schemas


@pytest.fixture(scope="module")
def every_manifest(tmp_path_factory, signed) -> dict[str, dict[str, Any]]:
    """Every distinct manifest of the matrix: provider x GPU kind x (--kserve) x (--replicas 2 | --min 1 --max 4),
    and --kserve --min 0 --max 4 (Serverless)."""
    state = tmp_path_factory.mktemp("state")
    signed.share_key(state)
    old = os.environ.get("NGCX_STATE_DIR")
    os.environ["NGCX_STATE_DIR"] = str(state)
    try:
        unique: dict[str, dict[str, Any]] = {}
        for provider, gpu in _matrix():
            for kserve in (False, True):
                for scale in ({"replicas": 2}, {"min_replicas": 1, "max_replicas": 4}, {},
                              *([{"min_replicas": 0, "max_replicas": 4}] if kserve else [])):
                    out = tmp_path_factory.mktemp("out") / "k8s"
                    _, docs = _write(out, gpu, provider, kserve=kserve, **scale)
                    for rel, doc in docs.items():
                        if rel.startswith("policy/"):     # not Kubernetes' own kinds: test_kubernetes_policy.py
                            continue
                        unique.setdefault(json.dumps(doc, sort_keys=True), dict(doc, _file=rel))
    finally:
        if old is None:
            os.environ.pop("NGCX_STATE_DIR", None)
        else:
            os.environ["NGCX_STATE_DIR"] = old
    return unique


def test_the_three_newest_minors_are_checked():
    assert len(MINORS) == 3 and MINORS[-1] >= "1.35"


@pytest.mark.parametrize("minor", MINORS)
def test_every_manifest_is_valid_kubernetes_strict(every_manifest, minor):
    import kubernetes_validate

    kinds = set()
    for doc in every_manifest.values():
        doc = {k: v for k, v in doc.items() if k != "_file"}
        kinds.add(doc["kind"])
        if doc["kind"] == "InferenceService":
            continue
        try:
            kubernetes_validate.validate(doc, minor, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{doc['kind']} {doc['metadata']['name']} on {minor}: {exc}")
    assert kinds == {"Secret", "Deployment", "Service", "HorizontalPodAutoscaler", "PodDisruptionBudget",
                     "InferenceService"}


def test_strict_validation_would_catch_an_unknown_field(every_manifest):
    import kubernetes_validate

    deployment = next(d for d in every_manifest.values() if d["kind"] == "Deployment")
    bad = json.loads(json.dumps({k: v for k, v in deployment.items() if k != "_file"}))
    bad["spec"]["template"]["spec"]["containers"][0]["probes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, MINORS[-1], strict=True)


def _strict(node: Any) -> Any:
    """The CRD's structural schema as JSON Schema that refuses unknown fields where the API server prunes them:
    every object with properties and no additionalProperties, unless it preserves unknown fields."""
    if isinstance(node, dict):
        node = {k: _strict(v) for k, v in node.items()}
        if ("properties" in node and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")):
            node["additionalProperties"] = False
        return node
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@pytest.fixture(scope="module")
def kserve_validator():
    import jsonschema

    schema = _strict(json.loads((DATA / "kserve-inferenceservice-v1beta1.schema.json").read_text()))
    return jsonschema.Draft7Validator(schema)


def test_every_inference_service_is_valid_against_kserves_crd(every_manifest, kserve_validator):
    services = [d for d in every_manifest.values() if d["kind"] == "InferenceService"]
    assert len(services) >= len(_matrix())
    for doc in services:
        doc = {k: v for k, v in doc.items() if k != "_file"}
        errors = sorted(kserve_validator.iter_errors(doc), key=str)
        assert not errors, f"{doc['metadata']['annotations']}: {errors[0].message} at {list(errors[0].path)}"


def test_the_kserve_schema_would_catch_an_unknown_field(every_manifest, kserve_validator):
    doc = next(d for d in every_manifest.values() if d["kind"] == "InferenceService")
    bad = json.loads(json.dumps({k: v for k, v in doc.items() if k != "_file"}))
    bad["spec"]["predictor"]["containers"][0]["gpus"] = 1
    assert list(kserve_validator.iter_errors(bad))


# --------------------------------------------------------------------------------------------- what a user notices


def test_the_key_is_in_no_file_and_the_secret_holds_its_hash(tmp_path):
    done, docs = _write(tmp_path / "k8s", "A10", kserve=True, min_replicas=1, max_replicas=3)
    key = keys.get(done.key_name)
    assert done.key_name == "k8s-resnet" and key and done.key == key
    for path in (tmp_path / "k8s").rglob("*"):
        if path.is_file():
            assert key not in path.read_text(), path
    secret = docs["00-secret.yaml"]
    assert secret["kind"] == "Secret" and keys.digest(key) in secret["stringData"]["keys"].split()
    for pod in (docs["01-deployment.yaml"]["spec"]["template"]["spec"], docs["kserve/inferenceservice.yaml"]["spec"]
                ["predictor"]):
        volume = next(v for v in pod["volumes"] if "secret" in v)
        assert volume["secret"]["secretName"] == secret["metadata"]["name"]
        container = pod["containers"][0]
        mount = next(m for m in container["volumeMounts"] if m["name"] == volume["name"])
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["NGCX_RUNTIME_AUTH_KEYS"] == mount["mountPath"] + "/keys" and mount["readOnly"]
    again, _ = _write(tmp_path / "again", "A10")
    assert again.key is None and keys.get("k8s-resnet") == key     # a second run keeps the key; shows it no more


def test_no_auth_writes_no_secret(tmp_path):
    done, docs = _write(tmp_path / "k8s", "T4", "eks", auth=False)
    assert done.key_name is None and "00-secret.yaml" not in docs
    env = {e["name"] for e in docs["01-deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert "NGCX_RUNTIME_AUTH_KEYS" not in env


def test_the_pod_runs_the_pushed_digest_with_the_deploys_command_probes_gpu_and_cache(tmp_path, signed):
    _, docs = _write(tmp_path / "k8s", "L4")
    pod = docs["01-deployment.yaml"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == f"{signed.repository}@{signed.digest}" and container["args"] == CMD
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert container["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert container["startupProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    cache = next(m for m in container["volumeMounts"] if m["mountPath"] == "/var/cache/ngcx/plans")
    assert any(v["name"] == cache["name"] and "emptyDir" in v for v in pod["volumes"])
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] and not context["allowPrivilegeEscalation"]
    assert context["capabilities"]["drop"] == ["ALL"] and pod["securityContext"]["runAsNonRoot"]


def test_a_pod_of_n_gpus_asks_for_them_and_lands_only_where_a_node_has_them(tmp_path):
    """--gpus-per-pod 4: nvidia.com/gpu 4, the instance types kept are those with 4 GPUs or more (the offers table's
    gpu_count), the command serves on all of them (no --gpus: serve's default spread), and the summary says so."""
    done, docs = _write(tmp_path / "four", "A10G", "eks", gpus_per_pod=4)
    pod = docs["01-deployment.yaml"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 4 and pod["containers"][0]["args"] == CMD
    four = {t.name for t in offers.load_table("aws")[0] if t.gpu == "A10G" and t.gpu_count >= 4}
    assert four and set(_terms(docs)["node.kubernetes.io/instance-type"]) == four, "g5.xlarge (1 GPU) is left out"
    assert docs["01-deployment.yaml"]["metadata"]["annotations"]["ngcx.ai/gpus-per-pod"] == "4"
    assert done.gpus_per_pod == 4 and done.as_json()["gpus_per_pod"] == 4
    assert "4 GPUs per pod, all serving" in kubernetes.summary(done, show_key=False)[0]
    most = max(t.gpu_count for t in offers.load_table("aws")[0] if t.gpu == "A10G")
    done, docs = _write(tmp_path / "node", "A10G", "eks", gpus_per_pod="node")
    assert done.gpus_per_pod == most and docs["01-deployment.yaml"]["spec"]["template"]["spec"]["containers"][0][
        "resources"]["limits"]["nvidia.com/gpu"] == most
    _, one = _write(tmp_path / "one", "A10G", "eks")
    assert "g5.xlarge" in _terms(one)["node.kubernetes.io/instance-type"], "one GPU per pod by default, as before"


@pytest.mark.parametrize("flags, cmd, words", [
    ({"gpus_per_pod": 32}, CMD, "--gpus-per-pod 32: give a number of GPUs from 1 to 16"),
    ({"gpus_per_pod": "many"}, CMD, "--gpus-per-pod 'many'"),
    ({"gpus_per_pod": 16}, CMD, "has 16 GPUs (the most is"),
    ({"gpus_per_pod": 4}, [*CMD, "--gpus", "0"], "serves on --gpus 0, but each pod asks for 4 GPUs"),
    ({"gpus_per_pod": 2}, [*CMD, "--gpus=1"], "serves on --gpus 1, but each pod asks for 2 GPUs"),
])
def test_a_pod_whose_gpus_would_not_all_serve_is_one_line(tmp_path, flags, cmd, words):
    from ngcx.core.errors import UserError

    config = _config("A10G")
    config.cmd = list(cmd)
    with pytest.raises(UserError, match=words.replace("(", "\\(").replace(")", "\\)")):
        kubernetes.write(config, kubernetes.Options(out=tmp_path / "k8s", provider="eks", **flags))
    assert not (tmp_path / "k8s").exists()


def _terms(docs: dict[str, Any]) -> dict[str, list[str]]:
    pod = docs["01-deployment.yaml"]["spec"]["template"]["spec"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    return {t["matchExpressions"][0]["key"]: t["matchExpressions"][0]["values"] for t in terms}


def test_node_selection_per_provider(tmp_path):
    done, docs = _write(tmp_path / "ack", "A10")           # only Alibaba Cloud's table has the A10
    assert done.provider == "ack"
    assert _terms(docs) == {"aliyun.accelerator/nvidia_name": ["NVIDIA-A10"],
                            "node.kubernetes.io/instance-type": sorted(
                                t.name for t in offers.load_table("aliyun")[0] if t.gpu == "A10")}
    done, docs = _write(tmp_path / "eks", "A10G")          # only AWS's has the A10G
    assert done.provider == "eks"
    terms = _terms(docs)
    assert terms["karpenter.k8s.aws/instance-gpu-name"] == ["a10g"]
    assert terms["eks.amazonaws.com/instance-gpu-name"] == ["a10g"]
    assert "g5.xlarge" in terms["node.kubernetes.io/instance-type"]
    _, docs = _write(tmp_path / "t4-ack", "T4", "ack")
    assert _terms(docs)["aliyun.accelerator/nvidia_name"] == ["Tesla-T4"]
    _, docs = _write(tmp_path / "any", None, "eks")        # no --gpu: every kind the image runs on
    assert set(_terms(docs)["karpenter.k8s.aws/instance-gpu-name"]) == {"t4", "a10g", "l4", "l40s", "v100", "a100",
                                                                        "h100", "h200"}


def test_scaling_manifests(tmp_path):
    _, fixed = _write(tmp_path / "one", "T4", "eks")
    assert set(fixed) == {"00-secret.yaml", "01-deployment.yaml", "02-service.yaml",
                          "policy/kyverno-clusterpolicy.yaml"}
    assert fixed["01-deployment.yaml"]["spec"]["replicas"] == 1 and fixed["02-service.yaml"]["spec"]["type"] == \
        "ClusterIP"
    _, two = _write(tmp_path / "two", "T4", "eks", replicas=2)
    assert two["01-deployment.yaml"]["spec"]["replicas"] == 2 and two["04-pdb.yaml"]["spec"]["maxUnavailable"] == 1
    _, auto = _write(tmp_path / "auto", "T4", "eks", min_replicas=2, max_replicas=5, kserve=True)
    hpa = auto["03-hpa.yaml"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 5) and "replicas" not in auto["01-deployment.yaml"]["spec"]
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "nv_inference_pending_request_count"
    predictor = auto["kserve/inferenceservice.yaml"]["spec"]["predictor"]
    assert (predictor["minReplicas"], predictor["maxReplicas"]) == (2, 5)
    assert auto["kserve/inferenceservice.yaml"]["metadata"]["annotations"][
        "serving.kserve.io/deploymentMode"] == "RawDeployment"
    _, idle = _write(tmp_path / "idle", "T4", "eks", min_replicas=0, max_replicas=3, kserve=True)
    served = idle["kserve/inferenceservice.yaml"]          # Knative scales it to zero and holds the first request
    assert (served["spec"]["predictor"]["minReplicas"], served["spec"]["predictor"]["maxReplicas"]) == (0, 3)
    assert served["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Serverless"
    assert idle["03-hpa.yaml"]["spec"]["minReplicas"] == 1   # the plain Deployment's HPA cannot go to zero


@pytest.mark.parametrize("flags, words", [
    ({"provider": "gke"}, "unknown --node-labels"),
    ({"min_replicas": 1}, "--min and --max go together"),
    ({"min_replicas": 0, "max_replicas": 2}, "cannot scale to zero"),
    ({"min_replicas": 3, "max_replicas": 2}, "below --min"),
    ({"replicas": 2, "min_replicas": 1, "max_replicas": 2}, "--replicas with --min/--max"),
])
def test_bad_options_are_one_line(tmp_path, flags, words):
    from ngcx.core.errors import UserError

    with pytest.raises(UserError, match=words.replace("-", "\\-")):
        kubernetes.write(_config("T4"), kubernetes.Options(out=tmp_path / "k8s", **flags))
    assert not (tmp_path / "k8s").exists()


def test_a_kind_in_both_tables_needs_node_labels_and_an_unknown_kind_is_refused(tmp_path):
    from ngcx.core.errors import UserError

    with pytest.raises(UserError, match="both"):
        kubernetes.write(_config("T4"), kubernetes.Options(out=tmp_path / "k8s"))
    with pytest.raises(UserError):
        kubernetes.write(_config("K80"), kubernetes.Options(out=tmp_path / "k8s", provider="ack"))
    assert not (tmp_path / "k8s").exists() and not list(tmp_path.glob(".k8s*"))


def test_a_failure_while_writing_leaves_no_folder_and_no_unshown_key(tmp_path, monkeypatch):
    real = kubernetes.render
    monkeypatch.setattr(kubernetes, "render", lambda *a: {**real(*a), "02-service.yaml/clash": "x"})
    with pytest.raises(OSError):
        _write(tmp_path / "k8s", "A10")
    assert not (tmp_path / "k8s").exists() and not list(tmp_path.glob(".k8s*"))
    assert keys.get("k8s-resnet") is None


# --------------------------------------------------------------------------------------------- the command line


def _ngcx(monkeypatch, capsys, *args: str, pushes: list | None = None) -> tuple[int, str, str]:
    """`ngcx ARGS` in this process, the image's labels and pushes from the test instead of Docker and the state."""
    import ngcx.deploy.image as image
    import ngcx.main

    monkeypatch.setattr(image, "resolve", lambda *a: ("resnet:latest", dict(LABELS)))
    if pushes is None:
        monkeypatch.setattr(image, "pushes", lambda *a, **k: list(PUSHED))
    monkeypatch.setattr(sys, "argv", ["ngcx", *args])
    with pytest.raises(SystemExit) as exit_:
        ngcx.main.main(list(args))
    out, err = capsys.readouterr()
    return exit_.value.code or 0, out, err


def test_cli_writes_the_folder_and_shows_no_key_off_a_terminal(monkeypatch, capsys, tmp_path):
    out = tmp_path / "k8s"
    code, stdout, stderr = _ngcx(monkeypatch, capsys, "deploy", "resnet", "--cloud", "kubernetes", "--dry-run",
                                 "-o", str(out), "--gpu", "A10", "--kserve", "--", *CMD)
    assert code == 0, stderr
    assert stdout.strip() == str(out) and "no cluster was contacted" in stderr and "kubectl apply -f" in stderr
    assert keys.get("k8s-resnet") not in stderr + stdout
    assert (out / "kserve" / "inferenceservice.yaml").is_file()
    code, printed, _ = _ngcx(monkeypatch, capsys, "deployments", "key", "k8s-resnet")   # on demand, as others
    assert code == 0 and printed.strip() == keys.get("k8s-resnet")
    assert keys.digest(printed.strip()) in (out / "00-secret.yaml").read_text()


@pytest.mark.parametrize("args, words", [
    (["--cloud", "kubernetes", "--dry-run", "--gpu", "A10"], "needs -o DIR"),
    (["--cloud", "kubernetes", "-o", "DIR", "--gpu", "A10"], "only writes manifests"),
    (["--cloud", "aws", "--min", "1"], "--min and --max go together"),
    (["--cloud", "aws", "--min", "1", "--max", "3", "--replicas", "2"], "--min/--max with --replicas"),
    (["--cloud", "local", "--min", "1", "--max", "3"], "a scaling group is a cloud's"),
    (["--cloud", "kubernetes", "--dry-run", "-o", "DIR", "--gpu", "A10", "--min", "0", "--max", "3"],
     "a Deployment's HPA cannot scale to zero"),
    (["--cloud", "aws", "--min", "3", "--max", "2"], "need 0 <= min <= max"),
    (["--cloud", "aws", "-o", "DIR"], "for --cloud kubernetes"),
    (["--cloud", "aws", "--gpus-per-pod", "2"], "--gpus-per-pod are for --cloud kubernetes"),
    (["--cloud", "kubernetes", "--dry-run", "-o", "DIR", "--gpu", "A10", "--gpus-per-pod", "0"],
     "--gpus-per-pod '0': give a number of GPUs from 1 to 16"),
])
def test_cli_mistakes_are_one_line_exit_2(monkeypatch, capsys, tmp_path, args, words):
    args = [a.replace("DIR", str(tmp_path / "k8s")) for a in args]
    code, _, stderr = _ngcx(monkeypatch, capsys, "deploy", "resnet", *args)
    assert code == 2 and words in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not (tmp_path / "k8s").exists()


def test_cli_refuses_a_folder_that_is_not_empty(monkeypatch, capsys, tmp_path):
    (tmp_path / "k8s").mkdir()
    (tmp_path / "k8s" / "mine.yaml").write_text("kind: Mine\n")
    code, _, stderr = _ngcx(monkeypatch, capsys, "deploy", "resnet", "--cloud", "kubernetes", "--dry-run",
                            "-o", str(tmp_path / "k8s"), "--gpu", "A10")
    assert code == 2 and "not an empty folder" in stderr and len(stderr.strip().splitlines()) == 1
    assert [p.name for p in (tmp_path / "k8s").iterdir()] == ["mine.yaml"]


def test_cli_an_image_never_pushed_is_one_line_exit_2(monkeypatch, capsys, tmp_path):
    code, _, stderr = _ngcx(monkeypatch, capsys, "deploy", "resnet", "--cloud", "kubernetes", "--dry-run",
                            "-o", str(tmp_path / "k8s"), "--gpu", "A10", pushes=[])
    assert code == 2 and "never been pushed" in stderr and "ngcx push" in stderr
    assert len(stderr.strip().splitlines()) == 1 and not (tmp_path / "k8s").exists()
    assert not list(tmp_path.glob(".k8s*"))


def test_help_stays_light():
    code = ("import sys, ngcx.main\n"
            "try:\n    ngcx.main.main(['deploy', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(sorted(m for m in ('jinja2', 'yaml', 'kubernetes_validate', 'ngcx.deploy.kubernetes.manifests')"
            " if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert proc.stdout.strip().splitlines()[-1] == "[]"
