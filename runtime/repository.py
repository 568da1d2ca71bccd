"""A model repository on disk: DIR/<model>/<version>/ with an optional DIR/<model>/config.{json,yaml}.

Why Triton's layout: users arrive with Triton repositories and tritonclient scripts; the same
tree (numeric version folders, per-model config with `max_batch_size`, `dynamic_batching`,
`version_policy`) serves here unchanged, minus Triton's backend-specific fields. A version
folder holds `model.onnx`, `model.pt2`, or an optimized plan (`ngcx-runtime optimize MODEL -o
DIR/<model>/1` writes one), so the plan cache and GPU checks of plan.py apply per version.

Differences from Triton, on purpose: no config file means the server's flags (--max-batch,
--max-queue-delay-ms) with dynamic batching on, as `serve MODEL`; a config without max_batch_size
takes the server's --max-batch (Triton's default would be 0, no batching); unknown fields are
refused with their names instead of being ignored. A config without dynamic_batching does not
merge requests, as in Triton.

Everything here is pure file and data handling: one-line RuntimeUserErrors naming the file and
the fix, no sockets, no engines. served.py loads what this module resolves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import RuntimeUserError

CONFIG_FILES = ("config.json", "config.yaml", "config.yml")
MODEL_FILES = ("model.onnx", "model.pt2")
MAX_CONFIG_BYTES = 1 << 20          # a config is a few hundred bytes
MAX_NAME = 255
PLATFORM_BACKENDS = {"onnxruntime_onnx": "onnxruntime", "tensorrt_plan": "tensorrt",
                     "pytorch_libtorch": "pytorch", "pytorch_torchscript": "pytorch"}
BACKENDS = ("onnxruntime", "tensorrt", "pytorch")
CONFIG_KEYS = ("name", "backend", "platform", "max_batch_size", "dynamic_batching", "version_policy",
               "default_model_filename", "instance_group")
INSTANCE_KEYS = ("name", "count", "kind", "gpus")
INSTANCE_KINDS = ("KIND_AUTO", "KIND_GPU", "KIND_CPU")
MAX_INSTANCES = 64
BATCHING_KEYS = ("preferred_batch_size", "max_queue_delay_microseconds")


@dataclass(frozen=True)
class VersionPolicy:
    """Which version folders are served: the newest `latest` ones, all, or a given list (Triton's policy)."""

    latest: int | None = 1
    specific: tuple[int, ...] = ()

    def select(self, available: list[int]) -> list[int]:
        ordered = sorted(available)
        if self.specific:
            return [v for v in ordered if v in self.specific]
        if self.latest is None:
            return ordered
        return ordered[-self.latest:]

    def describe(self) -> str:
        if self.specific:
            return f"versions {', '.join(map(str, self.specific))}"
        return "all versions" if self.latest is None else f"the latest {self.latest} version(s)"


@dataclass(frozen=True)
class ModelConfig:
    """What a model's config says; None = not given (the server's flags apply)."""

    max_batch_size: int | None = None
    dynamic_batching: bool | None = None         # None: no config file at all (merging on, as `serve MODEL`)
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ms: float | None = None
    backend: str | None = None
    versions: VersionPolicy = field(default_factory=VersionPolicy)
    default_model_filename: str | None = None
    devices: tuple[int | str | None, ...] | None = None   # one entry per instance (instance_group); None: not given
    source: str | None = None                    # the file it came from, for messages


def valid_name(name: str) -> bool:
    """A model name is one plain directory name: it is joined to the repository path."""
    return (0 < len(name) <= MAX_NAME and name not in (".", "..") and not name.startswith(".")
            and name.isprintable() and not any(c in name for c in "/\\\0"))


def is_repository(path: Path) -> bool:
    """A folder without a plan manifest is read as a repository (a plan dir has manifest.json)."""
    return path.is_dir() and not (path / "manifest.json").exists()


def model_names(root: Path) -> list[str]:
    """The repository's model folders (hidden ones skipped), sorted."""
    try:
        return sorted(p.name for p in root.iterdir() if p.is_dir() and valid_name(p.name))
    except OSError as exc:
        raise RuntimeUserError(f"{root}: cannot list the model repository ({exc.strerror or exc})") from None


def read_config(model_dir: Path) -> ModelConfig:
    """DIR/<model>/config.json or config.yaml, checked; no file = ModelConfig() (server defaults)."""
    found = [model_dir / n for n in CONFIG_FILES if (model_dir / n).is_file()]
    if not found:
        return ModelConfig()
    if len(found) > 1:
        raise RuntimeUserError(f"{model_dir}: both {found[0].name} and {found[1].name}; keep one config file")
    path = found[0]
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise RuntimeUserError(f"{path}: {path.stat().st_size} bytes; a model config is a few hundred bytes")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RuntimeUserError(f"{path}: unreadable ({str(exc).splitlines()[0][:160]})") from None
    doc = _parse_yaml(text, path) if path.suffix in (".yaml", ".yml") else parse_json(text, str(path))
    return parse_config(doc, str(path), expected_name=model_dir.name)


def parse_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise RuntimeUserError(f"{where}: not valid JSON ({str(exc)[:160]})") from None
    except RecursionError:
        raise RuntimeUserError(f"{where}: JSON nested too deeply") from None


def _parse_yaml(text: str, path: Path) -> Any:
    try:
        import yaml
    except ImportError:
        raise RuntimeUserError(f"{path}: reading YAML needs PyYAML, which is not installed here; write the same "
                               f"fields as {path.with_name('config.json').name} instead") from None
    try:
        return yaml.safe_load(text)
    except (yaml.YAMLError, RecursionError) as exc:
        first = " ".join(str(exc).split())[:200] if not isinstance(exc, RecursionError) else "nested too deeply"
        raise RuntimeUserError(f"{path}: not valid YAML ({first})") from None


def parse_config(doc: Any, where: str, expected_name: str | None = None) -> ModelConfig:
    """Check a decoded config (Triton's field names) and turn it into a ModelConfig.

    Unknown fields are refused rather than ignored: a typo such as `max_batch` would otherwise
    silently serve with defaults, the kind of surprise this project avoids.
    """
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise RuntimeUserError(f"{where}: a model config is an object (mapping), not a {type(doc).__name__}")
    unknown = sorted(str(k) for k in doc if k not in CONFIG_KEYS)
    if unknown:
        raise RuntimeUserError(f"{where}: unknown field(s) {', '.join(unknown)[:120]}; known: {', '.join(CONFIG_KEYS)}")
    name = doc.get("name")
    if name is not None and expected_name is not None and name != expected_name:
        raise RuntimeUserError(f"{where}: name {_short(name)} differs from its folder {expected_name!r}; "
                               "drop the field or rename the folder")
    max_batch = _int(doc, "max_batch_size", where, minimum=0)
    preferred, delay_ms, batching = _dynamic_batching(doc, where, max_batch)
    return ModelConfig(
        max_batch_size=max_batch, dynamic_batching=batching, preferred_batch_sizes=preferred,
        max_queue_delay_ms=delay_ms, backend=_backend(doc, where), versions=_version_policy(doc, where),
        default_model_filename=_filename(doc, where), devices=instance_devices(doc.get("instance_group"), where),
        source=where)


def instance_devices(raw: Any, where: str) -> tuple[int | str | None, ...] | None:
    """Triton's instance_group as one device per instance: `count` instances on each GPU listed in
    `gpus` (KIND_GPU), on the CPU (KIND_CPU), on every visible GPU (KIND_GPU without gpus: "gpu", placement.py
    expands it when the model loads, as Triton does), or on the backend's choice (KIND_AUTO: None, which
    placement.py spreads over every visible GPU). None when the config has no instance_group."""
    if raw is None:
        return None
    usage = 'instance_group is a list such as [{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1]}]'
    if not isinstance(raw, list) or not raw:
        raise RuntimeUserError(f"{where}: {usage}")
    devices: list[int | str | None] = []
    for group in raw:
        if not isinstance(group, dict):
            raise RuntimeUserError(f"{where}: {usage}")
        unknown = sorted(str(k) for k in group if k not in INSTANCE_KEYS)
        if unknown:
            raise RuntimeUserError(f"{where}: unknown instance_group field(s) {', '.join(unknown)[:120]}; known: "
                                   f"{', '.join(INSTANCE_KEYS)}")
        count = _int(group, "count", where, minimum=1) or 1
        kind = group.get("kind", "KIND_AUTO")
        if kind not in INSTANCE_KINDS:
            raise RuntimeUserError(f"{where}: instance_group kind {_short(kind)} is not one of "
                                   f"{', '.join(INSTANCE_KINDS)}")
        gpus = group.get("gpus") or []
        if not isinstance(gpus, list) or not all(isinstance(g, int) and not isinstance(g, bool) and 0 <= g < 1024
                                                 for g in gpus):
            raise RuntimeUserError(f"{where}: instance_group gpus must be a list of GPU indices, got {_short(gpus)}")
        if gpus and kind == "KIND_CPU":
            raise RuntimeUserError(f"{where}: an instance_group of kind KIND_CPU takes no gpus")
        placed: list[int | str | None] = (["cpu"] if kind == "KIND_CPU" else list(gpus) if gpus
                                          else ["gpu"] if kind == "KIND_GPU" else [None])
        devices += [d for d in placed for _ in range(count)]
    if len(devices) > MAX_INSTANCES:
        raise RuntimeUserError(f"{where}: instance_group asks for {len(devices)} instances; at most {MAX_INSTANCES}")
    return tuple(devices)


def _short(value: Any) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:60] + "..."


def _int(doc: dict, key: str, where: str, minimum: int) -> int | None:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum or value > 2**31:
        raise RuntimeUserError(f"{where}: {key} must be an integer of at least {minimum}, got {_short(value)}")
    return value


def _dynamic_batching(doc: dict, where: str, max_batch: int | None) -> tuple[tuple[int, ...], float | None, bool]:
    """dynamic_batching: {preferred_batch_size: [..], max_queue_delay_microseconds: N}; absent = no merging."""
    if "dynamic_batching" not in doc:
        return (), None, False
    raw = doc["dynamic_batching"]
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RuntimeUserError(f"{where}: dynamic_batching must be an object such as "
                               '{"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 1000}')
    unknown = sorted(str(k) for k in raw if k not in BATCHING_KEYS)
    if unknown:
        raise RuntimeUserError(f"{where}: unknown dynamic_batching field(s) {', '.join(unknown)[:120]}; "
                               f"known: {', '.join(BATCHING_KEYS)}")
    if max_batch == 0:
        raise RuntimeUserError(f"{where}: dynamic_batching needs max_batch_size above 0 (0 means the model "
                               "has no batch dimension)")
    sizes = raw.get("preferred_batch_size") or []
    if not isinstance(sizes, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1
                                              for s in sizes):
        raise RuntimeUserError(f"{where}: preferred_batch_size must be a list of positive integers, "
                               f"got {_short(sizes)}")
    if max_batch and any(s > max_batch for s in sizes):
        raise RuntimeUserError(f"{where}: preferred_batch_size {sizes} exceeds max_batch_size {max_batch}")
    delay = _int(raw, "max_queue_delay_microseconds", where, minimum=0)
    return tuple(sorted(set(sizes))), (None if delay is None else delay / 1000.0), True


def _backend(doc: dict, where: str) -> str | None:
    backend, platform = doc.get("backend"), doc.get("platform")
    if backend is not None and backend not in BACKENDS:
        raise RuntimeUserError(f"{where}: backend {_short(backend)} is not one of {', '.join(BACKENDS)}")
    if platform is not None:
        if platform not in PLATFORM_BACKENDS:
            raise RuntimeUserError(f"{where}: platform {_short(platform)} is not one of "
                                   f"{', '.join(PLATFORM_BACKENDS)}")
        if backend is not None and PLATFORM_BACKENDS[platform] != backend:
            raise RuntimeUserError(f"{where}: platform {platform} contradicts backend {backend}; keep one")
        backend = PLATFORM_BACKENDS[platform]
    return backend


def _version_policy(doc: dict, where: str) -> VersionPolicy:
    raw = doc.get("version_policy")
    if raw is None:
        return VersionPolicy()
    usage = ('version_policy is one of {"latest": {"num_versions": N}}, {"all": {}}, '
             '{"specific": {"versions": [1, 3]}}')
    if not isinstance(raw, dict) or len(raw) != 1:
        raise RuntimeUserError(f"{where}: {usage}")
    kind, body = next(iter(raw.items()))
    body = {} if body is None else body
    if kind == "all" and body == {}:
        return VersionPolicy(latest=None)
    if kind == "latest" and isinstance(body, dict) and set(body) <= {"num_versions"}:
        n = _int(body, "num_versions", where, minimum=1)
        return VersionPolicy(latest=1 if n is None else n)
    if kind == "specific" and isinstance(body, dict) and set(body) == {"versions"}:
        versions = body["versions"]
        if (isinstance(versions, list) and versions
                and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in versions)):
            return VersionPolicy(latest=None, specific=tuple(sorted(set(versions))))
    raise RuntimeUserError(f"{where}: {usage}")


def _filename(doc: dict, where: str) -> str | None:
    name = doc.get("default_model_filename")
    if name is None:
        return None
    if not isinstance(name, str) or not valid_name(name):
        raise RuntimeUserError(f"{where}: default_model_filename must be a file name inside the version folder, "
                               f"got {_short(name)}")
    return name


def model_versions(model_dir: Path, config: ModelConfig) -> dict[str, Path]:
    """Version -> what to load (a plan dir or a model file), for the versions the policy selects."""
    if not model_dir.is_dir():
        raise RuntimeUserError(f"{model_dir}: no such model folder")
    try:
        entries = list(model_dir.iterdir())
    except OSError as exc:
        raise RuntimeUserError(f"{model_dir}: cannot list it ({exc.strerror or exc})") from None
    available = sorted(int(p.name) for p in entries
                       if p.is_dir() and p.name.isdigit() and p.name.isascii() and str(int(p.name)) == p.name)
    if not available:
        raise RuntimeUserError(f"{model_dir}: no version folder; put the model at {model_dir}/1/model.onnx "
                               "(numeric version folders, as Triton)")
    chosen = config.versions.select(available)
    if not chosen:
        raise RuntimeUserError(f"{model_dir}: the version policy ({config.versions.describe()}) selects none of "
                               f"the versions present ({', '.join(map(str, available))})")
    return {str(v): artifact(model_dir / str(v), config) for v in chosen}


def artifact(version_dir: Path, config: ModelConfig) -> Path:
    """The plan dir itself (manifest.json), the configured file, or model.onnx / model.pt2."""
    if (version_dir / "manifest.json").is_file():
        return version_dir
    names = (config.default_model_filename,) if config.default_model_filename else MODEL_FILES
    for name in names:
        if (version_dir / name).is_file():
            return version_dir / name
    wanted = " or ".join(names) + ("" if config.default_model_filename else " or an optimized plan (manifest.json)")
    raise RuntimeUserError(f"{version_dir}: no {wanted} in the version folder")
