"""The image and catalog pages' data: plain dicts from the state store, the Docker Engine and the catalog.

Why its own module: the pages show what three sources say about one image (the build record, what the
engine holds now, and what the catalog promises), and the web code should only lay those out. Every
function returns JSON-ready dicts and lists; the docker SDK and the catalog are imported inside the
functions that need them, so the list pages cost one SQL query and nothing else.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..core import naming
from ..core.errors import UserError

PIN_PREFIX = "ai.ngcx.pin."
LABEL_CUDA = "ai.ngcx.cuda"
ROW_FIELDS = ("tag", "image", "release", "variant", "image_id", "digest", "size_bytes", "built_at", "duration_s")

# NVIDIA's architecture of each compute capability the catalog may name (names are facts of the GPUs, not
# compatibility rules, so they live here and not in registry.yaml); an unknown one shows as "sm_XY".
ARCHITECTURES = {
    "5.0": "Maxwell", "5.2": "Maxwell", "5.3": "Maxwell", "6.0": "Pascal", "6.1": "Pascal", "6.2": "Pascal",
    "7.0": "Volta", "7.2": "Volta", "7.5": "Turing", "8.0": "Ampere", "8.6": "Ampere", "8.7": "Ampere",
    "8.9": "Ada Lovelace", "9.0": "Hopper", "10.0": "Blackwell", "10.1": "Blackwell", "10.3": "Blackwell",
    "11.0": "Blackwell", "12.0": "Blackwell", "12.1": "Blackwell",
}

IMAGE_ID = re.compile(r"(?:sha256:)?[0-9a-f]{12,64}")
REFERENCE = re.compile(rf"(?:{naming.REGISTRY_HOST.pattern}/)?{naming.PATH_COMPONENT.pattern}"
                       rf"(?:/{naming.PATH_COMPONENT.pattern})*(?::{naming.TAG.pattern})?(?:@sha256:[0-9a-f]{{64}})?")

# Dockerfile instructions that never make a layer: how a `docker history` row is matched to its layer.
EMPTY_LAYER = re.compile(r"^(?:/bin/sh -c #\(nop\)\s+)?(?:ENV|LABEL|CMD|ENTRYPOINT|USER|EXPOSE|ARG|SHELL|"
                         r"HEALTHCHECK|STOPSIGNAL|VOLUME|ONBUILD|MAINTAINER)\b")


# ----------------------------------------------------------------------------- lists (state store only)


def image_rows(limit: int | None = None) -> list[dict]:
    """The images built here, newest first: the newest build of each tag (one query, no engine call)."""
    from ..state import db as state

    return [{k: getattr(b, k) for k in ROW_FIELDS} for b in state.latest_builds(limit)]


def builds(limit: int = 20) -> list[dict]:
    """The last `limit` builds, newest first, every field of the build record."""
    from ..state import db as state

    return [asdict(b) for b in state.list_builds(limit=limit)]


# ----------------------------------------------------------------------------- one image


def image_detail(ref: str) -> dict:
    """Everything about one local image (a tag or an image id): pins, layers, tests, pushes, build.

    The engine says what the image is now; the state store what ngcx built, tested and pushed. When the
    engine is down the state's part is returned with `engine_error` set to one line; an image neither
    knows is a UserError.
    """
    from docker.errors import DockerException

    from ..core.engine import engine_client, image_or_none, short_reason
    from ..state import db as state

    check_ref(ref)
    build = state.build_of(ref)
    detail = _empty_detail(ref, build)
    try:
        client = engine_client(timeout=60)
    except UserError as exc:
        if build is None:
            raise UserError(f"no image {ref!r} in the state store, and the Docker Engine is not reachable to "
                            f"look it up ({exc.message})", hint=exc.hint) from None
        detail["engine_error"] = exc.line()
        return _with_state(detail)
    try:
        image = image_or_none(client, ref)
        if image is None and build is None:
            raise UserError(f"no local image {ref!r}", hint="give a tag or an image id from `ngcx images` or "
                            "`docker images`, or build it with `ngcx build IMAGE[:RELEASE]`")
        if image is not None:
            _add_engine_view(detail, image, client)
    except DockerException as exc:  # the engine went away or refused mid-way: keep what the state knows
        detail["engine_error"] = f"Docker Engine: {short_reason(str(exc))}"
    return _with_state(detail)


def check_ref(ref: str) -> None:
    """A tag (Docker's reference grammar, optionally @digest) or an image id, else a UserError: the ref is
    put into the engine's URL, and a ref such as '../containers/x' must never reach another endpoint."""
    if not (IMAGE_ID.fullmatch(ref) or REFERENCE.fullmatch(ref)):
        raise UserError(f"{ref!r} is not an image reference or image id",
                        hint="give a tag such as ngcx/cuda:24.05-runtime, or an id from `docker images`")


def _empty_detail(ref: str, build: Any) -> dict:
    """The detail's shape, filled from the build record alone (what is known without the engine)."""
    return {
        "ref": ref, "tag": build.tag if build else None, "image_id": build.image_id if build else None,
        "present": False, "tags": [], "digests": [], "created": None,
        "size_bytes": build.size_bytes if build else None, "pins": {}, "labels": {}, "layers": [],
        "tests": None, "pushes": [], "build": asdict(build) if build else None, "engine_error": None,
    }


def _add_engine_view(detail: dict, image: Any, client: Any) -> None:
    """What the engine holds now: id, tags, size, labels split into pins and the rest, layers."""
    attrs = image.attrs
    detail.update(present=True, image_id=image.id, tags=list(image.tags), size_bytes=attrs.get("Size"),
                  digests=list(attrs.get("RepoDigests") or []), created=attrs.get("Created"))
    detail["tag"] = _pick_tag(detail["ref"], detail["tags"], detail["tag"])
    detail["pins"], detail["labels"] = split_labels(image.labels or {})
    detail["layers"] = layers(image, client)


def _pick_tag(ref: str, tags: list[str], build_tag: str | None) -> str | None:
    """The tag the page is about: the ref itself, else the built tag, else the image's first tag."""
    for candidate in (ref, build_tag):
        if candidate in tags:
            return candidate
    return tags[0] if tags else build_tag


def _with_state(detail: dict) -> dict:
    """The latest `ngcx test` run of this image id and the pushes of its tags, from the state store."""
    from ..state import db as state

    if detail["image_id"]:
        run = state.latest_tests(detail["image_id"])
        detail["tests"] = asdict(run) if run else None
    tags = dict.fromkeys([*detail["tags"], *([detail["tag"]] if detail["tag"] else [])])
    pushes = [p for tag in tags for p in state.list_pushes(tag)]
    detail["pushes"] = [{"id": p.id, "tag": p.tag, "remote_ref": p.remote_ref, "digest": p.digest,
                         "pushed_at": p.pushed_at}
                        for p in sorted(pushes, key=lambda p: (p.pushed_at, p.id), reverse=True)]
    return detail


def push_by_id(push_id: int) -> Any:
    """The push row `push_id` (state.Push), or None: the SBOM download names a push, never a free reference,
    so the dashboard fetches only from registries ngcx itself pushed to."""
    from ..state import db as state

    return next((p for p in state.list_pushes() if p.id == push_id), None)


def split_labels(labels: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(pins, other labels): ai.ngcx.pin.<component> as {component: version}, CUDA (ai.ngcx.cuda) first."""
    pins = {"cuda": labels[LABEL_CUDA]} if LABEL_CUDA in labels else {}
    pins.update(sorted((k.removeprefix(PIN_PREFIX), v) for k, v in labels.items() if k.startswith(PIN_PREFIX)))
    other = dict(sorted((k, v) for k, v in labels.items() if k != LABEL_CUDA and not k.startswith(PIN_PREFIX)))
    return pins, other


def layers(image: Any, client: Any) -> list[dict]:
    """The image's layers, base first: diff id, size and the instruction that made it (when the history can be
    matched to the layers), and the other local images that share it (every local image listed once)."""
    diff_ids = list((image.attrs.get("RootFS") or {}).get("Layers") or [])
    made_by = _history_per_layer(image.history(), len(diff_ids))
    sharers = _sharers(client, image.id, set(diff_ids))
    return [{"diff_id": diff_id, "size_bytes": made_by[n]["size_bytes"], "created_by": made_by[n]["created_by"],
             "created": made_by[n]["created"], "shared_with": sharers.get(diff_id, {}).get("tags", []),
             "shared_untagged": sharers.get(diff_id, {}).get("untagged", 0)} for n, diff_id in enumerate(diff_ids)]


def _history_per_layer(history: list[dict], count: int) -> list[dict]:
    """`docker history` rows (newest first) matched to the `count` layers, base first.

    The engine does not say which rows made a layer: rows of instructions that never do (ENV, LABEL, ...)
    are dropped; if what is left is not one row per layer, the rows with a size are tried; failing both
    the sizes are unknown (None) rather than put on the wrong layer.
    """
    rows = list(reversed(history))
    for keep in (lambda h: h.get("Size") or not EMPTY_LAYER.match(h.get("CreatedBy") or ""),
                 lambda h: h.get("Size"), lambda h: True):
        picked = [h for h in rows if keep(h)]
        if len(picked) == count:
            return [{"size_bytes": h.get("Size"), "created_by": (h.get("CreatedBy") or "").strip() or None,
                     "created": h.get("Created")} for h in picked]
    return [{"size_bytes": None, "created_by": None, "created": None}] * count


def _sharers(client: Any, own_id: str, diff_ids: set[str]) -> dict[str, dict]:
    """{diff id: {"tags": [tags of other images holding it], "untagged": how many untagged ones}}."""
    out: dict[str, dict] = {}
    for other in client.images.list():
        if other.id == own_id:
            continue
        for diff_id in diff_ids.intersection((other.attrs.get("RootFS") or {}).get("Layers") or []):
            entry = out.setdefault(diff_id, {"tags": [], "untagged": 0})
            if other.tags:
                entry["tags"].extend(other.tags)
            else:
                entry["untagged"] += 1
    for entry in out.values():
        entry["tags"].sort()
    return out


# ----------------------------------------------------------------------------- catalog


MATRIX_COLUMNS = (("image", "image"), ("release", "release"), ("cuda", "CUDA"), ("cudnn", "cuDNN"),
                  ("nccl", "NCCL"), ("tensorrt", "TensorRT"), ("framework", "framework"),
                  ("framework_version", "framework version"), ("python", "python"), ("min_driver", "min driver"))


def _version_key(text: str) -> tuple[int, ...]:
    """'24.05' / '8.6' -> (24, 5) / (8, 6): release tags and compute capabilities sort as numbers."""
    return tuple(int(x) for x in text.split(".") if x.isdigit())


def architecture(cc: str) -> str:
    """'8.0' -> 'Ampere (sm_80)'."""
    sm = "sm_" + cc.replace(".", "")
    return f"{ARCHITECTURES[cc]} ({sm})" if cc in ARCHITECTURES else sm


def catalog_matrix(catalog_file: Path | None = None) -> dict:
    """Images x releases of the catalog with each release's stack and driver floor per GPU architecture.

    The floors are the catalog's own (Release.min_driver_for: the CUDA major's floor, raised by the
    arch_min_driver rule); an architecture a release does not support is absent from its `drivers`.
    A catalog that fails validation raises the catalog's error (CatalogInvalid / UserError).
    """
    from ..catalog import load_catalog

    cat = load_catalog(catalog_file)
    rows = []
    for name in cat.image_names():
        for tag in sorted(cat.releases[name], key=_version_key):
            rows.append(_matrix_row(cat, cat.releases[name][tag]))
    ccs = sorted({cc for rel in cat.all_releases() for cc in rel.compute_capabilities}, key=_version_key)
    return {"columns": [{"key": key, "title": title} for key, title in MATRIX_COLUMNS],
            "rows": rows, "architectures": [architecture(cc) for cc in ccs]}


def _matrix_row(cat: Any, rel: Any) -> dict:
    """One release: its pins (as its image's labels will carry them) and its driver floor per architecture."""
    labels = rel.labels()
    return {
        "image": rel.image, "release": rel.tag, "ref": rel.ref, "cuda": rel.cuda,
        "cudnn": labels.get(PIN_PREFIX + "cudnn"), "nccl": labels.get(PIN_PREFIX + "nccl"),
        "tensorrt": labels.get(PIN_PREFIX + "tensorrt"),
        "framework": rel.framework.wheel if rel.framework else None,
        "framework_version": rel.framework.version if rel.framework else None,
        "python": rel.spec.python, "min_driver": rel.min_driver, "full_driver": rel.full_driver,
        "compute_capabilities": list(rel.compute_capabilities),
        "drivers": {architecture(cc): f"≥ {rel.min_driver_for(cc)}" for cc in rel.compute_capabilities},
        "buildable": cat.image(rel.image).buildable, "newest": cat.newest(rel.image).tag == rel.tag,
    }
