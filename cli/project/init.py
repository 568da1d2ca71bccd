"""Behind `ngcx init [DIR] --model PATH [--base REF] [--name N] [--handler] [--force]`: start a project.

Why sniff instead of asking: the signature a user would type by hand (names, datatypes, which dims
are dynamic) is exactly what goes wrong first (app-projects.md §9.1, Truss's `truss init`). ngcx
reads it from the model, so the generated ngcx.yaml, examples.yaml and handler stub agree with
what the server will really accept; `load_project` and `load_examples` accept them unchanged.
Nothing is written until everything is known (format, base, signature, no file in the way), so a
bad model or an existing file leaves the folder as it was.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import UserError

if TYPE_CHECKING:
    from ..catalog.model import Catalog, Release
    from .sniff import Signature

# Which catalog image's framework reads each format (the default base is its newest release).
READERS = {"onnx": ("onnxruntime", "tensorrt"), "pt2": ("pytorch",), "savedmodel": ("tensorflow",)}
FORMAT_NAMES = {"onnx": "an ONNX", "pt2": "a .pt2", "savedmodel": "a SavedModel"}
INLINE_MAX = 64          # input elements written inline in examples.yaml; larger ones go to an .npy
SAMPLES = "samples"
EXAMPLE = "zeros"        # the stub example's name (its large inputs: samples/zeros-<input>.npy)


@dataclass(frozen=True)
class Plan:
    """What init will write: path (relative to DIR) -> text or bytes, plus the model to copy."""

    root: Path
    files: dict[str, str | bytes]
    model_src: Path
    model_rel: str
    copy_model: bool


def default_name(folder: Path) -> str:
    """A valid image name from the folder's name: lower case, odd characters -> '-'."""
    name = re.sub(r"[^a-z0-9]+", "-", folder.resolve().name.lower()).strip("-")
    return name or "model"


def choose_base(catalog: Catalog, fmt: str, base: str | None) -> Release:
    """--base, else the newest release of the first image whose framework reads `fmt`."""
    readers = [r for r in READERS[fmt] if r in catalog.releases]
    buildable = [r for r in readers if catalog.image(r).buildable] or readers
    if base:
        release = catalog.resolve(base)
        if release.image not in readers:
            raise UserError(f"--base {base}: {release.image} has no framework that reads {FORMAT_NAMES[fmt]} model",
                            hint=f"use {' or '.join(catalog.newest(r).ref for r in buildable)}")
        return release
    if not buildable:
        raise UserError(f"the catalog has no image that reads {FORMAT_NAMES[fmt]} model", hint="pass --base")
    return catalog.newest(buildable[0])


def sniff_model(path: Path) -> str:
    """The model's format, or a one-line refusal for anything that is not a model."""
    from .spec import sniff_format

    if not path.exists():
        raise UserError(f"--model {path}: no such file or folder", hint="pass the exported model's path")
    fmt = sniff_format(path)
    if fmt is None:
        raise UserError(f"--model {path} is not an ONNX, .pt2 or SavedModel model",
                        hint="export it with torch.onnx.export, torch.export.save or tf.saved_model.save")
    return fmt


def batch_profile(sig: Signature) -> list[int]:
    """[1, 8] when every tensor's dim 0 is dynamic (the server may batch), else [1]."""
    tensors = sig.inputs + sig.outputs
    batchable = tensors and all(t["shape"] and t["shape"][0] == -1 for t in tensors)
    return [1, 8] if batchable else [1]


def example_inputs(sig: Signature) -> tuple[list[dict[str, Any]], dict[str, bytes]]:
    """One example per the signature: zeros (empty strings for BYTES), dynamic dims -> 1.

    Large tensors (an image) go to samples/<input>.npy instead of thousands of inline zeros."""
    import io
    import math

    import numpy as np

    from .sniff import numpy_dtype

    rows, files = [], {}
    for t in sig.inputs:
        shape = [d if d >= 0 else 1 for d in t["shape"]]
        count = math.prod(shape)
        if t["datatype"] == "BYTES":
            source = "data: " + str([""] * count).replace("'", '"')
        elif count <= INLINE_MAX:
            zero = "false" if t["datatype"] == "BOOL" else "0"
            source = f"data: [{', '.join([zero] * count)}]"
        else:
            rel = f"{SAMPLES}/{EXAMPLE}-{_file_stem(t['name'])}.npy"
            buf = io.BytesIO()
            np.save(buf, np.zeros(shape, dtype=numpy_dtype(t["datatype"])), allow_pickle=False)
            files[rel] = buf.getvalue()
            source = f"npy: {rel}"
        rows.append({"name": t["name"], "datatype": t["datatype"], "shape": shape, "source": source})
    return rows, files


def _file_stem(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip(".") or "input"


def plan_init(folder: Path, model: Path, base: str | None, name: str | None, handler: bool,
              catalog: Catalog) -> tuple[Plan, Release, Signature]:
    """Everything init will write, decided before writing anything."""
    from ..core import naming
    from .sniff import sniff_signature

    fmt = sniff_model(model)
    release = choose_base(catalog, fmt, base)
    root = folder.resolve()
    src = model.resolve()
    inside = src.is_relative_to(root)
    rel = src.relative_to(root).as_posix() if inside else f"model/{src.name}"
    tag = naming.local_tag(release.image, release.tag, "runtime")
    sig = sniff_signature(src, fmt, tag, f"ngcx build {release.ref}")
    name = name or default_name(root)
    from .spec import NAME

    if not NAME.match(name):
        raise UserError(f"--name {name!r} is not a valid image name",
                        hint="use lower-case letters, digits and single . _ - between them, e.g. resnet-classifier")
    handler = handler or fmt == "savedmodel"          # ngcx-runtime cannot serve a SavedModel without code
    context = {"name": name, "base": release.ref, "format": fmt, "model_path": rel, "model_file": src.name,
               "signature": sig, "batch": batch_profile(sig), "handler": handler, "python_packages": []}
    inputs, samples = example_inputs(sig)
    outputs = [{**t, "file_stem": _file_stem(t["name"])} for t in sig.outputs]
    env = _templates()
    files: dict[str, str | bytes] = {
        "ngcx.yaml": env.get_template("ngcx.yaml.j2").render(context),
        "examples.yaml": env.get_template("examples.yaml.j2").render(
            {**context, "example_name": EXAMPLE, "inputs": inputs, "outputs": outputs}),
        **samples,
    }
    if handler:
        files["handler.py"] = env.get_template("handler.py.j2").render(context)
    return Plan(root, files, src, rel, not inside), release, sig


def _templates():
    """Jinja2 over recipes/project/; `yq` quotes a YAML scalar, `pyq` a Python string (JSON is both)."""
    import json

    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    from ..core import paths

    env = Environment(loader=FileSystemLoader(str(paths.recipes_dir() / "project")), undefined=StrictUndefined,
                      keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["yq"] = lambda v: v if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_./-]*", str(v)) and not re.fullmatch(
        r"(?i)(y|n|yes|no|on|off|true|false|null|~)", str(v)) else json.dumps(str(v))
    env.filters["pyq"] = lambda v: json.dumps(str(v))
    return env


def in_the_way(plan: Plan) -> list[Path]:
    """Files init would overwrite (the model copy only when it differs)."""
    taken = [plan.root / rel for rel in plan.files if (plan.root / rel).exists()]
    if plan.copy_model:
        dest = plan.root / plan.model_rel
        if dest.exists() and not _same(dest, plan.model_src):
            taken.append(dest)
    return taken


def _same(a: Path, b: Path) -> bool:
    import filecmp

    return a.is_file() and b.is_file() and filecmp.cmp(a, b, shallow=False)


def write(plan: Plan) -> list[Path]:
    """Write the planned files (and copy the model); the paths written, model first."""
    import shutil

    written = []
    plan.root.mkdir(parents=True, exist_ok=True)
    if plan.copy_model:
        dest = plan.root / plan.model_rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        if plan.model_src.is_dir():
            shutil.rmtree(dest, ignore_errors=True)
            shutil.copytree(plan.model_src, dest)
        elif not _same(dest, plan.model_src):
            shutil.copyfile(plan.model_src, dest)
        written.append(dest)
    for rel, content in plan.files.items():
        path = plan.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        written.append(path)
    return written


def init_project(folder: Path, model: Path, base: str | None = None, name: str | None = None,
                 handler: bool = False, force: bool = False, catalog: Catalog | None = None) -> list[Path]:
    """The command's work, callable from tests: plan, refuse on a file in the way, write, re-check."""
    from ..catalog import load_catalog
    from .examples import load_examples
    from .spec import load_project

    catalog = catalog or load_catalog()
    if folder.exists() and not folder.is_dir():
        raise UserError(f"{folder} is a file, not a folder", hint="pass the project folder as DIR")
    plan, release, sig = plan_init(folder, model, base, name, handler, catalog)
    taken = in_the_way(plan)
    if taken and not force:
        shown = ", ".join(str(p) for p in taken[:3]) + (f" (+{len(taken) - 3} more)" if len(taken) > 3 else "")
        one = len(taken) == 1
        raise UserError(f"{shown} already exist{'s' if one else ''}; ngcx init writes nothing over "
                        f"{'it' if one else 'them'}",
                        hint="pass --force to overwrite, or init into another folder")
    written = write(plan)
    project = load_project(plan.root / "ngcx.yaml", catalog)      # the generated files must load as written
    assert project.examples is not None
    load_examples(project.examples, sig.inputs, sig.outputs)
    return written
