"""A model's real input/output signature: names, KServe datatypes, shapes with -1 for dynamic dims.

Why two ways: ONNX is a protobuf the `onnx` package reads on the host in milliseconds, but a
.pt2 (torch.export) or a SavedModel can only be read by the framework that wrote it, and the
host has neither torch nor TensorFlow (nor should it need them). Those are read inside the
project's base image, which has the pinned framework and ngcx-runtime: the signature `ngcx init`
writes is then the one the served image will really have.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import UserError

if TYPE_CHECKING:
    import numpy as np

# onnx.TensorProto.DataType -> KServe v2 datatype
ONNX_TO_KSERVE = {1: "FP32", 2: "UINT8", 3: "INT8", 4: "UINT16", 5: "INT16", 6: "INT32", 7: "INT64", 8: "BYTES",
                  9: "BOOL", 10: "FP16", 11: "FP64", 12: "UINT32", 13: "UINT64", 16: "BF16"}
NUMPY_NAMES = {"BOOL": "bool", "UINT8": "uint8", "UINT16": "uint16", "UINT32": "uint32", "UINT64": "uint64",
               "INT8": "int8", "INT16": "int16", "INT32": "int32", "INT64": "int64", "FP16": "float16",
               "FP32": "float32", "FP64": "float64", "BF16": "float32"}   # BF16 travels as FP32 in numpy

# Run inside the base image (python of its venv): prints the signature as JSON on stdout.
IN_IMAGE = r"""
import json, sys
path, fmt = sys.argv[1], sys.argv[2]
if fmt == "savedmodel":
    import tensorflow as tf
    kinds = {"float32": "FP32", "float16": "FP16", "float64": "FP64", "int8": "INT8", "int16": "INT16",
             "int32": "INT32", "int64": "INT64", "uint8": "UINT8", "bool": "BOOL", "string": "BYTES"}
    sig = tf.saved_model.load(path).signatures["serving_default"]
    def spec(name, s):
        dims = [-1 if d is None else int(d) for d in s.shape.as_list()] if s.shape.rank is not None else [-1]
        return {"name": name, "datatype": kinds.get(s.dtype.name, s.dtype.name.upper()), "shape": dims}
    ins = [spec(k, v) for k, v in sorted(sig.structured_input_signature[1].items())]
    outs = [spec(k, v) for k, v in sorted(sig.structured_outputs.items())]
else:
    from ngcx_runtime import plan
    engine = plan.load(path)
    ins = [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in engine.inputs]
    outs = [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in engine.outputs]
print("NGCX-SIGNATURE " + json.dumps({"inputs": ins, "outputs": outs}))
"""


@dataclass(frozen=True)
class Signature:
    """inputs / outputs: lists of {"name", "datatype", "shape"} (what examples.load_examples takes)."""

    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]


def numpy_dtype(datatype: str) -> np.dtype:
    """KServe datatype -> numpy dtype (BYTES -> object)."""
    import numpy as np

    return np.dtype(object) if datatype == "BYTES" else np.dtype(NUMPY_NAMES[datatype])


def onnx_signature(path: Path) -> Signature:
    """Graph inputs minus initializers (old exporters list weights as inputs), with -1 for symbolic dims."""
    import onnx

    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - any parse failure: not a readable ONNX model
        raise UserError(f"{path} is not a readable ONNX model: {str(exc).splitlines()[0][:120]}",
                        hint="re-export it (torch.onnx.export) and check it with onnx.checker") from None
    weights = {i.name for i in model.graph.initializer}
    inputs = [_onnx_tensor(v) for v in model.graph.input if v.name not in weights]
    return Signature(inputs, [_onnx_tensor(v) for v in model.graph.output])


def _onnx_tensor(value: Any) -> dict[str, Any]:
    t = value.type.tensor_type
    if not value.type.HasField("tensor_type"):
        raise UserError(f"ONNX value {value.name!r} is not a tensor (sequences and maps cannot be served)",
                        hint="export the model with tensor inputs and outputs")
    dims = [d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else -1 for d in t.shape.dim]
    return {"name": value.name, "datatype": ONNX_TO_KSERVE.get(t.elem_type, "FP32"), "shape": dims}


def image_signature(model: Path, fmt: str, image_tag: str, build_hint: str) -> Signature:
    """Read the signature inside `image_tag` (the base release: its framework + ngcx-runtime).

    The model's folder is mounted read-only, with no network: reading a model needs neither.
    """
    from docker.errors import APIError, ContainerError

    from ..core.engine import engine_client, image_or_none

    client = engine_client()
    if image_or_none(client, image_tag) is None:
        raise UserError(f"reading a {fmt} model's signature needs the base image {image_tag}, which is not "
                        "built here", hint=f"build it first: {build_hint}")
    folder = model.resolve().parent
    target = f"/w/{model.name}"
    try:
        out = client.containers.run(image_tag, entrypoint=["python", "-c", IN_IMAGE], command=[target, fmt],
                                    volumes={str(folder): {"bind": "/w", "mode": "ro"}}, remove=True,
                                    network_disabled=True, stdout=True, stderr=False,
                                    environment={"NGCX_RUNTIME_CACHE": "/tmp/ngcx-plans"})
    except ContainerError as exc:
        err = (exc.stderr or b"").decode("utf-8", "replace").strip().splitlines()
        raise UserError(f"{image_tag} could not read {model.name}: {err[-1][:200] if err else exc}",
                        hint=f"check that the model was saved with the framework version of {image_tag}") from None
    except APIError as exc:
        raise UserError(f"could not start {image_tag} to read {model.name}: {exc.explanation or exc}") from None
    for line in out.decode("utf-8", "replace").splitlines():
        if line.startswith("NGCX-SIGNATURE "):
            doc = json.loads(line.removeprefix("NGCX-SIGNATURE "))
            return Signature(doc["inputs"], doc["outputs"])
    raise UserError(f"{image_tag} printed no signature for {model.name}")


def sniff_signature(model: Path, fmt: str, image_tag: str, build_hint: str) -> Signature:
    """ONNX on the host when the onnx package is there; everything else inside the base image."""
    if fmt == "onnx":
        try:
            import onnx  # noqa: F401
        except ImportError:
            pass
        else:
            return onnx_signature(model)
    return image_signature(model, fmt, image_tag, build_hint)


def project_signature(project: Any) -> Signature | None:
    """The signature clients of a project will see, known before anything is built, or None.

    With a handler: its class's `inputs` / `outputs`, read from the source with `ast` (the handler's
    imports, e.g. Pillow, need not exist on the host); a handler without them serves the model's own
    signature (the contract). Without one: the ONNX model's. None when it can only be known from the
    running server (a .pt2 or SavedModel model, attributes computed at run time): ask its
    /v2/models/NAME metadata then.
    """
    model_sig = None
    if project.model is not None and project.model_format == "onnx":
        try:
            model_sig = onnx_signature(project.model)
        except (ImportError, UserError):
            model_sig = None
    if not project.spec.handler:
        return model_sig
    module, _, cls = project.spec.handler.partition(":")
    base = project.root / module.replace(".", "/")
    source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
    declared = handler_attributes(source, cls)
    if declared is None:
        return None
    if declared == {}:
        return model_sig
    return Signature(declared["inputs"], declared["outputs"])


def handler_attributes(source: Path, cls: str) -> dict[str, list] | None:
    """{"inputs": [...], "outputs": [...]} declared as literals on class `cls` in `source` (module-level
    constants allowed, e.g. "shape": [-1, TOP]); {} when the class declares neither; None when they are
    not literals (or the file does not parse: the server reports that with file:line)."""
    import ast

    try:
        tree = ast.parse(source.read_text(encoding="utf-8"), str(source))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    constants: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                constants[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    found: dict[str, list] = {}
    for node in tree.body:
        if not (isinstance(node, ast.ClassDef) and node.name == cls):
            continue
        for stmt in node.body:
            target = stmt.targets[0] if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 else (
                stmt.target if isinstance(stmt, ast.AnnAssign) else None)
            if isinstance(target, ast.Name) and target.id in ("inputs", "outputs") and stmt.value is not None:
                try:
                    found[target.id] = ast.literal_eval(_inline(stmt.value, constants))
                except ValueError:
                    return None
    if not found:
        return {}
    return found if set(found) == {"inputs", "outputs"} else None


def _inline(node: Any, constants: dict[str, Any]) -> Any:
    """The expression with module-level literal constants put in place of their names."""
    import ast

    class Inline(ast.NodeTransformer):
        def visit_Name(self, name: ast.Name) -> ast.AST:
            if name.id in constants:
                return ast.copy_location(ast.parse(repr(constants[name.id]), mode="eval").body, name)
            return name

    return Inline().visit(node)
