"""Behind `ngcx doctor`: is this machine ready to build, push and run GPU images? Each check with a fix.

Why one command: most "the build is broken" reports are a stopped dockerd, a CLI that cannot drive
BuildKit, a missing NVIDIA container toolkit or a full disk. doctor checks them all in a few
seconds, says what to do about each, and exits 1 only when something REQUIRED is missing (GPU
pieces are optional: without them GPU checks are skipped with the reason, never passed).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LOOPBACK_REGISTRY = "127.0.0.1:5000"
DEFAULT_OFFLINE_BASE = "ngcx/base:bookworm"
MIN_FREE_GB = 30
MARKS = {"ok": "✓", "fail": "✗", "warn": "!"}


@dataclass
class Check:
    name: str
    status: str          # ok | warn | fail
    detail: str
    hint: str = ""
    required: bool = False


def run_checks() -> list[Check]:
    """All checks, in the order a user fixes things."""
    client, engine = check_engine()
    info = _engine_info(client)
    return [
        engine,
        check_buildkit(client),
        check_logins(),
        check_loopback_registry(),
        check_nvidia_driver(),
        check_container_toolkit(info),
        check_disk(info),
        check_offline_base(client),
        check_deployments(),
    ]


def check_deployments() -> Check:
    """Deploys that were interrupted (Ctrl-C, kill -9) may have left a billed instance behind."""
    from ..core.errors import UserError
    from ..deploy import store

    try:
        stuck = store.interrupted()
    except UserError as exc:
        return Check("deployments", "warn", f"state store unreadable: {exc.message}", hint=exc.hint or "")
    if not stuck:
        return Check("deployments", "ok", "no interrupted deploys")
    names = ", ".join(f"{r.id} ({r.cloud}, {r.status})" for r in stuck[:5])
    return Check("deployments", "warn", f"{len(stuck)} interrupted deploy(s): {names}",
                 hint="run `ngcx deployments gc` to find and delete what they left")


def _engine_info(client: Any) -> dict[str, Any]:
    if client is None:
        return {}
    try:
        return client.info()
    except Exception:  # noqa: BLE001 - engine went away between checks; the engine line says so
        return {}


def check_engine() -> tuple[Any, Check]:
    from ..core.engine import ENGINE_HINT, engine_client
    from ..core.errors import UserError

    try:
        client = engine_client(timeout=30)
    except UserError as exc:
        return None, Check("engine", "fail", exc.message, ENGINE_HINT, required=True)
    version = client.version()
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    return client, Check("engine", "ok", f"Docker Engine {version.get('Version')} "
                                         f"(API {version.get('ApiVersion')}) at {host}", required=True)


def check_buildkit(client: Any) -> Check:
    """Build a one-line FROM scratch context with DOCKER_BUILDKIT=1 (exported to nowhere)."""
    from ..core.engine import docker_cli

    name = "buildkit"
    if client is None:
        return Check(name, "fail", "not checked: engine not reachable", "start the engine first", True)
    cli = docker_cli()
    if not cli:
        return Check(name, "fail", "no docker CLI on PATH", "apt-get install docker.io", True)
    with tempfile.TemporaryDirectory(prefix="ngcx-doctor-") as ctx:
        Path(ctx, "Dockerfile").write_text("FROM scratch\nLABEL ai.ngcx.doctor=1\n")
        try:
            proc = subprocess.run([cli, "build", "-q", "--output", "type=tar,dest=/dev/null", ctx],
                                  capture_output=True, text=True, timeout=120,
                                  env={**os.environ, "DOCKER_BUILDKIT": "1"})
        except subprocess.TimeoutExpired:
            return Check(name, "fail", "BuildKit test build timed out after 120 s",
                         "check `docker info` and the dockerd log", True)
    if proc.returncode != 0:
        reason = " ".join((proc.stderr or proc.stdout).split())[:160]
        return Check(name, "fail", f"DOCKER_BUILDKIT=1 {cli} build failed: {reason}",
                     "use the Debian docker.io CLI (/usr/bin/docker) or install the buildx plugin; "
                     "NGCX_DOCKER_CLI picks the CLI", True)
    return Check(name, "ok", f"DOCKER_BUILDKIT=1 {cli} build works", required=True)


def check_logins() -> Check:
    """Registries with stored credentials (names only, never the credentials)."""
    from ..core.errors import UserError
    from ..registry.credentials import docker_config_path, read_docker_config

    try:
        config = read_docker_config()
    except UserError as exc:
        return Check("logins", "warn", exc.message, exc.hint or "")
    names = sorted(set(config.get("auths", {})) | set(config.get("credHelpers", {})))
    store = config.get("credsStore")
    suffix = f" (credsStore: {store})" if store else ""
    if not names:
        return Check("logins", "warn", f"no registry logins in {docker_config_path()}{suffix}",
                     "ngcx login HOST (needed only to push to registries that ask for credentials)")
    return Check("logins", "ok", ", ".join(names) + suffix)


def check_loopback_registry() -> Check:
    from ..core.errors import UserError
    from ..registry.api import registry_status

    try:
        status = registry_status(LOOPBACK_REGISTRY, timeout=3)
    except UserError:
        return Check("registry", "warn", f"no registry on http://{LOOPBACK_REGISTRY}/v2/",
                     "scripts/setup.sh starts one (docker-registry serve)")
    if status in (200, 401):
        auth = "" if status == 200 else " (asks for credentials)"
        return Check("registry", "ok", f"http://{LOOPBACK_REGISTRY}/v2/ answers{auth}")
    return Check("registry", "warn", f"http://{LOOPBACK_REGISTRY}/v2/ answered HTTP {status}",
                 "is something else listening on :5000?")


def check_nvidia_driver() -> Check:
    """nvidia-smi's driver version, else whether libnvidia-ml loads at all."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            proc = subprocess.run([smi, "--query-gpu=name,driver_version", "--format=csv,noheader"],
                                  capture_output=True, text=True, timeout=20)
            if proc.returncode == 0 and proc.stdout.strip():
                gpus = [line.strip() for line in proc.stdout.strip().splitlines()]
                return Check("nvidia-driver", "ok", f"{len(gpus)} GPU(s): {'; '.join(gpus)}")
            reason = " ".join((proc.stderr or proc.stdout).split())[:120]
            return Check("nvidia-driver", "warn", f"nvidia-smi failed: {reason}",
                         "reinstall/reload the NVIDIA driver (dmesg | grep -i nvidia)")
        except subprocess.TimeoutExpired:
            return Check("nvidia-driver", "warn", "nvidia-smi hung for 20 s", "check the driver (dmesg)")
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return Check("nvidia-driver", "warn", "no NVIDIA driver (no nvidia-smi, no libnvidia-ml.so.1): "
                     "GPU checks will be skipped", "install the NVIDIA driver to run images on a GPU")
    return Check("nvidia-driver", "ok", "libnvidia-ml.so.1 loads (nvidia-smi not on PATH)")


def check_container_toolkit(info: dict[str, Any]) -> Check:
    runtimes = sorted((info.get("Runtimes") or {}).keys())
    if "nvidia" in runtimes:
        return Check("nvidia-toolkit", "ok", "nvidia runtime registered in the engine")
    on_path = shutil.which("nvidia-container-runtime") or shutil.which("nvidia-ctk")
    if on_path:
        return Check("nvidia-toolkit", "warn", f"{on_path} installed but not registered in the engine",
                     "nvidia-ctk runtime configure --runtime=docker, then restart dockerd")
    shown = ", ".join(runtimes) or "unknown (engine not reachable)"
    return Check("nvidia-toolkit", "warn", f"NVIDIA Container Toolkit not installed (runtimes: {shown})",
                 "install nvidia-container-toolkit to pass GPUs into containers (--gpus)")


def check_disk(info: dict[str, Any]) -> Check:
    root = info.get("DockerRootDir") or "/var/lib/docker"
    probe = Path(root)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free_gb = shutil.disk_usage(probe).free / 1e9
    detail = f"{free_gb:.1f} GB free under {root}"
    if free_gb < MIN_FREE_GB:
        return Check("disk", "warn", detail, f"GPU images need 5-20 GB each; free space "
                     f"(docker system prune) to have >= {MIN_FREE_GB} GB")
    return Check("disk", "ok", detail)


def offline_bases() -> list[str]:
    """The offline base tags the catalog names (bases.*.offline), else the default one."""
    try:
        from ..catalog import load_catalog

        tags = sorted({b.offline for b in load_catalog().spec.bases.values() if b.offline})
    except Exception:  # noqa: BLE001 - a broken catalog is `ngcx catalog check`'s business
        tags = []
    return tags or [DEFAULT_OFFLINE_BASE]


def check_offline_base(client: Any) -> Check:
    from ..core.engine import image_or_none
    from ..core.output import human_size

    if client is None:
        return Check("offline-base", "warn", "not checked: engine not reachable", "start the engine first")
    present, missing = [], []
    for tag in offline_bases():
        image = image_or_none(client, tag)
        (present if image else missing).append(
            f"{tag} ({human_size(image.attrs.get('Size', 0), places=1)})" if image else tag)
    if missing:
        return Check("offline-base", "warn", f"missing: {', '.join(missing)}",
                     "ngcx base bootstrap (needed only for builds without Docker Hub access)")
    return Check("offline-base", "ok", ", ".join(present))
