"""`ngcx build` in a project folder: ngcx.yaml -> ngcx-app/NAME:latest FROM the base release's image.

Why a context folder of ngcx's own (state dir/projects/NAME/context) and not the project folder:
BuildKit keys its cache on content, so the context holds only what the Dockerfile copies, each file
written only when its content changed (the model hard-linked where the disk allows it). A code
edit then re-sends a few KB and re-runs two COPY steps; the model layer and the wheels stay cached.

Why the layer report: users cannot see why a rebuild is slow (BentoML, Truss). Each layer's inputs
(system packages, requirements or ngcx.lock, model sha256, code files, ngcx.yaml) are hashed and
kept in build.json next to the context; the next build names the first layer whose inputs changed.

Why pins hold: wheels install into the base's venv under /etc/ngcx/constraints.txt AND the base's
frozen set (pip list of the base, written in the same RUN), then pip check and a freeze diff. pip's
ResolutionImpossible is translated into one line naming the requirement and the pinned package.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ngcx.errors import UserError

if TYPE_CHECKING:
    from ngcx.build import BuildOptions, ProgressParser
    from ngcx.catalog.model import Catalog
    from ngcx.project.spec import Project

SKIP_PARTS = ("__pycache__", ".git", ".ipynb_checkpoints")
SKIP_SUFFIXES = (".pyc", ".pyo")
DOCKER_MARGIN = 256 << 20      # free space kept on the Docker data root beyond the model's two copies


@dataclass(frozen=True)
class BaseImage:
    """The catalog image a project builds FROM, identified by content."""

    ref: str                    # onnxruntime:25.08
    tag: str                    # ngcx/onnxruntime:25.08-runtime
    id: str                     # sha256:... image ID (changes when only its labels change)
    layers: tuple[str, ...]     # RootFS diff IDs: what the project's layers sit on

    @property
    def chain(self) -> str:
        """One digest of the base's layers: equal for two builds of the same content."""
        return "sha256:" + hashlib.sha256("\n".join(self.layers).encode()).hexdigest()


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


def ensure_base(project: Project, opts: BuildOptions, client: Any, catalog: Catalog | None) -> BaseImage:
    """The base release's local image, built first with the catalog build path when it is missing."""
    from dataclasses import replace

    from ngcx import build as catalog_build
    from ngcx import naming
    from ngcx.docker_util import image_or_none

    release = project.release
    tag = naming.local_tag(release.image, release.tag, project.spec.variant)
    img = image_or_none(client, tag)
    if img is None:
        print(f"base {tag} is not built here: building {release.ref} ({project.spec.variant}) first")
        catalog_build.build(release, replace(opts, tag=None, variant=project.spec.variant), catalog)
        img = client.images.get(tag)
    layers = tuple(img.attrs.get("RootFS", {}).get("Layers") or ())
    return BaseImage(release.ref, tag, img.id, layers)


# ----------------------------------------------------------------------------- inputs


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_tree(path: Path) -> str:
    """A file's sha256, or a folder's (SavedModel): relative names and contents, in order."""
    if path.is_file():
        return sha256_file(path)
    h = hashlib.sha256()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(f.relative_to(path).as_posix().encode() + b"\0" + sha256_file(f).encode() + b"\n")
    return h.hexdigest()


def tree_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def _stat_key(path: Path) -> list[int]:
    """What says "the model did not change" without reading it: size, mtime, inode (folder: its files)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    key = [len(files)]
    for f in files:
        st = f.stat()
        key += [st.st_size, st.st_mtime_ns, st.st_ino]
    return key


def model_sha(path: Path, previous: dict[str, Any]) -> str:
    """sha256 of the model, reused from the last build when its stat is unchanged (a multi-GB model
    is not re-read on every code edit)."""
    key = _stat_key(path)
    cached = previous.get("model_stat") or {}
    if cached.get("path") == str(path) and cached.get("key") == key and cached.get("sha256"):
        return cached["sha256"]
    return sha256_tree(path)


def _skipped(rel: Path) -> bool:
    return any(p in SKIP_PARTS for p in rel.parts) or rel.suffix in SKIP_SUFFIXES


def code_files(project: Project) -> dict[str, Path]:
    """Context path under app/ -> source: spec.files (files or folders) and the handler's module."""
    root = project.root
    sources: list[Path] = [(root / f).resolve() for f in project.spec.files]
    if project.spec.handler:
        top = project.spec.handler.split(":")[0].split(".")[0]
        sources.append(root / f"{top}.py" if (root / f"{top}.py").is_file() else root / top)
    out: dict[str, Path] = {}
    for src in sources:
        files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
        for f in files:
            rel = f.relative_to(root)
            if not _skipped(rel):
                out[rel.as_posix()] = f
    return dict(sorted(out.items()))


def requirements_text(project: Project) -> tuple[str, bool]:
    """(what the wheels layer installs, locked?): ngcx.lock when present and valid, else the list."""
    from ngcx import lock

    lock_file = project.root / lock.LOCK_FILE
    if not lock_file.is_file():
        return ("\n".join(project.requirements) + "\n" if project.requirements else "", False)
    return lock_file.read_text(encoding="utf-8"), True


def layer_inputs(project: Project, base: BaseImage, reqs: str, model: str | None, code: dict[str, str]) -> dict:
    """Each layer's inputs as hashes, in layer order: compared with the previous build's."""
    calib = project.spec.model.calibration if project.spec.model else None
    return {
        "base": {"layers": base.chain},
        "system packages": {"packages": list(project.spec.system_packages)},
        "wheels": {"requirements": hashlib.sha256(reqs.encode()).hexdigest()},
        "model": {"model": model, "calibration": sha256_file(project.root / calib) if calib else None},
        "code": code,
        "config": {"ngcx.yaml": sha256_file(project.file)},
    }


def changed_layer(old: dict | None, new: dict, locked: bool) -> tuple[str | None, str]:
    """(first layer whose inputs changed, why) — ("base", "first build") when there is no old build."""
    from ngcx.project.render import LAYERS

    if not old:
        return "base", "first build of this project"
    for layer in LAYERS:
        a, b = old.get(layer), new.get(layer)
        if a == b:
            continue
        if layer == "code":
            a, b = a or {}, b or {}
            names = sorted((set(a) ^ set(b)) | {k for k in b if k in a and a[k] != b[k]})
            shown = ", ".join(Path(n).name for n in names[:3]) + (" ..." if len(names) > 3 else "")
            return layer, f"{shown} changed" if names else "code changed"
        if layer == "model":
            which = [k for k in ("model", "calibration") if (a or {}).get(k) != (b or {}).get(k)]
            return layer, " and ".join("calibration data" if k == "calibration" else "the model" for k in which) \
                + " changed"
        why = {"base": "the base image changed", "system packages": "system_packages changed",
               "wheels": "ngcx.lock changed" if locked else "the requirements changed",
               "config": "ngcx.yaml changed"}[layer]
        return layer, why
    return None, "nothing changed since the last build"


def report_line(first: str | None, why: str, present: list[str]) -> str:
    """`rebuilding from layer 'code' (handler.py changed); wheels, model: cached`."""
    if first is None:
        return f"all layers cached ({why})"
    if first == "base":
        return f"building every layer ({why})"
    cached = [layer for layer in present[:present.index(first)] if layer != "base"] if first in present else []
    return f"rebuilding from layer '{first}' ({why})" + (f"; {', '.join(cached)}: cached" if cached else "")


def present_layers(project: Project, has_requirements: bool, has_code: bool) -> list[str]:
    out = ["base"]
    if project.spec.system_packages:
        out.append("system packages")
    if has_requirements:
        out.append("wheels")
    if project.model is not None:
        out.append("model")
    if has_code:
        out.append("code")
    return [*out, "config"]


# ----------------------------------------------------------------------------- disk


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
    from ngcx.output import human_size

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


def _can_link(src: Path, folder: Path) -> bool:
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return src.stat().st_dev == probe.stat().st_dev
    except OSError:
        return False


# ----------------------------------------------------------------------------- context


def sync_context(ctx: Path, wanted: dict[str, Path | bytes], link: set[str]) -> None:
    """Make ctx hold exactly `wanted` (relative path -> source file or bytes), rewriting only what
    changed so unchanged files keep their inode and mtime (BuildKit re-sends nothing for them)."""
    ctx.mkdir(parents=True, exist_ok=True)
    for rel, src in wanted.items():
        target = ctx / rel
        if _same(target, src):
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.ngcx-tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        if isinstance(src, bytes):
            tmp.write_bytes(src)
        elif rel in link:
            try:
                os.link(src, tmp)
            except OSError:
                shutil.copy2(src, tmp)
        else:
            shutil.copy2(src, tmp)
        os.replace(tmp, target)
    keep = {ctx / rel for rel in wanted}
    for path in sorted(ctx.rglob("*"), reverse=True):
        if path.is_file() or path.is_symlink():
            if path not in keep:
                path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()


def _same(target: Path, src: Path | bytes) -> bool:
    import filecmp

    if not target.is_file():
        return False
    if isinstance(src, bytes):
        return target.stat().st_size == len(src) and target.read_bytes() == src
    with contextlib.suppress(OSError):
        if os.path.samefile(target, src):
            return True
    return target.stat().st_size == src.stat().st_size and filecmp.cmp(target, src, shallow=False)


def context_files(project: Project, reqs: str, code: dict[str, Path], dockerfile: str) -> dict[str, Path | bytes]:
    """What the Dockerfile copies, by context path."""
    wanted: dict[str, Path | bytes] = {"Dockerfile": dockerfile.encode(), "ngcx.yaml": project.file}
    if reqs:
        wanted["requirements.txt"] = reqs.encode()
    if project.model is not None:
        model = project.model
        if model.is_file():
            wanted[f"model/{model.name}"] = model
        else:
            for f in sorted(p for p in model.rglob("*") if p.is_file()):
                wanted[f"model/{model.name}/{f.relative_to(model).as_posix()}"] = f
    calib = project.spec.model.calibration if project.spec.model else None
    if calib:
        wanted[f"calibration/{Path(calib).as_posix()}"] = project.root / calib
    for rel, src in code.items():
        wanted[f"app/{rel}"] = src
    return wanted


def project_dir(name: str) -> Path:
    from ngcx import paths

    return paths.state_dir() / "projects" / name


def _load_previous(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / "build.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save(folder: Path, data: dict[str, Any]) -> None:
    tmp = folder / "build.json.tmp"
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, folder / "build.json")


# ----------------------------------------------------------------------------- pip failures

CANNOT_INSTALL = re.compile(r"ERROR: Cannot install (?P<reqs>.+?) because these package versions")
DEPENDS = re.compile(r"^\s*(?P<pkg>\S+) (?P<ver>\S+) depends on (?P<dep>.+?)\s*$")
USER_REQ = re.compile(r"^\s*The user requested (?P<req>[^(].*?)\s*$")
CONSTRAINT = re.compile(r"^\s*The user requested \(constraint\) (?P<pin>.+?)\s*$")
NOT_FOUND = re.compile(r"ERROR: No matching distribution found for (?P<req>.+?)\s*$")
FROM_FILE = re.compile(r"-r \S+ \(line (\d+)\)")
REPLACED = re.compile(r"ngcx-replaced: (?P<what>.+)$")


def pip_problem(lines: list[str], base_ref: str, requirements: str = "") -> UserError | None:
    """pip's output (a failed wheels step or `ngcx lock`) -> one line naming the requirement and
    the pin it would break; None when it is not a resolution problem. `requirements` is the file pip
    read with -r, so "-r FILE (line 3)" is shown as the requirement written there."""
    reqs = requirements.splitlines()

    def named(match: re.Match) -> str:
        n = int(match.group(1))
        return reqs[n - 1].strip() if 0 < n <= len(reqs) else match.group(0)

    lines = [FROM_FILE.sub(named, line) for line in lines]
    text = "\n".join(lines)
    pins = [m.group("pin") for line in lines if (m := CONSTRAINT.match(line))]
    hint = (f"drop it, pick a version of it that works with what {base_ref} ships, or choose another base "
            "release (`ngcx catalog ls`)")
    if pins:
        wanted = CANNOT_INSTALL.search(text)
        requirement = wanted.group("reqs") if wanted else "?"
        dep = next((m for line in lines if (m := DEPENDS.match(line))), None)
        direct = next((m.group("req") for line in lines if (m := USER_REQ.match(line))), None)
        pin = _matching_pin(pins, dep.group("dep") if dep else direct or "")
        if dep is not None:
            via = f"{dep.group('pkg')} {dep.group('ver')}"
            through = "" if requirement.split("==")[0].lower() == dep.group("pkg").lower() else f" (through {via})"
            return UserError(f"requirement {requirement!r}{through} needs {dep.group('dep')}, but the base "
                             f"{base_ref} pins {pin}; it would replace a pinned package", hint=hint)
        return UserError(f"requirement {direct or requirement!r} would replace {pin}, pinned by the base {base_ref}",
                         hint=hint)
    missing = next((m.group("req") for line in lines if (m := NOT_FOUND.search(line))), None)
    if missing:
        return UserError(f"requirement {missing!r}: no matching distribution on the package index",
                         hint="check its name and version (and --pip-index-url)")
    replaced = next((m.group("what") for line in lines if (m := REPLACED.search(line))), None)
    if replaced:
        return UserError(f"the requirements replaced packages of the base {base_ref}: {replaced}",
                         hint="pin the requirement that pulled them to a version that works with the base")
    return None


def _matching_pin(pins: list[str], dep: str) -> str:
    """The constraint about the same package as dep (e.g. protobuf==7.36.2 for protobuf==3.20.2)."""
    from ngcx.project.spec import canonical

    name = canonical(re.split(r"[<>=!~ \[;]", dep.strip(), maxsplit=1)[0]) if dep else ""
    return next((p for p in pins if canonical(re.split(r"[<>=!~ ]", p, maxsplit=1)[0]) == name), pins[-1])


# ----------------------------------------------------------------------------- build


def build_project(project: Project, opts: BuildOptions, catalog: Catalog | None = None) -> ProjectBuildResult:
    """Base first (if missing), then context, Dockerfile, BuildKit build, checks, state."""
    from ngcx import build as cb
    from ngcx import state
    from ngcx.docker_util import docker_cli, engine_client
    from ngcx.project import render

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
    previous = _load_previous(folder)

    reqs, locked = requirements_text(project)
    if locked:
        from ngcx import lock

        lock.check_lock(project, base)
    code = code_files(project)
    msha = model_sha(project.model, previous) if project.model is not None else None
    inputs = layer_inputs(project, base, reqs, msha, {k: sha256_file(v) for k, v in code.items()})
    first, why = changed_layer(previous.get("layers"), inputs, locked)
    ctx = folder / "context"
    if project.model is not None and (first in ("base", "model") or not (ctx / "model").exists()):
        root = _docker_root(client)
        link = _can_link(project.model, ctx) and project.model.is_file()
        check_model_space(project.model, tree_bytes(project.model), _free(ctx), _free(Path(root)) if root else None,
                          not link, ctx, root)

    lock_sha = hashlib.sha256(reqs.encode()).hexdigest()
    plan = render.make_plan(project, base_tag=base.tag, base_id=base.id, has_requirements=bool(reqs),
                            locked=locked, code_files=list(code), lock_sha=lock_sha, model_sha=msha)
    dockerfile = render.render(plan)
    present = present_layers(project, bool(reqs), bool(code))
    line = report_line(first, why, present)
    print(f"building {project.image_tag} FROM {base.tag} ({base.id[:19]})"
          + (", wheels from ngcx.lock" if locked else ""))
    print(line)
    try:
        sync_context(ctx, context_files(project, reqs, code, dockerfile),
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
    model_stat = {"path": str(project.model), "key": _stat_key(project.model), "sha256": msha} if msha else None
    _save(folder, {"layers": inputs, "image_id": img.id, "model_stat": model_stat, "base_id": base.id})
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
    from ngcx import build as cb

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
        return cb._run_build(cmd, env, opts.progress, cb.step_titles(dockerfile))


def _fail(parser: ProgressParser, dockerfile: str, base_ref: str, requirements: str) -> None:
    """A failed wheels step that is a pin conflict -> one line, exit 2; anything else -> the step's log."""
    from ngcx import build as cb
    from ngcx.project.render import step_layers

    step = parser.failed()
    if step is not None:
        m = re.match(r"^\[(?:[\w.-]+ )?(\d+)/\d+\] ", step.name)
        if m and step_layers(dockerfile).get(int(m.group(1))) == "wheels":
            problem = pip_problem(list(step.log), base_ref, requirements)
            if problem is not None:
                raise problem
    cb._report_failure(parser)


def _first_rebuilt(parser: ProgressParser, dockerfile: str) -> str | None:
    """The first layer with a step BuildKit ran (not CACHED); FROM itself is never cached."""
    from ngcx.project.render import step_layers

    layers = step_layers(dockerfile)
    for step in parser.build_steps():
        m = re.match(r"^\[(?:[\w.-]+ )?(\d+)/\d+\] (\w+)", step.name)
        if m and m.group(2).upper() != "FROM" and step.status == "done":
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
