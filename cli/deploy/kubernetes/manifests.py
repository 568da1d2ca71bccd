"""`ngcx deploy IMAGE --cloud kubernetes --dry-run -o DIR`: the same service as Kubernetes manifests, never applied.

Why manifests and not another target of flow.py: a platform team that runs ACK or EKS already has a control plane
(the Deployment controller, the HorizontalPodAutoscaler, the scheduler, GitOps); a second one in ngcx would fight
it. So nothing here talks to a cluster: the command writes files that `kubectl apply -f DIR` applies, and the tests
check them against the Kubernetes OpenAPI schemas and KServe's CRD, not against a cluster (none ran).

What the pod does is what recipes/deploy/host.sh.j2 does on a cloud host: the image by the digest of its verified
push, the same command (`args`: the image's ENTRYPOINT stays, as with `docker run IMAGE CMD`), the plan cache at
/var/cache/ngcx/plans on a volume, and the endpoint key's SHA-256 in the file NGCX_RUNTIME_AUTH_KEYS names.

Decisions (the README's "Kubernetes" section is the short version):
- The key. ngcx makes it and keeps it (keys.py, named "k8s-<name>"; a second run reuses it); the output folder
  gets a Secret manifest holding only its SHA-256, which the pod mounts at /run/ngcx/auth. A hash cannot be
  replayed as the key, so the folder can be committed, reviewed and applied by CI without leaking anything,
  while a `kubectl create secret --from-file` of the key would put the key itself in the cluster and in the
  user's shell history. The Deployment and the InferenceService only reference the Secret by name.
- Node selection per GPU kind: a required node affinity from nodes.yaml (the label keys and values per
  provider, and where each comes from), ORed with the well-known node.kubernetes.io/instance-type over the
  offers table's instance types of that kind. Without --gpu, every kind of the provider's table that the image's
  compute capabilities admit (offers.choose, the same rule a cloud deploy ranks by).
- GPUs per pod: one by default (`nvidia.com/gpu: 1`): serving scales by replicas and the scheduler packs pods onto
  GPUs, as the offers ranking prefers 1-GPU instances. `--gpus-per-pod N` asks for N (`nvidia.com/gpu: N`), and
  `--gpus-per-pod node` for a whole node: N is the largest GPU count among the offers table's instance types of the
  kinds chosen (g5.12xlarge: 4), and only types with at least N GPUs stay in the node selection, so the pod can be
  scheduled wherever it is admitted. The server uses every GPU the pod gets without a flag: the device plugin
  exposes exactly those N to the container, and `ngcx-runtime serve` places an instance on every GPU it sees
  (runtime/placement.py, one batcher feeding them); a command that pins fewer GPUs (--gpus 0) is refused, since
  the pod would hold GPUs that never serve. The HPA's pending-requests target grows with N (4 per GPU). The
  toleration admits the `nvidia.com/gpu` taint GPU node pools carry.
- The HPA (only with --min/--max) scales on nv_inference_pending_request_count, the runtime's Triton-named gauge of
  requests waiting for the GPU, averaged per pod through the custom-metrics API (prometheus-adapter). CPU is no
  measure of a GPU server's load: a saturated GPU leaves the CPU idle. /metrics needs the bearer key like every
  route but health, so the scraper needs the key (the README says how).
- Non-root: the images declare no USER (recipes/*.j2), so the pod runs as 65532 with a read-only root file
  system; everything the runtime writes goes to volumes (the plan cache, /tmp as HOME). Checked by hand, not in CI:
  the example project image (ngcx-app/onnx-zero-code) under `docker run --user 65532:65532 --read-only --cap-drop ALL
  --security-opt no-new-privileges` with the pod's volumes and environment built its plan into the cache volume,
  was ready in 21 s, took the key and refused a keyless call (on a CPU: no GPU was there to try the device nodes).
- HTTP inside the cluster: TLS ends at the user's Ingress or Gateway (in-cluster Services are plain HTTP); the
  probes are httpGet on the keyless health routes.
- Admission: policy.py writes a Kyverno (default) or policy-controller policy under DIR/policy/ with the public key
  that verifies the push's signature; it says why Kyverno and why a folder apart.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ...core.errors import UserError
from ..common import SERVE_PORT, DeployConfig
from . import policy as admission_policy

PROVIDERS = ("ack", "eks")
NODES_FILE = Path(__file__).resolve().parent / "nodes.yaml"
KEYS_MOUNT = "/run/ngcx/auth"
PLAN_CACHE = "/var/cache/ngcx/plans"   # local/verbs.py PLAN_CACHE_IN_IMAGE, project/render.py CACHE_DIR
RUN_AS = 65532                         # the distroless "nonroot" uid: no user of that id exists in the images
PENDING_PER_POD = "4"                  # HPA target: requests waiting per pod before another pod is wanted
GPUS_PER_POD = 1
MAX_GPUS_PER_POD = 16                  # the offers tables' largest instance type has 8; 16 leaves room, no more
MANIFESTS = ("secret", "deployment", "service", "hpa", "pdb")


@dataclass(frozen=True)
class Options:
    """The flags of `--cloud kubernetes` that the DeployConfig does not carry."""

    out: Path
    provider: str | None = None          # ack | eks (node labels); None: the one whose table has --gpu
    replicas: int | None = None
    min_replicas: int | None = None
    max_replicas: int | None = None
    kserve: bool = False
    policy: str = admission_policy.DEFAULT_POLICY   # kyverno | sigstore | none (policy.py says why kyverno)
    gpus_per_pod: int | str = GPUS_PER_POD          # N, or "node": the largest GPU count of the chosen types


@dataclass(frozen=True)
class Written:
    out: Path
    files: tuple[str, ...]
    name: str
    key_name: str | None
    key: str | None           # only when this run made it (shown once, as other deploys show theirs)
    provider: str
    gpus: tuple[str, ...]
    kserve: bool = False
    admission: admission_policy.Admission | None = None
    no_policy_because: str = ""
    gpus_per_pod: int = GPUS_PER_POD

    def as_json(self) -> dict[str, Any]:
        """`--json`: no endpoint key in it (a pipe or a CI log keeps what it is given); the signing key's public
        fingerprint is no secret."""
        policy = self.admission
        return {"output": str(self.out), "files": list(self.files), "name": self.name, "key_name": self.key_name,
                "node_labels": self.provider, "gpus": list(self.gpus), "gpus_per_pod": self.gpus_per_pod,
                "admission_policy": None if policy is None else {"controller": policy.kind, "name": policy.name,
                                                                 "file": policy.file, "key": policy.fingerprint}}


def options_from_flags(dry_run: bool, out: Path | None, replicas: int | None, service: str | None,
                       scale: tuple[int | None, int | None], provider: str | None, kserve: bool,
                       policy: str = admission_policy.DEFAULT_POLICY, gpus_per_pod: str | None = None) -> Options:
    """`deploy --cloud kubernetes`'s flags as Options, or the one line that says what is wrong."""
    if not dry_run:   # ngcx never talks to a cluster: applying is kubectl's (or the user's GitOps') job
        raise UserError("--cloud kubernetes only writes manifests",
                        hint="add --dry-run -o DIR, then kubectl apply -f DIR")
    if out is None:
        raise UserError("--cloud kubernetes needs -o DIR, the new folder for the manifests")
    if service is not None:
        raise UserError("--service rolls an ngcx service; on Kubernetes the Deployment rolls itself",
                        hint="write the manifests again for the new image and kubectl apply them")
    options = Options(out=out, provider=provider, replicas=replicas, min_replicas=scale[0], max_replicas=scale[1],
                      kserve=kserve, policy=policy, gpus_per_pod=parse_gpus_per_pod(gpus_per_pod))
    check_options(options)
    return options


def summary(done: Written, show_key: bool) -> list[str]:
    """What `deploy` prints: the key only when made now and on a terminal, as the other deploys show theirs."""
    per_pod = f"{done.gpus_per_pod} GPU{'s' if done.gpus_per_pod != 1 else ''} per pod, all serving"
    lines = [f"wrote {len(done.files)} manifests for {done.name} ({done.provider} node labels, "
             f"{', '.join(done.gpus)}; {per_pod}) to {done.out}; no cluster was contacted"]
    if done.key and show_key:
        lines.append(f"key (shown once; `ngcx deployments key {done.key_name}` prints it again): {done.key}")
    elif done.key_name:
        lines.append(f"the endpoint key is ngcx's {done.key_name} (`ngcx deployments key {done.key_name}` prints it; "
                     f"delete keys/{done.key_name}.key in ngcx's state folder and write the manifests again for a new "
                     "key); the manifests hold only its SHA-256")
    lines.append(admission_policy.summary(done.admission, str(done.out), done.no_policy_because))
    lines.append(f"apply: kubectl apply -f {done.out}")
    if done.kserve:
        lines.append(f"or with KServe: kubectl apply -f {done.out}/00-secret.yaml -f {done.out}/kserve")
    return lines


@lru_cache(maxsize=1)
def node_table() -> dict[str, Any]:
    import yaml

    return yaml.safe_load(NODES_FILE.read_text())


def service_name(config: DeployConfig) -> str:
    """A DNS-1035 label from the project's name or the image's repository (Services need one)."""
    base = config.model or config.image.rsplit("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    name = re.sub(r"[^a-z0-9-]+", "-", base.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"ngcx-{name}".rstrip("-")
    return name[:40].rstrip("-")


def parse_gpus_per_pod(text: str | int | None) -> int | str:
    """--gpus-per-pod N (1-16) or `node`; one line for anything else."""
    if text is None:
        return GPUS_PER_POD
    if str(text).strip().lower() == "node":
        return "node"
    try:
        n = int(str(text).strip())
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_GPUS_PER_POD:
        raise UserError(f"--gpus-per-pod {text!r}: give a number of GPUs from 1 to {MAX_GPUS_PER_POD}, or node",
                        hint="node asks for every GPU of the largest instance type of the kind chosen")
    return n


def check_command(cmd: list[str], gpus: int) -> None:
    """A pod of N > 1 GPUs whose serve command pins fewer (--gpus 0) would hold GPUs that never serve."""
    for i, arg in enumerate(cmd):
        if arg == "--gpus":
            value = cmd[i + 1] if i + 1 < len(cmd) else ""
        elif arg.startswith("--gpus="):
            value = arg.partition("=")[2]
        else:
            continue
        if value.strip().lower() == "all":
            continue
        named = [v for v in value.split(",") if v.strip()]
        if len(named) < gpus:
            raise UserError(f"the command serves on --gpus {value}, but each pod asks for {gpus} GPUs",
                            hint="drop --gpus (ngcx-runtime serve uses every GPU the pod gets) or lower "
                                 "--gpus-per-pod")


def check_options(options: Options) -> None:
    """Bad combinations are one line before anything is read or written."""
    admission_policy.check_choice(options.policy)
    parse_gpus_per_pod(options.gpus_per_pod)
    if options.provider is not None and options.provider not in PROVIDERS:
        raise UserError(f"unknown --node-labels {options.provider!r}", hint=f"use one of: {', '.join(PROVIDERS)}")
    low, high = options.min_replicas, options.max_replicas
    if (low is None) != (high is None):
        raise UserError("--min and --max go together", hint="e.g. --min 1 --max 4")
    if low is not None and high is not None:
        if options.replicas is not None:
            raise UserError("--replicas with --min/--max", hint="--replicas is a fixed count; --min/--max let the "
                                                                 "autoscaler choose between them")
        if low < 1 and not options.kserve:
            raise UserError("--min 0 on Kubernetes: a Deployment's HPA cannot scale to zero (HPAScaleToZero is an "
                            "alpha gate)", hint="add --kserve (Knative holds the first request while a pod starts), "
                                                "or use --min 1")
        if high < low:
            raise UserError(f"--max {high} is below --min {low}")
    out = options.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"{out} exists and is not an empty folder; ngcx does not mix its manifests with other files",
                        hint="give a new folder, or remove that one first")


def provider_for(gpu: str | None, asked: str | None) -> str:
    """The provider whose node labels to write: --node-labels, else the one provider whose table has --gpu."""
    if asked:
        return asked
    gpus = {p: {k.lower() for k in node_table()["providers"][p]["gpus"]} for p in PROVIDERS}
    having = [p for p in PROVIDERS if gpu and gpu.lower() in gpus[p]]
    if len(having) == 1:
        return having[0]
    why = f"--gpu {gpu} exists in both ACK's and EKS's tables" if having else "no --gpu says which cluster"
    raise UserError(f"{why}: name the cluster's node labels", hint="add --node-labels ack or --node-labels eks")


def placement(config: DeployConfig, provider: str, gpus_per_pod: int | str = GPUS_PER_POD
              ) -> tuple[list[str], list[dict[str, Any]], int]:
    """(GPU kinds, nodeSelectorTerms, GPUs per pod): every kind of the provider's offers table the image can run on
    (only --gpu's when given) on an instance type with at least the pod's GPUs, each by the provider's GPU labels
    and by the well-known instance-type label. `node`: the largest GPU count of those types."""
    from .. import offers

    table = node_table()
    spec = table["providers"][provider]
    caps = [c for c in config.labels.get("ai.ngcx.compute-capabilities", "").split(",") if c]
    if not caps:   # an image without the label (a project FROM an old image): no rule to filter by
        caps = sorted({f"{t.compute_capability}" for t in offers.load_table(spec["offers"])[0]})
    choice = offers.choose(spec["offers"], compute_capabilities=caps,
                           driver_floor=config.labels.get("ai.ngcx.min-driver"), gpu=config.gpu)
    if not choice.candidates:
        raise UserError(f"no GPU of {provider.upper()}'s table ({spec['offers']} offers) fits {config.image}",
                        hint=f"see `ngcx deploy {config.image} --cloud {spec['offers']} --dry-run` for why")
    need = max(c.itype.gpu_count for c in choice.candidates) if gpus_per_pod == "node" else int(gpus_per_pod)
    candidates = [c for c in choice.candidates if c.itype.gpu_count >= need]
    if not candidates:
        most = max(c.itype.gpu_count for c in choice.candidates)
        raise UserError(f"--gpus-per-pod {need}: no instance type of {provider.upper()}'s table ({spec['offers']} "
                        f"offers) that fits {config.image} has {need} GPUs (the most is {most})",
                        hint=f"use --gpus-per-pod {most} or fewer, or another --gpu")
    kinds, types = [], []
    for candidate in candidates:
        if candidate.itype.gpu not in kinds:
            kinds.append(candidate.itype.gpu)
        types.append(candidate.itype.name)
    missing = [k for k in kinds if k not in spec["gpus"]]
    if missing:
        raise UserError(f"{NODES_FILE.name} has no {provider} node label value for {', '.join(missing)}",
                        hint="add the kind to its table")
    values = [v for kind in kinds for v in spec["gpus"][kind]]
    terms = [{"key": label, "values": values} for label in spec["labels"]]
    terms.append({"key": table["instance_type_label"], "values": sorted(set(types))})
    return kinds, terms, need


def pull_ref(config: DeployConfig) -> str:
    """REGISTRY/REPO@sha256:… of the image's newest verified push (nodes pull by digest, as cloud hosts do)."""
    from ..image import pushes

    if not config.pushes:
        try:
            config.pushes = pushes(config.image, None)
        except UserError:
            raise UserError(f"{config.image} has never been pushed, and a cluster pulls from a registry",
                            hint=f"push it first: ngcx push {config.image} --registry HOST/NAMESPACE") from None
    picked = config.pick_push(lambda _host: True)
    assert picked is not None
    return picked[0]


def endpoint_key(name: str, auth: bool) -> tuple[str | None, str | None, str | None]:
    """(key name, digest, the key when made now): the service's key, kept by ngcx like every endpoint's."""
    if not auth:
        return None, None, None
    from .. import keys

    key_name = f"k8s-{name}"
    existing = keys.get(key_name)
    key = existing or keys.create(key_name)
    return key_name, keys.digest(key), None if existing else key


@lru_cache(maxsize=1)
def _env() -> Any:
    import jinja2

    from ...core import paths

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(paths.recipes_dir() / "deploy" / "kubernetes")),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True,
                             lstrip_blocks=True, autoescape=False)
    env.filters["y"] = lambda value: json.dumps(value)   # JSON is YAML: every value is quoted, none breaks out
    return env


def values(config: DeployConfig, options: Options, name: str, provider: str, kinds: list[str],
           terms: list[dict[str, Any]], image_ref: str, key_name: str | None, digest: str | None,
           gpus: int = GPUS_PER_POD) -> dict[str, Any]:
    """Everything the templates write, decided here."""
    autoscaled = options.min_replicas is not None
    replicas = options.min_replicas if autoscaled else (options.replicas or 1)
    most = options.max_replicas if autoscaled else replicas
    env = {"HOME": "/tmp", "NGCX_RUNTIME_CACHE": PLAN_CACHE, **config.env}
    if digest:
        env["NGCX_RUNTIME_AUTH_KEYS"] = f"{KEYS_MOUNT}/keys"
    return {
        "name": name, "image": image_ref, "args": list(config.cmd), "port": SERVE_PORT, "env": env,
        "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/managed-by": "ngcx"},
        "annotations": {"ngcx.ai/image": config.image, "ngcx.ai/gpu-kinds": ",".join(kinds),
                        "ngcx.ai/node-labels": provider, "ngcx.ai/gpus-per-pod": str(gpus)},
        "replicas": max(1, replicas), "min_replicas": max(1, replicas), "max_replicas": most, "autoscaled": autoscaled,
        "kserve_min": replicas, "serverless": replicas == 0,
        "pending_per_pod": str(int(PENDING_PER_POD) * gpus), "gpus": gpus, "terms": terms, "run_as": RUN_AS,
        "plan_cache": PLAN_CACHE, "keys_mount": KEYS_MOUNT, "secret": f"{name}-keys" if digest else None,
        "key_name": key_name, "key_hashes": [digest] if digest else [],
        "startup_failures": max(3, int(config.ready_timeout // 10) + 1),
    }


def render(data: dict[str, Any], kserve: bool) -> dict[str, str]:
    """File name -> YAML text; a manifest whose condition is off is left out."""
    env = _env()
    wanted = {"secret": bool(data["secret"]), "deployment": True, "service": True, "hpa": data["autoscaled"],
              "pdb": data["max_replicas"] > 1}
    files = {f"{i:02d}-{kind}.yaml": env.get_template(f"{kind}.yaml.j2").render(**data)
             for i, kind in enumerate(MANIFESTS) if wanted[kind]}
    if kserve:
        files["kserve/inferenceservice.yaml"] = env.get_template("inferenceservice.yaml.j2").render(**data)
    return files


def write(config: DeployConfig, options: Options) -> Written:
    """Check, decide, render to a temporary folder beside DIR, then rename it to DIR: a failure leaves nothing."""
    check_options(options)
    provider = provider_for(config.gpu, options.provider)
    kinds, terms, gpus = placement(config, provider, options.gpus_per_pod)
    check_command(config.cmd, gpus)
    image_ref = pull_ref(config)
    admission = admission_policy.decide(config, options.policy, image_ref)   # before the endpoint key is made
    name = service_name(config)
    key_name, digest, key = endpoint_key(name, config.auth)
    out = options.out.resolve()
    tmp: Path | None = None
    try:
        data = values(config, options, name, provider, kinds, terms, image_ref, key_name, digest, gpus)
        files = render(data, options.kserve)
        if admission is not None:
            files.update(admission_policy.render(admission, data["labels"], _env()))
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        for rel, text in files.items():
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_text(text)
        os.chmod(tmp, 0o755)
        if out.exists():
            out.rmdir()             # empty (check_options): replaced by the finished folder
        os.replace(tmp, out)
    except BaseException:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if key is not None:         # made now and never shown: a later run makes (and shows) a new one
            from .. import keys

            keys.forget(key_name or "")
        raise
    return Written(out=out, files=tuple(files), name=name, key_name=key_name, key=key, provider=provider,
                   gpus=tuple(kinds), kserve=options.kserve, admission=admission,
                   no_policy_because="--policy none" if options.policy == "none" else "--allow-unsigned",
                   gpus_per_pod=gpus)
