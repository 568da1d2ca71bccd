"""The SBOM's collection step: one container of the image prints what it holds (sbom_inside.py); the engine adds
its identity (image ID, repository digests, labels) and its base, verified by layers. Typed, so the two writers
(sbom_cyclonedx.py, sbom_spdx.py) build from the same facts.

Why one container, run as `ngcx test` runs its probe (cli/test/image.py run_in_image): detached, no network,
removed afterwards, the entrypoint named (a project image clears its base's). No GPU is requested: the probe's
version calls (cudaRuntimeGetVersion, cudnnGetVersion, ...) need none, so the SBOM is the same on a CPU host.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.errors import UserError

# Where a project image keeps its model (cli/project/render.py MODEL_DIR; trust sits below project, so the path
# is repeated here rather than imported) and the label its build records the model's sha256 in.
MODEL_DIR = "/opt/ngcx/model"
LABEL_MODEL = "ai.ngcx.project.model-sha256"
LABEL_BASE_NAME = "org.opencontainers.image.base.name"
LABEL_BASE_DIGEST = "org.opencontainers.image.base.digest"
PIN_PREFIX = "ai.ngcx.pin."
SCRIPT = Path(__file__).with_name("sbom_inside.py")


@dataclass(frozen=True)
class Deb:
    name: str
    version: str
    arch: str
    source: str
    source_version: str
    status: str


@dataclass(frozen=True)
class PyDist:
    name: str
    version: str
    location: str
    hashes: dict[str, str]      # algorithm -> hex, from direct_url.json; {} when pip recorded none
    wheel_tags: tuple[str, ...] = ()  # the WHEEL file's Tag lines (py3-none-manylinux2014_x86_64); () if no wheel
    accepted: tuple[str, ...] = ()    # sha256s the release's lock let pip --require-hashes install (sbom_lock.py)


@dataclass(frozen=True)
class CudaLib:
    component: str              # cudart, cublas, cudnn, nccl, tensorrt (runtime/probe.py LIBRARIES)
    version: str
    path: str                   # the file the linker (or a framework) mapped
    wheel: str | None           # "name==version" of the pip wheel whose RECORD lists that file
    pin: str | None             # the image's ai.ngcx.pin.<component> label
    loaded_by: str              # "linker" or "framework"
    sha256: str | None = None   # of the loaded file's bytes


@dataclass(frozen=True)
class ModelFile:
    name: str
    path: str
    sha256: str                 # a file's sha256, or a folder's tree hash (cli/project/context.py sha256_tree)
    folder: bool
    size: int


@dataclass(frozen=True)
class ImageRef:
    name: str                   # repository, e.g. ngcx/cuda or 127.0.0.1:5000/ngcx/cuda
    tag: str | None
    image_id: str               # sha256:... of the image config (what the local engine keys it by)
    repo_digests: tuple[str, ...]  # name@sha256:... manifest digests, once pushed or pulled
    subject: str | None = None  # the digest a caller names (the one `ngcx push` just pushed and signs)

    @property
    def digest(self) -> str:
        """The digest the SBOM is about: the caller's, else the manifest digest of this image's own repository
        when the engine knows one, else the image ID. A signature (cosign) names the manifest digest; a local build has
        only its config digest until a push."""
        if self.subject:
            return self.subject
        own = [d.split("@", 1)[1] for d in self.repo_digests if d.split("@", 1)[0] == self.name]
        return own[0] if own else self.image_id   # another repository's digest may be of another manifest


@dataclass(frozen=True)
class BaseRef:
    name: str | None
    digest: str | None          # image ID (or manifest digest) of the base this image was built FROM
    verified: bool              # True: a local image with that digest is a layer prefix of this one
    how: str                    # where the digest came from, for the SBOM's readers


@dataclass(frozen=True)
class Inventory:
    image: ImageRef
    base: BaseRef | None
    labels: dict[str, str]
    os: dict[str, str]          # /etc/os-release: ID, VERSION_ID, VERSION_CODENAME, PRETTY_NAME
    python: str
    debs: tuple[Deb, ...]
    dists: tuple[PyDist, ...]
    cuda: tuple[CudaLib, ...]
    models: tuple[ModelFile, ...]
    created: str = ""
    platform: str = ""
    collect_s: float = 0.0
    notes: tuple[str, ...] = field(default=())


def collect(ref: str) -> Inventory:
    """Everything the SBOM says about the local image `ref`. UserError (one line) when the engine is down, the
    image unknown, or the image cannot run the collection script."""
    from ..core.engine import engine_client, image_or_none

    started = time.monotonic()
    client = engine_client()
    image = image_or_none(client, ref)
    if image is None:
        raise UserError(f"no local image {ref!r}", hint="build it with `ngcx build`, or check `docker images`")
    attrs = image.attrs
    labels = dict((attrs.get("Config") or {}).get("Labels") or {})
    report = _run_inside(client, ref)
    inv = Inventory(
        image=_image_ref(ref, attrs), base=_base(client, attrs, labels), labels=labels,
        os=dict(report.get("os") or {}), python=str(report.get("python", "")),
        debs=_debs(report), dists=_dists(report, labels),
        cuda=_cuda(report, labels), models=_models(report, labels, ref),
        created=str(attrs.get("Created", "")), platform=f"{attrs.get('Os', '')}/{attrs.get('Architecture', '')}",
        notes=_notes(report),
    )
    return _with_time(inv, time.monotonic() - started)


def _with_time(inv: Inventory, seconds: float) -> Inventory:
    from dataclasses import replace

    return replace(inv, collect_s=round(seconds, 3))


def _run_inside(client: Any, ref: str) -> dict[str, Any]:
    """sbom_inside.py's JSON from one throwaway container of `ref` (the image's python3, no network).

    An image without python3 (an offline Debian base, a one-file image) still gets an SBOM: dpkg's database
    alone when it has dpkg-query, else nothing listed, each gap said in the SBOM's notes, never guessed."""
    code, out, err = _container(client, ref, ["python3", "-c", SCRIPT.read_text()], [MODEL_DIR])
    if code is None:
        return _without_python(client, ref, err)
    lines = out.strip().splitlines()
    try:
        return json.loads(lines[-1]) if code == 0 and lines else _failed(ref, code, err)
    except json.JSONDecodeError:
        return _failed(ref, code, err)


def _without_python(client: Any, ref: str, why: str) -> dict[str, Any]:
    from .sbom_inside import DPKG_FIELDS, DPKG_FORMAT

    missing = {"error": f"no python3 in the image ({why})"}
    code, out, err = _container(client, ref, ["dpkg-query", "-W", "-f", DPKG_FORMAT], [])
    if code == 0:
        debs: Any = [dict(zip(DPKG_FIELDS, [f.strip() for f in line.split("\t")], strict=False))
                     for line in out.splitlines() if line]
    else:
        debs = {"error": f"no dpkg-query in the image ({err or f'exit {code}'})"}
    return {"debs": debs, "dists": [], "cuda": missing, "models": [], "dists_error": missing["error"]}


def _container(client: Any, ref: str, entrypoint: list[str], args: list[str]) -> tuple[int | None, str, str]:
    """(exit code, stdout, stderr) of one container; exit code None when its entrypoint does not exist there."""
    from docker.errors import APIError

    container = client.containers.create(ref, args, entrypoint=entrypoint, network_mode="none")
    try:
        try:
            container.start()
        except APIError as exc:
            text = str(exc.explanation or exc)
            if "executable file not found" in text or "no such file or directory" in text:
                return None, "", f"{entrypoint[0]} not found"
            raise UserError(f"{ref}: could not start a container to list its packages: "
                            f"{text.splitlines()[0][:300]}") from None
        code = int(container.wait(timeout=900).get("StatusCode", 1))
        out = container.logs(stdout=True, stderr=False).decode(errors="replace")
        err = container.logs(stdout=False, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    return code, out, err


def _failed(ref: str, status: int, err: str) -> dict[str, Any]:
    last = (err.strip().splitlines() or ["no output"])[-1][:200]
    raise UserError(f"{ref}: the package listing inside the image failed (exit {status}): {last}")


def _image_ref(ref: str, attrs: dict[str, Any]) -> ImageRef:
    name, tag = split_ref(ref)
    if ref.startswith("sha256:"):
        tags = attrs.get("RepoTags") or []
        name, tag = split_ref(tags[0]) if tags else (ref, None)
    return ImageRef(name=name, tag=tag, image_id=str(attrs.get("Id", "")),
                    repo_digests=tuple(attrs.get("RepoDigests") or ()))


def split_ref(ref: str) -> tuple[str, str | None]:
    """("127.0.0.1:5000/ngcx/cuda", "24.05-runtime") from a reference; a ':' before the last '/' is a port."""
    ref = ref.split("@", 1)[0]
    slash = ref.rfind("/")
    colon = ref.rfind(":")
    return (ref[:colon], ref[colon + 1:]) if colon > slash else (ref, None)


def _layers(attrs: dict[str, Any]) -> list[str]:
    return list((attrs.get("RootFS") or {}).get("Layers") or [])


def _base(client: Any, attrs: dict[str, Any], labels: dict[str, str]) -> BaseRef | None:
    """The base image: the digest the build labelled (a project image records its base's ID), else the local image
    its name label points at; either counts as verified only when its layers are a prefix of this image's."""
    from ..core.engine import image_or_none

    name, labelled = labels.get(LABEL_BASE_NAME), labels.get(LABEL_BASE_DIGEST)
    if not name and not labelled:
        return None
    candidate = image_or_none(client, labelled or name)
    if candidate is None:
        return BaseRef(name, labelled, False, "label (the base is not in the local engine to check its layers)")
    base_layers = _layers(candidate.attrs)
    prefix = bool(base_layers) and _layers(attrs)[:len(base_layers)] == base_layers
    if labelled:
        return BaseRef(name, labelled, prefix, "label " + LABEL_BASE_DIGEST + ("; layers checked" if prefix else
                                                                             "; its layers do NOT match"))
    if prefix:
        return BaseRef(name, candidate.id, True, f"local image {name}, whose layers this image starts with")
    return BaseRef(name, None, False, f"local image {name} is not this image's base (layers differ)")


def _debs(report: dict[str, Any]) -> tuple[Deb, ...]:
    rows = report.get("debs")
    if not isinstance(rows, list):
        return ()
    return tuple(Deb(r.get("name", ""), r.get("version", ""), r.get("arch", ""), r.get("source") or r.get("name", ""),
                     r.get("source_version") or r.get("version", ""), r.get("status", "")) for r in rows)


def _dists(report: dict[str, Any], labels: dict[str, str]) -> tuple[PyDist, ...]:
    from .sbom_lock import accepted_hashes, key

    accepted = accepted_hashes(labels)
    return tuple(PyDist(d["name"], d["version"], d["location"], dict(d.get("hashes") or {}),
                        tuple(d.get("wheel_tags") or ()), accepted.get(key(d["name"], d["version"]), ()))
                 for d in report.get("dists", []))


def _cuda(report: dict[str, Any], labels: dict[str, str]) -> tuple[CudaLib, ...]:
    """One entry per library file the probe saw loaded: the linker's, and a framework's own copy when it differs."""
    libs = (report.get("cuda") or {}).get("libraries") or {}
    out: list[CudaLib] = []
    for component, lib in sorted(libs.items()):
        pin = labels.get(PIN_PREFIX + component)
        for entry, by in ((lib, "linker"), (lib.get("framework_loaded") or {}, "framework")):
            if entry.get("version") and entry.get("path"):
                wheel = entry.get("wheel") or None
                out.append(CudaLib(component, str(entry["version"]), str(entry["path"]),
                                   f"{wheel['name']}=={wheel['version']}" if wheel else None, pin, by,
                                   entry.get("sha256")))
    return tuple(out)


def _models(report: dict[str, Any], labels: dict[str, str], ref: str) -> tuple[ModelFile, ...]:
    """The model files found in the image; a sha256 other than the build's label stops the SBOM (tampered)."""
    models = tuple(ModelFile(m["name"], m["path"], m["sha256"], bool(m["folder"]), int(m["size"]))
                   for m in report.get("models", []))
    labelled = labels.get(LABEL_MODEL)
    if labelled and labelled not in {m.sha256 for m in models}:
        found = ", ".join(f"{m.name} {m.sha256}" for m in models) or f"nothing under {MODEL_DIR}"
        raise UserError(f"{ref}: the model in the image ({found}) is not the one its build recorded "
                        f"({LABEL_MODEL}={labelled})", hint="rebuild the image; do not sign or ship this one")
    return models


def _notes(report: dict[str, Any]) -> tuple[str, ...]:
    """What the SBOM could not list, said in it (an image without dpkg, or without ngcx_runtime)."""
    notes = []
    if isinstance(report.get("debs"), dict):
        notes.append(f"dpkg: {report['debs'].get('error', 'not listed')}")
    cuda = report.get("cuda") or {}
    if "error" in cuda:
        notes.append(f"cuda: {cuda['error']}")
    if report.get("dists_error"):
        notes.append(f"python: {report['dists_error']}")
    return tuple(notes)
