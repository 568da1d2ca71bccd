"""`ngcx.yaml`: load, validate and complete a project (parse -> schema -> rules -> complete).

Why the catalog's shape: one limited YAML loader (core/yamlio.py: no code execution, bounded
nesting and aliases), a strict pydantic schema (unknown keys are errors; the published JSON
Schema, ngcx.schema.json beside this file, is generated from it), then rules that need the
catalog and the project folder, each a typed Problem with file:line. `base:` names a catalog
release and decides CUDA, cuDNN, NCCL, Python and the framework: the file has no CUDA field, so
a project cannot drift from the pins its base was verified with (app-projects.md §9.1).
"""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..core.problems import Problem, ProblemsFound, schema_problems

if TYPE_CHECKING:
    from ..catalog.model import Catalog, Release

NAME = re.compile(r"^[a-z0-9]+(?:[._-][a-z0-9]+)*\Z")          # a Docker repository path component
HANDLER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*\Z")
ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
SERVABLE = ("onnx", "pt2")                 # formats ngcx-runtime serves without a handler
IMAGE_PREFIX = "ngcx-app"


# ----------------------------------------------------------------------------- schema


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    """The model file and how to serve it (precision, batch profile, dynamic batching)."""

    path: str = Field(description="model file or folder, relative to ngcx.yaml: .onnx, .pt2 or a SavedModel folder")
    name: str | None = Field(None, description="model name in the URL /v2/models/NAME (default: the project name)")
    format: Literal["onnx", "pt2", "savedmodel"] | None = Field(None, description="default: sniffed from the file")
    precision: Literal["fp32", "fp16", "int8"] = "fp32"
    calibration: str | None = Field(None, description=".npz of inputs keyed by input name; required for int8")
    batch: list[int] = Field(default_factory=lambda: [1], description="batch profile, e.g. [1, 8, 32]")
    max_queue_delay_ms: float = Field(1.0, ge=0, description="dynamic batching: longest wait for more requests")


class ProjectSpec(_Strict):
    """ngcx.yaml: a user's model and code on a catalog release."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="ngcx.yaml")

    name: str = Field(description="project name: lower-case letters, digits and . _ - (the image name)")
    base: str = Field(description="catalog release to build FROM, e.g. pytorch:25.08 (decides CUDA, Python, ...)")
    variant: Literal["runtime", "devel"] = "runtime"
    system_packages: list[str] = Field(default_factory=list, description="Debian packages")
    python_packages: list[str] = Field(default_factory=list, description="PEP 508 requirements")
    requirements: str | None = Field(None, description="a requirements.txt, relative to ngcx.yaml")
    model: ModelSpec | None = None
    handler: str | None = Field(None, description="module:Class with load() and predict() for pre/post-processing")
    files: list[str] = Field(default_factory=list, description="files and folders to copy (code, labels, ...)")
    env: dict[str, str] = Field(default_factory=dict)
    ports: list[int] = Field(default_factory=lambda: [8000])
    command: list[str] | None = Field(None, description="default: serve the model on the first port")
    examples: str | None = Field(None, description="examples.yaml: requests and expected outputs")

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, v: Any) -> Any:
        """YAML reads `THREADS: 4` as a number; an environment value is text either way."""
        if isinstance(v, dict):
            return {k: str(x).lower() if isinstance(x, bool) else str(x) if isinstance(x, int | float) else x
                    for k, x in v.items()}
        return v


def json_schema() -> dict[str, Any]:
    """The published JSON Schema (ngcx.schema.json), generated from ProjectSpec."""
    schema = ProjectSpec.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://ngcx.dev/schemas/ngcx.schema.json"
    return schema


def schema_file() -> Path:
    return Path(__file__).with_name("ngcx.schema.json")


# ----------------------------------------------------------------------------- parse (with lines)


def parse(text: str, source: str) -> tuple[dict, dict[tuple, int]]:
    """YAML text -> (mapping, {path: line}); the limited loader raises UserError for bad YAML."""
    from ..core.yamlio import load_mapping_with_lines

    return load_mapping_with_lines(text, source, "a mapping with at least 'name' and 'base'")


def _where(source: str, lines: dict[tuple, int], loc: tuple) -> str:
    from ..core.problems import where

    return where(source, lines, loc)


def _schema_problems(exc: ValidationError, source: str, lines: dict[tuple, int]) -> list[Problem]:
    return schema_problems(exc, source, lines, "remove it or check its spelling; the schema is ngcx.schema.json")


# ----------------------------------------------------------------------------- rules + complete


@dataclass(frozen=True)
class Project:
    """A validated project: everything build, lock, test and run need, resolved once."""

    root: Path
    file: Path
    spec: ProjectSpec
    release: Release
    model: Path | None
    model_format: str | None
    requirements: tuple[str, ...]       # python_packages + the requirements file's lines, in order
    examples: Path | None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def model_name(self) -> str:
        return (self.spec.model.name if self.spec.model and self.spec.model.name else None) or self.spec.name

    @property
    def image_tag(self) -> str:
        return f"{IMAGE_PREFIX}/{self.spec.name}:latest"


class _Rules:
    """Checks that need the catalog and the project folder; every violation is collected."""

    def __init__(self, spec: ProjectSpec, root: Path, source: str, lines: dict[tuple, int], catalog: Catalog):
        self.spec, self.root, self.source, self.lines, self.catalog = spec, root, source, lines, catalog
        self.problems: list[Problem] = []
        self.release: Release | None = None
        self.model_format: str | None = None
        self.requirements: list[str] = []

    def add(self, loc: tuple, rule: str, message: str, hint: str = "", where: str | None = None) -> None:
        field = ".".join(str(p) for p in loc)
        self.problems.append(Problem(where or _where(self.source, self.lines, loc), field, rule, message, hint))

    def run(self) -> None:
        self.name()
        self.base()
        self.model()
        self.handler()
        self.packages()
        self.paths()
        self.env_and_ports()
        if self.spec.model is None and self.spec.handler is None and self.spec.command is None:
            self.add((), "project.nothing-to-run", "the project has no model, handler or command",
                     "add `model: {path: model.onnx}` (or run `ngcx init --model PATH`)")

    def name(self) -> None:
        if not NAME.match(self.spec.name):
            self.add(("name",), "name.invalid", f"{self.spec.name!r} is not a valid image name",
                     "use lower-case letters, digits and single . _ - between them, e.g. resnet-classifier")

    def base(self) -> None:
        from ..core.errors import UserError

        try:
            self.release = self.catalog.resolve(self.spec.base)
        except UserError as exc:
            self.add(("base",), "base.unknown", exc.message, exc.hint or "")
            return
        image = self.catalog.image(self.release.image)
        if not image.buildable:
            self.add(("base",), "base.not-buildable", f"{self.release.ref} cannot be built here",
                     image.not_buildable_reason or "pick another release (`ngcx catalog ls`)")

    def model(self) -> None:
        m = self.spec.model
        if m is None:
            return
        path = self._existing(("model", "path"), m.path, "model")
        if path is not None:
            sniffed = sniff_format(path)
            if sniffed is None:
                self.add(("model", "path"), "model.not-a-model", f"{m.path} is not an ONNX, .pt2 or SavedModel model",
                         "export it with torch.onnx.export, torch.export.save or tf.saved_model.save")
            elif m.format and m.format != sniffed:
                self.add(("model", "format"), "model.format-mismatch", f"format {m.format} but the file is {sniffed}",
                         "remove `format:` (it is sniffed) or point `path:` at the right file")
            self.model_format = m.format or sniffed
            if self.model_format and self.model_format not in SERVABLE and self.spec.handler is None:
                self.add(("model",), "model.needs-handler", f"ngcx-runtime cannot serve a {self.model_format} model "
                         "without code", "add `handler: module:Class` that loads and runs it")
        if m.precision == "int8" and not m.calibration:
            self.add(("model", "calibration"), "model.int8-needs-calibration", "precision int8 needs calibration data",
                     "add `calibration: calib.npz` (inputs keyed by input name)")
        if m.calibration:
            self._existing(("model", "calibration"), m.calibration, "calibration data")
        if not m.batch or any(b < 1 for b in m.batch) or m.batch != sorted(set(m.batch)):
            self.add(("model", "batch"), "model.batch-profile",
                     f"batch profile {m.batch} must be increasing sizes >= 1",
                     "e.g. [1, 8, 32]; the largest is the server's max batch")

    def handler(self) -> None:
        h = self.spec.handler
        if h is None:
            return
        if not HANDLER.match(h):
            self.add(("handler",), "handler.format", f"{h!r} is not module:Class", "e.g. handler: predict:Classifier")
            return
        module = h.split(":")[0].replace(".", "/")
        if not ((self.root / f"{module}.py").is_file() or (self.root / module / "__init__.py").is_file()):
            self.add(("handler",), "handler.missing", f"no {module}.py next to ngcx.yaml",
                     "create it (`ngcx init --handler` writes a stub) or fix the module name")

    def packages(self) -> None:
        from packaging.requirements import InvalidRequirement, Requirement

        lines: list[tuple[tuple, str, str | None]] = [
            (("python_packages", i), p, None) for i, p in enumerate(self.spec.python_packages)]
        if self.spec.requirements:
            file = self._existing(("requirements",), self.spec.requirements, "requirements file")
            if file is not None:
                lines += [(("requirements",), text, f"{file}:{n}") for n, text in requirement_lines(file)]
        pins = pinned_versions(self.release) if self.release else {}
        for loc, text, where in lines:
            try:
                req = Requirement(text)
            except InvalidRequirement as exc:
                self.add(loc, "packages.invalid", f"{text!r} is not a requirement: {exc}",
                         "write NAME, NAME==VERSION or NAME>=VERSION", where)
                continue
            wheel, pinned = pins.get(canonical(req.name), (None, None))
            if pinned and not req.specifier.contains(pinned, prereleases=True):
                self.add(loc, "packages.breaks-pin", f"requirement {text!r} would replace {wheel}=={pinned}, "
                         f"pinned by {self.spec.base}", f"drop it (the base provides {wheel} {pinned}) or "
                         "choose a base release that pins the version you need (`ngcx catalog ls`)", where)
                continue
            self.requirements.append(text)
        for i, pkg in enumerate(self.spec.system_packages):
            if not re.match(r"^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+:~-]+)?\Z", pkg):
                self.add(("system_packages", i), "packages.apt-name", f"{pkg!r} is not a Debian package name",
                         "e.g. libgl1 or libgl1=1.6.0-1")

    def paths(self) -> None:
        for i, f in enumerate(self.spec.files):
            self._existing(("files", i), f, "file")
        if self.spec.examples:
            self._existing(("examples",), self.spec.examples, "examples file")

    def env_and_ports(self) -> None:
        for key in self.spec.env:
            if not ENV_KEY.match(key):
                self.add(("env", key), "env.name", f"{key!r} is not an environment variable name",
                         "use letters, digits and _")
        for i, port in enumerate(self.spec.ports):
            if not 1 <= port <= 65535:
                self.add(("ports", i), "ports.range", f"port {port} is outside 1-65535")

    def _existing(self, loc: tuple, rel: str, what: str) -> Path | None:
        """rel resolved inside the project folder; outside it, or missing, is a problem."""
        path = (self.root / rel).resolve()
        if not path.is_relative_to(self.root.resolve()):
            self.add(loc, "path.outside", f"{what} {rel} is outside the project folder",
                     "move it into the folder that holds ngcx.yaml (it is the build context)")
            return None
        if not path.exists():
            self.add(loc, "path.missing", f"{what} {rel} does not exist", f"check the path relative to {self.root}")
            return None
        return path


def canonical(name: str) -> str:
    """PEP 503 normalized name: Torch, torch and tor_ch... compare equal."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned_versions(release: Release) -> dict[str, tuple[str, str]]:
    """canonical name -> (wheel, version) for every wheel the base pins (CUDA libraries, framework,
    extras): exactly what the base image's /etc/ngcx/constraints.txt holds (recipes/cuda.j2, framework.j2)."""
    from ..catalog.model import parse_pin

    out = {canonical(p.wheel): (p.wheel, p.version) for p in release.pins}
    for text in (release.framework.requirement if release.framework else None, *release.extras):
        parsed = parse_pin(text) if text else None
        if parsed:
            out[canonical(parsed[0])] = parsed
    return out


def requirement_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, requirement) of a requirements.txt: comments, blank lines and pip options dropped."""
    out = []
    for n, raw in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if line and not line.startswith(("#", "-")):
            out.append((n, line))
    return out


def sniff_format(path: Path) -> str | None:
    """onnx | pt2 | savedmodel from the content, not the name; None when it is no model."""
    if path.is_dir():
        return "savedmodel" if (path / "saved_model.pb").is_file() else None
    with open(path, "rb") as f:
        head = f.read(4)
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as zf:
                names = zf.namelist()
        except zipfile.BadZipFile:
            return None
        markers = ("serialized_exported_program", "archive_format", "/models/")
        return "pt2" if any(m in n for n in names for m in markers) else None
    if _parses_as_onnx(path):
        return "onnx"
    return None


# ModelProto's field tags that may follow ir_version (field 1): producer_name (2) ... opset_import (8),
# metadata_props (14), training_info (20), functions (25): onnx.proto3.
_ONNX_SECOND_TAGS = frozenset({0x12, 0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42, 0x72, 0xA2, 0xCA})


def _parses_as_onnx(path: Path) -> bool:
    """ModelProto starts with ir_version (tag 0x08, a small varint) and then another ModelProto field.

    Only the first bytes are read: parsing the whole protobuf cost 0.18 s per 100 MB on every load.
    """
    with open(path, "rb") as f:
        head = f.read(3)
    return len(head) == 3 and head[0] == 0x08 and 1 <= head[1] <= 30 and head[2] in _ONNX_SECOND_TAGS


def load_project(file: Path, catalog: Catalog | None = None) -> Project:
    """Parse, validate and complete ngcx.yaml; every problem found -> ProblemsFound (exit 2)."""
    from ..catalog import load_catalog
    from ..core.yamlio import read_text

    source = str(file)
    text = read_text(file, "check the path; `ngcx init` writes an ngcx.yaml")
    data, lines = parse(text, source)
    try:
        spec = ProjectSpec.model_validate(data)
    except ValidationError as exc:
        raise ProblemsFound(file.name, _schema_problems(exc, source, lines)) from None
    rules = _Rules(spec, file.parent.resolve(), source, lines, catalog or load_catalog())
    rules.run()
    if rules.problems:
        raise ProblemsFound(file.name, rules.problems)
    assert rules.release is not None
    root = file.parent.resolve()
    return Project(root=root, file=file.resolve(), spec=spec, release=rules.release,
                   model=(root / spec.model.path).resolve() if spec.model else None,
                   model_format=rules.model_format, requirements=tuple(rules.requirements),
                   examples=(root / spec.examples) if spec.examples else None)
