"""`ngcx build` in a project folder: ngcx.yaml -> ngcx-app/NAME:latest FROM the base release's image.

The build context and the layer report live in context.py, pip's refusals in pip_errors.py; this
module orders the steps: base, context, BuildKit, verification, state.

Why pins hold: wheels install into the base's venv under /etc/ngcx/constraints.txt AND the base's
frozen set (the base's name==version list, written in the same RUN), then pip check and a freeze diff. pip's
ResolutionImpossible is translated into one line naming the requirement and the pinned package.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import UserError
from .base import BaseImage, ensure_base
from .context import (
    can_link,
    changed_layer,
    code_files,
    context_files,
    layer_inputs,
    load_previous,
    model_sha,
    present_layers,
    project_dir,
    report_line,
    requirements_text,
    save_previous,
    sha256_file,
    stat_key,
    sync_context,
    tree_bytes,
)
from .pip_errors import pip_problem

if TYPE_CHECKING:
    from ..build.image import BuildOptions
    from ..catalog.model import Catalog
    from ..core.progress import ProgressParser
    from .spec import Project

DOCKER_MARGIN = 256 << 20      # free space kept on the Docker data root beyond the model's two copies


@dataclass(frozen=True)
class ProjectBuildResult:
    tag: str
    image_id: str
    size_bytes: int
    duration_s: float
    steps: int
    cached_steps: int
    base: BaseImage
    context: Path
    rebuilt_from: str | None     # first layer BuildKit re-ran (None: everything cached)
    report: str                  # the "rebuilding from layer ..." line


# ----------------------------------------------------------------------------- base


# ----------------------------------------------------------------------------- inputs


def _free(folder: Path) -> int | None:
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free
    except OSError:
        return None


def check_model_space(model: Path, size: int, context_free: int | None, docker_free: int | None,
                      needs_copy: bool, context_dir: Path, docker_root: str | None) -> None:
    """A model larger than the disk is one line before anything is copied: the Docker data root holds
    it twice (BuildKit's copy of the context, then the layer); the context holds it unless hard-linked."""
    from ..core.output import human_size

    if needs_copy and context_free is not None and context_free < size:
        raise UserError(f"model {model.name} ({human_size(size)}) does not fit in the build context "
                        f"{context_dir} ({human_size(context_free)} free)",
                        hint="free space there, or set NGCX_STATE_DIR to a folder on the model's disk")
    if docker_free is not None and docker_free < 2 * size + DOCKER_MARGIN:
        raise UserError(f"model {model.name} ({human_size(size)}) does not fit on the Docker data root "
                        f"{docker_root} ({human_size(docker_free)} free; a build needs about "
                        f"{human_size(2 * size + DOCKER_MARGIN)})",
                        hint="free space there (docker system df), or use a smaller model")


def _docker_root(client: Any) -> str | None:
    try:
        return client.info().get("DockerRootDir")
    except Exception:  # noqa: BLE001 - a remote or restricted engine: no local data root to check
        return None


def build_project(project: Project, opts: BuildOptions, catalog: Catalog | None = None) -> ProjectBuildResult:
    """Base first (if missing), then context, Dockerfile, BuildKit build, checks, state."""
    from ..build import image as cb
    from ..core.engine import docker_cli, engine_client
    from ..state import db as state
    from . import modelsign, render

    cb._check_url(opts.pip_index_url, "--pip-index-url")
    for url in opts.pip_extra_index_urls:
        cb._check_url(url, "--pip-extra-index-url")
    cb._check_url(opts.apt_mirror, "--apt-mirror")
    ca = cb.detect_ca(opts.ca_cert)
    state.check()
    client = engine_client()
    cli = docker_cli()
    if cli is None:
        raise UserError("the docker CLI is not installed (BuildKit builds need it)",
                        hint="apt-get install docker.io, or run scripts/setup.sh")
    started = time.monotonic()
    base = ensure_base(project, opts, client, catalog)
    folder = project_dir(project.name)
    previous = load_previous(folder)

    reqs, locked = requirements_text(project)
    if locked:
        from . import lock

        lock.check_lock(project, base)
    code = code_files(project)
    msha = model_sha(project.model, previous) if project.model is not None else None
    signed = modelsign.sign_model(project, folder, msha)
    inputs = layer_inputs(project, base, reqs, msha, {k: sha256_file(v) for k, v in code.items()})
    first, why = changed_layer(previous.get("layers"), inputs, locked)
    ctx = folder / "context"
    if project.model is not None and (first in ("base", "model") or not (ctx / "model").exists()):
        root = _docker_root(client)
        link = can_link(project.model, ctx) and project.model.is_file()
        check_model_space(project.model, tree_bytes(project.model), _free(ctx), _free(Path(root)) if root else None,
                          not link, ctx, root)

    lock_sha = hashlib.sha256(reqs.encode()).hexdigest()
    plan = render.make_plan(project, base_tag=base.tag, base_id=base.id, has_requirements=bool(reqs),
                            locked=locked, code_files=list(code), lock_sha=lock_sha, model_sha=msha)
    plan = modelsign.annotate(plan, signed)
    dockerfile = render.render(plan)
    present = present_layers(project, bool(reqs), bool(code))
    line = report_line(first, why, present)
    print(f"building {project.image_tag} FROM {base.tag} ({base.id[:19]})"
          + (", wheels from ngcx.lock" if locked else ""))
    print(line)
    try:
        sync_context(ctx, {**context_files(project, reqs, code, dockerfile), **modelsign.context_files(signed)},
                     link={f"model/{project.model.name}"} if project.model is not None else set())
        parser = _docker_build(cli, project, base, ctx, opts, ca, dockerfile)
    except BaseException:
        _discard(folder)
        raise
    duration = time.monotonic() - started
    if parser.returncode != 0:
        _discard(folder)
        _fail(parser, dockerfile, project.release.ref, reqs)

    img = client.images.get(project.image_tag)
    _verify_on_base(client, img, base, project.image_tag)
    steps = parser.build_steps()
    actual = _first_rebuilt(parser, dockerfile)
    if actual in present and (first is None or (first in present and present.index(actual) < present.index(first))):
        print(f"note: BuildKit rebuilt from layer '{actual}' (its cache no longer held that layer)")
    size = int(img.attrs.get("Size") or 0)
    try:
        state.record_build(image=project.name, release="project", variant=project.spec.variant,
                           tag=project.image_tag, image_id=img.id, size_bytes=size, duration_s=round(duration, 2),
                           base=f"{base.tag}@{base.id}", dockerfile_sha=hashlib.sha256(dockerfile.encode()).hexdigest())
    except UserError as exc:
        raise UserError(f"built {project.image_tag}, but it is not in `ngcx images`: {exc.message}",
                        hint=exc.hint) from None
    old_id = previous.get("image_id")
    model_stat = {"path": str(project.model), "key": stat_key(project.model), "sha256": msha} if msha else None
    save_previous(folder, {"layers": inputs, "image_id": img.id, "model_stat": model_stat, "base_id": base.id})
    _remove_untagged(client, old_id, img.id)
    cached = sum(1 for s in steps if s.status == "cached")
    return ProjectBuildResult(project.image_tag, img.id, size, duration, len(steps), cached, base, ctx, actual, line)


def _discard(folder: Path) -> None:
    """After a failed or interrupted build: no stale context; the project's folder goes too unless an
    earlier build's record (build.json) is in it."""
    shutil.rmtree(folder / "context", ignore_errors=True)
    if not (folder / "build.json").exists():
        shutil.rmtree(folder, ignore_errors=True)


def _docker_build(cli: str, project: Project, base: BaseImage, ctx: Path, opts: BuildOptions, ca: Path | None,
                  dockerfile: str) -> ProgressParser:
    """docker build with the catalog build's secrets and progress display."""
    from ..build import image as cb
    from ..core.progress import run_build

    with tempfile.TemporaryDirectory(prefix="ngcx-secrets-") as secret_dir:
        os.chmod(secret_dir, 0o700)
        cmd = [cli, "build", "--progress=plain", "-t", project.image_tag, "--build-arg", f"BASE_IMAGE={base.tag}"]
        if opts.apt_mirror:
            cmd += ["--build-arg", f"APT_MIRROR={opts.apt_mirror.rstrip('/')}"]
        if ca:
            cmd += ["--secret", f"id=ca,src={ca}"]
        conf = cb.pip_conf_text(opts)
        if conf:
            conf_file = cb._write_secret(Path(secret_dir) / "pip.conf", conf)
            cmd += ["--secret", f"id=pip_conf,src={conf_file}"]
        if opts.no_cache:
            cmd.append("--no-cache")
        cmd.append(str(ctx))
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}
        return run_build(cmd, env, opts.progress, cb.step_titles(dockerfile))


def _fail(parser: ProgressParser, dockerfile: str, base_ref: str, requirements: str) -> None:
    """A failed wheels step that is a pin conflict -> one line, exit 2; anything else -> the step's log."""
    from ..build import image as cb
    from ..core.progress import DOCKERFILE_STEP
    from .render import step_layers

    step = parser.failed()
    if step is not None:
        m = DOCKERFILE_STEP.match(step.name)
        if m and step_layers(dockerfile).get(int(m.group(1))) == "wheels":
            problem = pip_problem(list(step.log), base_ref, requirements)
            if problem is not None:
                raise problem
    cb._report_failure(parser)


def _first_rebuilt(parser: ProgressParser, dockerfile: str) -> str | None:
    """The first layer with a step BuildKit ran (not CACHED); FROM itself is never cached."""
    from ..core.progress import DOCKERFILE_STEP
    from .render import step_layers

    layers = step_layers(dockerfile)
    for step in parser.build_steps():
        m = DOCKERFILE_STEP.match(step.name)
        if m and not step.name[m.end():].upper().startswith("FROM") and step.status == "done":
            return layers.get(int(m.group(1)))
    return None


def _verify_on_base(client: Any, img: Any, base: BaseImage, tag: str) -> None:
    """The image must sit on exactly the recorded base layers (the tag could move during a build)."""
    layers = tuple(img.attrs.get("RootFS", {}).get("Layers") or ())
    if layers[:len(base.layers)] != base.layers:
        with contextlib.suppress(Exception):
            client.images.remove(tag)
        raise UserError(f"{base.tag} changed while {tag} was building (it is no longer {base.id[:19]})",
                        hint="run `ngcx build` again")


def _remove_untagged(client: Any, old_id: str | None, new_id: str) -> None:
    """The previous project image, now untagged, is removed unless something still uses it."""
    if not old_id or old_id == new_id:
        return
    with contextlib.suppress(Exception):
        if not client.images.get(old_id).tags:
            client.images.remove(old_id)
