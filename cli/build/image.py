"""Behind `ngcx build`: render a release into a build context and build it with BuildKit.

Why the docker CLI for this one step: BuildKit secrets (the CA bundle, a pip.conf with index
credentials) travel over a BuildKit session that the docker SDK cannot open; the Debian
docker.io CLI (20.10) drives BuildKit itself with DOCKER_BUILDKIT=1. Everything around the
build (engine checks, base image checks, inspecting the result) uses the docker SDK.

Secrets never touch the build context: they are written to a private temp dir (0700), passed
with --secret, mounted as tmpfs for the RUN steps that need them, and deleted afterwards.
"""

from __future__ import annotations

import errno
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..core.errors import UserError
from ..core.output import redact

if TYPE_CHECKING:
    from ..catalog.model import Release
    from ..core.progress import ProgressParser

CA_ENV_VARS = ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE")


class BuildFailed(UserError):
    """The engine ran the build and a step failed (exit 1; the step's log was already shown)."""

    exit_code = 1


@dataclass
class BuildOptions:
    """What the user asked for, validated."""

    variant: str = "runtime"
    tag: str | None = None
    base: str | None = None
    ca_cert: Path | None = None
    pip_index_url: str | None = None
    pip_extra_index_urls: list[str] = field(default_factory=list)
    apt_mirror: str | None = None
    no_cache: bool = False
    progress: str = "auto"


@dataclass(frozen=True)
class BuildResult:
    tag: str
    image_id: str
    size_bytes: int
    duration_s: float
    steps: int
    cached_steps: int
    base: str
    context: Path


# ----------------------------------------------------------------------------- inputs


def detect_ca(explicit: Path | None) -> Path | None:
    """--ca-cert FILE, else the first of PIP_CERT / REQUESTS_CA_BUNDLE / SSL_CERT_FILE that is set."""
    if explicit is not None:
        return _checked_ca(explicit, "--ca-cert")
    for var in CA_ENV_VARS:
        value = os.environ.get(var)
        if value:
            return _checked_ca(Path(value), f"${var}")
    return None


def _checked_ca(path: Path, origin: str) -> Path:
    if not path.is_file():
        raise UserError(f"CA bundle {path} (from {origin}) does not exist",
                        hint="pass --ca-cert with an existing PEM file, or unset the variable")
    try:
        head = path.read_bytes()[:1 << 20]
    except OSError as exc:
        raise UserError(f"CA bundle {path} (from {origin}) cannot be read: {exc.strerror}") from None
    if b"-----BEGIN CERTIFICATE-----" not in head:
        raise UserError(f"CA bundle {path} (from {origin}) is not a PEM certificate bundle",
                        hint="it must contain -----BEGIN CERTIFICATE----- blocks")
    return path


def _check_url(value: str | None, flag: str) -> None:
    if value and not re.match(r"^https?://[^\s]+$", value):
        raise UserError(f"{flag} {redact(value)!r} is not an http(s) URL")


def pip_conf_text(opts: BuildOptions) -> str | None:
    """The pip.conf secret: index URLs (which may carry credentials) — None when not needed."""
    lines = []
    if opts.pip_index_url:
        lines.append(f"index-url = {opts.pip_index_url}")
    if opts.pip_extra_index_urls:
        lines.append("extra-index-url = " + " ".join(opts.pip_extra_index_urls))
    return "[global]\n" + "\n".join(lines) + "\n" if lines else None


# ----------------------------------------------------------------------------- engine checks


def ensure_base(client, base: str, release: Release) -> None:
    """The base must be local (or pullable): say how to get it instead of an opaque BuildKit error."""
    from ..core.engine import image_or_none

    if image_or_none(client, base) is not None:
        return
    try:
        client.images.pull(base)
        return
    except Exception as exc:  # docker.errors.APIError / ImageNotFound / requests errors
        reason = str(exc).splitlines()[0][:120]
    offline = release.base.offline
    hint = (f"on an offline machine run `ngcx base bootstrap --suite {release.base.suite}` and build "
            f"with --base offline ({offline})" if offline and base != offline
            else f"run `ngcx base bootstrap --suite {release.base.suite or 'bookworm'}` first")
    raise UserError(f"base image {base} is not available locally and could not be pulled ({reason})",
                    hint=hint)


# ----------------------------------------------------------------------------- step titles


STEP_INSTRUCTIONS = ("FROM", "RUN", "COPY", "ADD", "WORKDIR")


def dockerfile_steps(dockerfile_text: str) -> list[tuple[int, str, str, str]]:
    """(BuildKit step number, the last "# ----" heading line before it, instruction, line) for every
    instruction that becomes a step (FROM/RUN/COPY/ADD/WORKDIR); continuation lines are skipped.
    The catalog's progress titles and the project's layer report both count steps this way."""
    steps: list[tuple[int, str, str, str]] = []
    heading, continued = "", False
    for line in dockerfile_text.splitlines():
        stripped = line.strip()
        if continued:
            continued = stripped.endswith("\\")
            continue
        if stripped.startswith("# ----"):
            heading = stripped
            continue
        word = stripped.split(" ", 1)[0].upper()
        continued = stripped.endswith("\\")
        if word in STEP_INSTRUCTIONS:
            steps.append((len(steps) + 1, heading, word, stripped))
    return steps


def step_titles(dockerfile_text: str) -> dict[int, str]:
    """Step number -> a readable title: the recipe block's "# ---- title ----" heading plus the
    instruction, so progress says "[3/8] CUDA 12.4 libraries as pinned wheels (RUN)" instead of
    a wall of --mount options."""
    titles: dict[int, str] = {}
    for n, heading, word, line in dockerfile_steps(dockerfile_text):
        title = heading.lstrip("#").strip().strip("-").strip()
        titles[n] = f"{title} ({word})" if title else line[:80]
    return titles


# ----------------------------------------------------------------------------- build


def build(release: Release, opts: BuildOptions, catalog=None) -> BuildResult:
    """Render, build, inspect and record one image."""
    from ..core import naming, paths
    from ..core.engine import docker_cli, engine_client
    from ..core.progress import run_build
    from ..render import dockerfile as render
    from ..state import db as state

    image_spec = catalog.image(release.image) if catalog else None
    if image_spec is not None and not image_spec.buildable and not (opts.pip_index_url or opts.pip_extra_index_urls):
        raise UserError(f"{release.ref} cannot be built here: {image_spec.not_buildable_reason}",
                        hint="`ngcx render` still works; on a machine that reaches that index, build with "
                             "--pip-extra-index-url URL (or a mirror of it)")
    _check_url(opts.pip_index_url, "--pip-index-url")
    for url in opts.pip_extra_index_urls:
        _check_url(url, "--pip-extra-index-url")
    _check_url(opts.apt_mirror, "--apt-mirror")
    from ..catalog.lockdata import release_lock

    release_lock(release, catalog.source if catalog else None)  # no wheel hashes: one line now, not after a render
    ca = detect_ca(opts.ca_cert)
    tag = opts.tag or naming.local_tag(release.image, release.tag, opts.variant)
    base = render.resolve_base(release, opts.base)
    state.check()  # a locked, corrupt-beyond-repair, full or unwritable store fails now, not after the build

    client = engine_client()
    cli = docker_cli()
    if cli is None:
        raise UserError("the docker CLI is not installed (BuildKit builds need it)",
                        hint="apt-get install docker.io, or run scripts/setup.sh")
    ensure_base(client, base, release)
    from_ref, base_image = pin_base(client, base)

    context_dir = paths.state_dir() / "contexts" / f"{release.image}-{release.tag}-{opts.variant}"
    ctx = write_context(release, context_dir, opts, catalog)

    with tempfile.TemporaryDirectory(prefix="ngcx-secrets-") as secret_dir:
        os.chmod(secret_dir, 0o700)
        cmd = [cli, "build", "--progress=plain", "-t", tag,
               "--build-arg", f"BASE_IMAGE={from_ref}",
               "--label", f"org.opencontainers.image.base.digest={base_image.id}",
               "--build-arg", f"NGCX_CREATED={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}",
               "--build-arg", f"NGCX_REVISION={_revision()}"]
        if opts.apt_mirror:
            cmd += ["--build-arg", f"APT_MIRROR={opts.apt_mirror.rstrip('/')}"]
        if ca:
            cmd += ["--secret", f"id=ca,src={ca}"]
        conf = pip_conf_text(opts)
        if conf:
            conf_file = _write_secret(Path(secret_dir) / "pip.conf", conf)
            cmd += ["--secret", f"id=pip_conf,src={conf_file}"]
        if opts.no_cache:
            cmd.append("--no-cache")
        cmd.append(str(ctx.path))
        env = {**os.environ, "DOCKER_BUILDKIT": "1"}
        started = time.monotonic()
        print(f"building {tag} from {from_ref} ({release.ref}, {opts.variant}); context {ctx.path}")
        parser = run_build(cmd, env, opts.progress, step_titles(ctx.dockerfile.read_text()))
        duration = time.monotonic() - started

    if parser.returncode != 0:
        _report_failure(parser)
    img = client.images.get(tag)
    check_on_base(img, base_image, base)
    size = int(img.attrs.get("Size") or 0)
    steps = parser.build_steps()
    cached = sum(1 for s in steps if s.status == "cached")
    try:
        state.record_build(image=release.image, release=release.tag, variant=opts.variant, tag=tag,
                           image_id=img.id, digest=None, size_bytes=size, duration_s=round(duration, 2),
                           base=base, dockerfile_sha=ctx.digest)
    except UserError as exc:
        raise UserError(f"built {tag}, but it is not in `ngcx images`: {exc.message}", hint=exc.hint) from None
    return BuildResult(tag, img.id, size, duration, len(steps), cached, base, ctx.path)


def write_context(release: Release, context_dir: Path, opts: BuildOptions, catalog=None):
    """render.write_context, but a full or read-only disk is one line naming the folder and the space
    needed, checked BEFORE writing, and no half-written context is left behind on a failure."""
    import shutil

    from ..render import dockerfile as render

    needed = _context_bytes(release)
    free = _free_bytes(context_dir) + _tree_bytes(context_dir)  # an earlier context here is replaced
    if free < needed:
        raise _no_space(context_dir, needed, free)
    ours = not context_dir.exists() or (context_dir / "ngcx-runtime").is_dir()
    try:
        return render.write_context(release, context_dir, opts.variant, opts.base, catalog)
    except (OSError, UserError) as exc:
        if ours:
            shutil.rmtree(context_dir, ignore_errors=True)
        reason = exc.message if isinstance(exc, UserError) else f"{context_dir}: {exc.strerror}"
        if getattr(exc, "errno", None) == errno.ENOSPC or os.strerror(errno.ENOSPC) in reason:
            raise _no_space(context_dir, needed, _free_bytes(context_dir)) from None
        raise UserError(reason, hint="make that folder writable, or set NGCX_STATE_DIR to a writable folder") from None


def _no_space(context_dir: Path, needed: int, free: int) -> UserError:
    return UserError(f"no space left on device for the build context {context_dir}: it needs about "
                     f"{needed // 1024 + 1} KB, {free // 1024} KB free there",
                     hint="free some space there, or set NGCX_STATE_DIR to a folder on a disk with room")


def _tree_bytes(folder: Path) -> int:
    if not folder.is_dir():
        return 0
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


def _context_bytes(release: Release) -> int:
    """What a context takes on disk: each file rounded up to a 4 KB block, plus the folders."""
    from ..render import dockerfile as render
    from ..render.recipe import load_recipe

    block = 4096
    sizes = [len(data) for data in render.runtime_package_files().values()]
    tests = load_recipe(release.image).tests_dir
    if tests.is_dir():
        sizes += [f.stat().st_size for f in tests.rglob("*") if f.is_file() and "__pycache__" not in f.parts]
    sizes += [64 * 1024, 64]  # the Dockerfile (generous) and .dockerignore
    return sum(-(-n // block) * block for n in sizes) + 16 * block


def _free_bytes(folder: Path) -> int:
    import shutil

    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _write_secret(path: Path, text: str) -> Path:
    """Write a secret file 0600 (private temp dir); a full or read-only $TMPDIR is one line, no secret in it."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
    except OSError as exc:
        raise UserError(f"cannot write the pip.conf secret to {path.parent}: {exc.strerror}",
                        hint="free space in $TMPDIR or point TMPDIR at a writable folder") from None
    return path


def _revision() -> str:
    """The ngcx source revision (git) for the OCI revision label, or 'unknown'."""
    from ..core import paths

    try:
        out = subprocess.run(["git", "-C", str(paths.data_dir()), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown"


def _report_failure(parser: ProgressParser) -> None:
    """Print the failing step and its last log lines, then raise BuildFailed (exit 1); a wheel whose bytes are not
    the locked ones is that one line alone."""
    import sys

    step = parser.failed()
    mismatch = hash_mismatch(list(step.log)) if step is not None else None
    if mismatch:
        raise BuildFailed(mismatch)
    if step is None:
        tail = [s for s in parser.steps.values() if s.log]
        detail = tail[-1].log if tail else []
        for line in list(detail)[-15:]:
            print(f"  | {line}", file=sys.stderr)
        raise BuildFailed("docker build failed before any step ran"
                          + (f": {detail[-1]}" if detail else ""))
    print(f"\nfailed step: {step.title or step.name}", file=sys.stderr)
    for line in list(step.log)[-20:]:
        print(f"  | {line}", file=sys.stderr)
    raise BuildFailed(f"build failed at {(step.title or step.name)[:90]}: {parser.error or 'see the log above'}")


# ----------------------------------------------------------------------------- pins: the base and the wheels


def pin_base(client, base: str):
    """(the reference the build names its base by, the base image): a digest wherever one exists.

    A base that has a registry digest (pulled, or given as NAME@sha256:...) is built FROM `repo@sha256:...`, which
    BuildKit resolves to exactly those bytes. An imported base (`ngcx base bootstrap`: no registry digest, and the
    engine's BuildKit resolves name@sha256 only through one, render/basepin.py) is built from its tag, pinned by
    the image ID recorded when it was made: another image under the tag is refused here, and check_on_base proves
    the result sits on the recorded one. A base made before pins were recorded is recorded now, once, and said.
    """
    import sys

    from ..render import basepin

    image = client.images.get(base)
    if "@" in base:
        return base, image
    repository = base.rsplit(":", 1)[0] if ":" in base.rsplit("/", 1)[-1] else base
    digests = [d for d in image.attrs.get("RepoDigests") or [] if d.split("@")[0] == repository]
    if digests:
        return digests[0], image
    pinned = basepin.recorded(base)
    if pinned is None:
        basepin.record(base, image.id)
        print(f"ngcx: pinned base {base} to image {image.id} (first build from it; later builds refuse another "
              "image under this tag)", file=sys.stderr)
    elif pinned != image.id:
        raise UserError(f"base {base} is now image {image.id[:19]}, not {pinned[:19]} recorded when it was made: "
                        "refusing a retagged base",
                        hint="if you re-made it on purpose, `ngcx base bootstrap` records the new one; else tag "
                             f"{pinned[:19]} back as {base}")
    return base, image


def check_on_base(img, base_image, base: str) -> None:
    """The built image's layers start with its base's: what was pinned is what it was built FROM."""
    mine = (img.attrs.get("RootFS") or {}).get("Layers") or []
    theirs = (base_image.attrs.get("RootFS") or {}).get("Layers") or []
    if not theirs or mine[:len(theirs)] != theirs:
        raise BuildFailed(f"built {img.id[:19]}, but it does not sit on the pinned base {base} "
                          f"({base_image.id[:19]}): the tag changed during the build; build again")


_MISMATCH = re.compile(r"DO NOT MATCH THE HASHES")
_PACKAGE = re.compile(r"(?:^|\s)(?P<req>[A-Za-z0-9][A-Za-z0-9._\[\],-]*==\S+) from ")
_EXPECTED = re.compile(r"Expected\s+(?:sha256|or)\s+(?P<hash>[0-9a-f]{64})")
_GOT = re.compile(r"Got\s+(?P<hash>[0-9a-f]{64})")


def hash_mismatch(log: list[str]) -> str | None:
    """pip's "THESE PACKAGES DO NOT MATCH THE HASHES" block as one line: the package, its bytes' sha256 and the
    locked one(s) (recipes/macros.j2 installs every wheel with --require-hashes); None when the log has none."""
    start = next((i for i, line in enumerate(log) if _MISMATCH.search(line)), None)
    if start is None:
        return None
    package, expected, got = None, [], None
    for line in log[start + 1:]:
        if package is None and (m := _PACKAGE.search(line)):
            package = m["req"]
        elif m := _EXPECTED.search(line):
            expected.append(m["hash"])
        elif m := _GOT.search(line):
            got = m["hash"]
            break
    if package is None or got is None or not expected:
        return None
    return (f"{package}: the wheel's sha256 is {got}, but the catalog's lock (registry.lock.yaml) has "
            f"{' or '.join(expected)}: its bytes are not the ones locked, so nothing was installed "
            "(a replaced file on the index, mirror or proxy; if the lock is stale: `ngcx catalog lock`)")
