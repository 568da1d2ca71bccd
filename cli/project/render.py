"""A project's Dockerfile: ngcx.yaml + the resolved base -> recipes/project.Dockerfile.j2.

Why apart from build.py: rendering is pure (no Docker, no disk beyond the templates), so the layer
order, the default command and the labels are tested as text (tests/project/test_project_render.py),
like the catalog's golden renders. The layer order is the cache order (app-projects.md §9.2):
base -> system packages -> wheels -> model -> code -> config, each under a "# ---- NAME:" heading
that build.py uses to say which layer a change invalidated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .spec import Project

APP_DIR = "/opt/ngcx/app"
MODEL_DIR = "/opt/ngcx/model"
CACHE_DIR = "/var/cache/ngcx/plans"
LAYERS = ("base", "system packages", "wheels", "model", "code", "config")
HEADING = re.compile(r"^# ---- (?P<layer>base|system packages|wheels|model|code|config)[:( ]")

LABEL_NAME = "ai.ngcx.project.name"
LABEL_BASE = "ai.ngcx.project.base"
LABEL_BASE_ID = "ai.ngcx.project.base-id"
LABEL_LOCK = "ai.ngcx.project.lock-sha256"
LABEL_MODEL = "ai.ngcx.project.model-sha256"


@dataclass(frozen=True)
class Plan:
    """Everything the template needs, already decided (names, paths, quoted values)."""

    name: str
    base_ref: str                       # catalog release, e.g. onnxruntime:25.08
    base_tag: str                       # its local tag, ngcx/onnxruntime:25.08-runtime
    base_id: str                        # the image ID it was built FROM (recorded, verified after)
    system_packages: tuple[str, ...]
    has_requirements: bool
    locked: bool
    model_file: str | None              # file (or folder) name under model/ in the context
    calibration: str | None             # path relative to the project, copied to APP_DIR
    has_code: bool
    code_summary: str
    env: tuple[tuple[str, str], ...]    # (key, quoted value)
    labels: tuple[tuple[str, str], ...]
    ports: tuple[int, ...]
    command: tuple[str, ...]
    model_signature: bool = False       # MODEL.sig + MODEL.pub beside the model (modelsign.annotate sets it)
    app_dir: str = APP_DIR
    model_dir: str = MODEL_DIR
    cache_dir: str = CACHE_DIR


def quote(value: str, what: str) -> str:
    """A Dockerfile ENV/LABEL value in double quotes: \\ " and $ escaped (ENV expands $VAR otherwise).
    A newline cannot be written there at all, so it is one line for the user, not a broken Dockerfile."""
    from ..core.errors import UserError

    if any(c in value for c in "\r\n\0"):
        raise UserError(f"{what} holds a line break, which a Dockerfile cannot carry",
                        hint="put it on one line in ngcx.yaml")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def default_command(project: Project) -> tuple[str, ...]:
    """The serve command, rendered from the spec as explicit flags (the runtime never reads ngcx.yaml)."""
    spec = project.spec
    cmd = ["ngcx-runtime", "serve"]
    if project.model is not None:
        cmd.append(f"{MODEL_DIR}/{project.model.name}")
    cmd += ["--host", "0.0.0.0", "--port", str(spec.ports[0]), "--name", project.model_name]
    if spec.handler:
        cmd += ["--handler", spec.handler]
    if spec.model is not None:
        cmd += ["--precision", spec.model.precision, "--batch-profile", ",".join(str(b) for b in spec.model.batch)]
        if spec.model.calibration:
            cmd += ["--calibration-data", f"{APP_DIR}/{PurePosixPath(spec.model.calibration)}"]
        cmd += ["--max-queue-delay-ms", f"{spec.model.max_queue_delay_ms:g}"]
    return tuple(cmd)


def labels(project: Project, base_tag: str, base_id: str, lock_sha: str, model_sha: str | None) -> dict[str, str]:
    """ai.ngcx.project.* (the base's ai.ngcx.pin.* labels are inherited from the FROM image)."""
    out = {
        "org.opencontainers.image.title": project.image_tag.rsplit(":", 1)[0],
        "org.opencontainers.image.version": "latest",
        "org.opencontainers.image.base.name": base_tag,
        "org.opencontainers.image.base.digest": base_id,
        LABEL_NAME: project.name,
        LABEL_BASE: project.release.ref,
        LABEL_BASE_ID: base_id,
        LABEL_LOCK: lock_sha,
    }
    if model_sha:
        out[LABEL_MODEL] = model_sha
    return out


def environment(project: Project) -> dict[str, str]:
    """ngcx's own variables first, then the user's env (which may override PYTHONPATH on purpose)."""
    return {"NGCX_PROJECT": project.name, "NGCX_RUNTIME_CACHE": CACHE_DIR, "PYTHONPATH": APP_DIR,
            **project.spec.env}


def make_plan(project: Project, *, base_tag: str, base_id: str, has_requirements: bool, locked: bool,
              code_files: list[str], lock_sha: str, model_sha: str | None) -> Plan:
    """Decide every value the template writes."""
    spec = project.spec
    command = tuple(spec.command) if spec.command else default_command(project)
    return Plan(
        name=project.name, base_ref=project.release.ref, base_tag=base_tag, base_id=base_id,
        system_packages=tuple(spec.system_packages), has_requirements=has_requirements, locked=locked,
        model_file=project.model.name if project.model is not None else None,
        calibration=spec.model.calibration if spec.model else None,
        has_code=bool(code_files), code_summary=_summary(code_files),
        env=tuple((k, quote(v, f"env {k}")) for k, v in environment(project).items()),
        labels=tuple((k, quote(v, f"label {k}")) for k, v in
                     labels(project, base_tag, base_id, lock_sha, model_sha).items()),
        ports=tuple(spec.ports), command=command,
    )


def _summary(files: list[str]) -> str:
    shown = ", ".join(files[:4])
    return shown + (f" and {len(files) - 4} more" if len(files) > 4 else "")


def render(plan: Plan) -> str:
    """The Dockerfile text (recipes/project.Dockerfile.j2, the catalog recipes' Jinja2 environment)."""
    from ..render import dockerfile as catalog_render

    text = catalog_render._environment().get_template("project.Dockerfile.j2").render(plan=plan)
    return catalog_render._tidy(text)


def step_layers(dockerfile_text: str) -> dict[int, str]:
    """BuildKit step number ([n/m]) -> the layer it belongs to, from the "# ---- NAME:" headings;
    steps counted as build.dockerfile_steps counts them for the progress titles."""
    from ..build.image import dockerfile_steps

    layers: dict[int, str] = {}
    layer = "base"
    for n, heading, _word, _line in dockerfile_steps(dockerfile_text):
        m = HEADING.match(heading)
        if m:
            layer = m.group("layer")
        layers[n] = layer
    return layers
