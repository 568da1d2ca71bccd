"""Behind `ngcx lock`: resolve a project's requirements INSIDE its base image into ngcx.lock.

Why inside the base: the versions pip picks depend on the Python, the platform and what is already
installed; a lock made on a laptop (macOS, another Python) is wrong for the image (BentoML gallery#112).
The base runs once with `docker run --rm`: its own pip, under its pins and its frozen set, with
`pip install --dry-run --report`. The CA bundle and a pip.conf with index credentials are mounted
read-only into that one container only, never into an image.

The lock names the base image (ID and layer digest) and the requirements it was made from, so
`ngcx build` refuses a lock that no longer fits either (one line: run `ngcx lock` again). Each pin carries
the sha256 of the file pip chose (the report's download_info), and the project build installs with
--require-hashes (recipes/project.Dockerfile.j2), so a wheel with other bytes fails the build; a lock
written before hashes were recorded is refused the same way.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..core.errors import UserError

if TYPE_CHECKING:
    from ..build.image import BuildOptions
    from .base import BaseImage
    from .spec import Project

LOCK_FILE = "ngcx.lock"
HEADER = re.compile(r"^# (?P<key>[a-z0-9-]+): (?P<value>.*)$")
RESOLVE = (
    'pip list --format=freeze | grep -v -E "^(pip|setuptools|wheel)==" > /tmp/ngcx-frozen.txt '
    "&& pip install --dry-run --progress-bar off --report /tmp/ngcx-report.json "
    '--constraint /etc/ngcx/constraints.txt --constraint /tmp/ngcx-frozen.txt "$@" 1>&2 '
    "&& cat /tmp/ngcx-report.json && echo"      # a last line without newline can be lost from the logs
)


@dataclass(frozen=True)
class Lock:
    """ngcx.lock, parsed: the header (what it was resolved for) and the pins."""

    base: str
    base_image: str
    base_id: str
    base_layers: str
    requirements_sha256: str
    pins: tuple[str, ...]


def requirements_sha(project: Project) -> str:
    """What the lock was made from: ngcx.yaml's python_packages + requirements file, in order."""
    return hashlib.sha256(("\n".join(project.requirements) + "\n").encode()).hexdigest()


def parse_lock(path: Path) -> Lock:
    """Read ngcx.lock; a file without ngcx's header is one line (it was not written by `ngcx lock`)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}",
                        hint="delete it and run `ngcx lock` again") from None
    header: dict[str, str] = {}
    pins = []
    for raw in text.splitlines():
        line = raw.strip()
        m = HEADER.match(line)
        if m:
            header[m.group("key")] = m.group("value").strip()
        elif line and not line.startswith("#"):
            pins.append(line)
    keys = ("base", "base-image", "base-id", "base-layers", "requirements-sha256")
    missing = [k for k in keys if k not in header]
    if missing:
        raise UserError(f"{path} has no '# {missing[0]}:' header line, so ngcx cannot tell what it was resolved for",
                        hint="run `ngcx lock` again to rewrite it")
    return Lock(header["base"], header["base-image"], header["base-id"], header["base-layers"],
                header["requirements-sha256"], tuple(pins))


def check_lock(project: Project, base: BaseImage) -> Lock:
    """The lock must be for this base (same image, or the same layers relabelled) and these requirements."""
    path = project.root / LOCK_FILE
    lock = parse_lock(path)
    if lock.base != project.release.ref or (lock.base_id != base.id and lock.base_layers != base.chain):
        raise UserError(f"{path} was resolved on {lock.base} ({lock.base_image} {lock.base_id[:19]}), but the base "
                        f"is now {project.release.ref} ({base.tag} {base.id[:19]})",
                        hint="run `ngcx lock` again")
    if lock.requirements_sha256 != requirements_sha(project):
        raise UserError(f"{path} is older than the requirements in {project.file.name} (they changed since "
                        "`ngcx lock` ran)", hint="run `ngcx lock` again")
    unhashed = [p.split()[0] for p in lock.pins if "--hash=sha256:" not in p]
    if unhashed:
        raise UserError(f"{path}: {unhashed[0]} has no --hash (the build installs with --require-hashes)",
                        hint="run `ngcx lock` again to record every wheel's sha256")
    return lock


def resolve(project: Project, base: BaseImage, opts: BuildOptions, client: Any) -> tuple[list[str], dict]:
    """Run the base's pip once, dry: (name==version for every package it would add, its environment)."""
    from docker.errors import ContainerError, DockerException

    from ..build import image as cb
    from ..core.output import redact
    from .pip_errors import pip_problem

    ca = cb.detect_ca(opts.ca_cert)
    with tempfile.TemporaryDirectory(prefix="ngcx-lock-") as secret_dir:
        os.chmod(secret_dir, 0o700)
        volumes, env = {}, {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
        if ca:
            volumes[str(ca.resolve())] = {"bind": "/run/ngcx/ca.pem", "mode": "ro"}
            env["PIP_CERT"] = "/run/ngcx/ca.pem"
        conf = cb.pip_conf_text(opts)
        if conf:
            conf_file = cb._write_secret(Path(secret_dir) / "pip.conf", conf)
            volumes[str(conf_file)] = {"bind": "/run/ngcx/pip.conf", "mode": "ro"}
            env["PIP_CONFIG_FILE"] = "/run/ngcx/pip.conf"
        try:
            out = client.containers.run(base.id, ["-c", RESOLVE, "ngcx-lock", *project.requirements],
                                        entrypoint=["/bin/sh"], environment=env, volumes=volumes,
                                        remove=True, stdout=True, stderr=False)
        except ContainerError as exc:
            raw = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else str(exc.stderr or "")
            lines = [redact(line) for line in raw.splitlines()]
            problem = pip_problem(lines, project.release.ref)
            if problem is not None:
                raise problem from None
            last = next((line for line in reversed(lines) if line.strip()), "no output")
            raise UserError(f"pip could not resolve the requirements in {base.tag}: {last[:200]}",
                            hint="check the requirements (and --pip-index-url / --ca-cert)") from None
        except DockerException as exc:
            raise UserError(f"could not run {base.tag} to resolve the requirements: {str(exc).splitlines()[0][:160]}",
                            hint="is the Docker Engine running? (ngcx doctor)") from None
    try:
        report = json.loads(out)
    except ValueError:
        raise UserError(f"pip in {base.tag} gave no installation report", hint="its pip must be >= 22.2") from None
    return pins_from_report(report), report.get("environment") or {}


def pins_from_report(report: dict) -> list[str]:
    """`pip install --report` -> one `name==version --hash=sha256:H` (or `name @ url --hash=...` for a direct
    URL) per package: H is the sha256 of the file pip chose; one without it (a folder, a VCS URL) is one line."""
    from .spec import canonical

    pins = []
    for item in report.get("install") or []:
        meta = item.get("metadata") or {}
        name, version = meta.get("name"), meta.get("version")
        if not name or not version:
            continue
        info = item.get("download_info") or {}
        url = info.get("url")
        digest = file_sha256(info)
        if digest is None:
            raise UserError(f"{name} {version} ({url or 'no URL'}) has no sha256 to lock: every wheel the build "
                            "installs is checked with --require-hashes",
                            hint="require it from an index or as a wheel/sdist URL, not a folder or VCS URL")
        pin = f"{name} @ {url}" if item.get("is_direct") and url else f"{name}=={version}"
        pins.append(f"{pin} --hash=sha256:{digest}")
    return sorted(pins, key=lambda p: canonical(re.split(r"[ =@]", p, maxsplit=1)[0]))


def file_sha256(download_info: dict) -> str | None:
    """The chosen file's sha256 from a report entry (archive_info.hashes, or the older archive_info.hash)."""
    archive = download_info.get("archive_info") or {}
    digest = (archive.get("hashes") or {}).get("sha256")
    if not digest and str(archive.get("hash") or "").startswith("sha256="):
        digest = archive["hash"].split("=", 1)[1]
    return digest if digest and re.fullmatch(r"[0-9a-f]{64}", digest) else None


def lock_text(project: Project, base: BaseImage, pins: list[str], environment: dict) -> str:
    platform = " ".join(x for x in (environment.get("sys_platform"), environment.get("platform_machine")) if x)
    head = [
        "# ngcx.lock: the project's requirements resolved by `ngcx lock` inside its base image.",
        "# `ngcx build` installs exactly these, under the base's pins. Regenerate with `ngcx lock`; do not edit.",
        f"# base: {project.release.ref}",
        f"# base-image: {base.tag}",
        f"# base-id: {base.id}",
        f"# base-layers: {base.chain}",
        f"# requirements-sha256: {requirements_sha(project)}",
        f"# platform: python {environment.get('python_full_version', '?')}, {platform or '?'}",
    ]
    return "\n".join(head + pins) + "\n"


def write_lock(path: Path, text: str) -> None:
    """Atomically: a failed write leaves the old lock whole."""
    tmp = path.with_name(f".{path.name}.ngcx-tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UserError(f"cannot write {path}: {exc.strerror}", hint="check that folder is writable") from None


def lock_project(project: Project, opts: BuildOptions, catalog=None) -> tuple[Path, list[str], BaseImage]:
    """Base (built first if missing) -> resolve in it -> ngcx.lock next to ngcx.yaml."""
    from ..core.engine import engine_client
    from .base import ensure_base

    if not project.requirements:
        raise UserError(f"{project.file.name} has no python_packages or requirements: nothing to lock",
                        hint="add python_packages (or requirements: requirements.txt) first")
    client = engine_client()
    base = ensure_base(project, opts, client, catalog)
    pins, environment = resolve(project, base, opts, client)
    path = project.root / LOCK_FILE
    write_lock(path, lock_text(project, base, pins, environment))
    return path, pins, base
