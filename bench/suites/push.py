"""push: bytes and time to push cuda:24.05 into an empty registry and to pull it into an empty engine,
with the layer compression ngcx uses today and the alternatives it could use.

Compressions (each repetition pushes each into its own empty registry: bench/suites/push_registry.py):
  gzip  `ngcx push` as it is: the engine's own push, one Go gzip stream per layer (dockerd 20.10)
  pigz  docker save -> each layer through pigz -6 (gzip, every core) -> the registry API
  zstd  docker save -> each layer through zstd -3 -T0 -> the registry API, OCI manifest
  none  docker save -> each layer as it is (plain tar) -> the registry API, OCI manifest: what a pull costs
        when nothing has to be inflated (the fresh cloud host's pull, issue 24 item 6)
Pulls (bench/suites/push_pull.py): a fresh machine of tests/emulators (Debian's docker.io 20.10, own empty
disk) pulls through a RegistryRelay with `docker pull`; also with unpigz put on its PATH (gzip), and
with containerd's `ctr` (gzip, zstd): dockerd 20.10 cannot unpack zstd layers, and its failure is
recorded as a finding with the engine's own error line. Then a second image FROM cuda:24.05 (one
small layer on top) is pushed and pulled into the engine that already holds cuda:24.05.
Ratios: pigz / gzip, zstd / gzip and uncompressed / gzip for push time, pull time and bytes; unpigz / without; second
image / first pull. Everything this suite tags is `ngcx-bench/*` or in a registry it removes.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..core import SuiteResult, SuiteSkipped, script, time_once
from .push_figures import (
    CONTAINERD,
    PAYLOAD_MB,
    REF,
    SECOND_PULL,
    SECOND_PULLED,
    SECOND_PUSH,
    SECOND_PUSHED,
    SECOND_SIZE,
    TOOL,
    UNPIGZ,
    Figures,
    new_blob_bytes,
    notes,
    pull_name,
    pulled_name,
    push_name,
    pushed_name,
    ratios,
    rotated,
)

LOCAL = "ngcx/cuda:24.05-runtime"              # what `ngcx build cuda:24.05` tags (runtime variant)
PINNED = "ngcx-bench/cuda:24.05-runtime"       # our own tag: another session may rebuild LOCAL mid-run
SECOND = "ngcx-bench/cuda-second:24.05-runtime"
NAMESPACE, TAG = "bench", "24.05-runtime"
REPO, SECOND_REPO = f"{NAMESPACE}/cuda", f"{NAMESPACE}/cuda-second"
CODECS = ("gzip", "pigz", "zstd", "none")
APT = {"pigz": "pigz", "unpigz": "pigz", "zstd": "zstd", "docker-registry": "docker-registry"}
MIN_FREE_GB = 10
DOCKER = "/usr/bin/docker"


# ----------------------------------------------------------------------------- set-up and clean-up


def ensure_apt(programs: dict[str, str]) -> None:
    """Install the Debian packages of missing programs (pigz, zstd) with apt, as ensure_package does with pip."""
    missing = sorted({pkg for prog, pkg in programs.items() if shutil.which(prog) is None})
    if not missing:
        return
    if os.geteuid() != 0:
        raise SuiteSkipped(f"needs {', '.join(missing)}: run `apt-get install -y {' '.join(missing)}` as root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing]
    print(f"bench push: installing {' '.join(missing)} with apt", file=sys.stderr)
    proc = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env, timeout=900)
        proc = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900)
    still = [prog for prog in programs if shutil.which(prog) is None]
    if still:
        raise SuiteSkipped(f"cannot install {', '.join(missing)} with apt: {proc.stderr.strip()[-300:]}")


def _docker(*args: str, check: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, check=check, timeout=900)


def _require(work: Path) -> None:
    if _docker("info", "--format", "{{.ServerVersion}}").returncode != 0:
        raise SuiteSkipped("needs the Docker engine (scripts/setup.sh)")
    ensure_apt(APT)
    for where in (work, Path(_docker("info", "--format", "{{.DockerRootDir}}").stdout.strip() or "/var/lib/docker")):
        free = shutil.disk_usage(where).free
        if free < MIN_FREE_GB * 1e9:
            raise SuiteSkipped(f"only {free / 1e9:.0f} GB free under {where}: the push suite needs {MIN_FREE_GB} GB "
                               "(a registry copy and a pulled copy of a 2 GB image)")


def _pin_image(env: dict[str, str]) -> dict[str, Any]:
    """Tag the built cuda:24.05 as PINNED (built first when missing); its size and layer count."""
    if _docker("image", "inspect", LOCAL).returncode != 0:
        print(f"bench push: {LOCAL} is missing: ngcx build {REF} --base offline", file=sys.stderr)
        proc = subprocess.run([script("ngcx"), "build", REF, "--base", "offline"], capture_output=True, text=True,
                              env=env, timeout=3600)
        if proc.returncode != 0:
            raise SuiteSkipped(f"ngcx build {REF} --base offline failed: {proc.stderr.strip()[-300:]}")
    _docker("tag", LOCAL, PINNED, check=True)
    out = _docker("image", "inspect", "--format", "{{.Id}} {{.Size}} {{len .RootFS.Layers}}", PINNED, check=True)
    image_id, size, layers = out.stdout.split()
    return {"id": image_id, "size": int(size), "layers": int(layers)}


def _build_second(work: Path) -> None:
    """A second image on exactly the CUDA stack: FROM the pinned cuda:24.05 + one layer of random MB."""
    folder = work / "second"
    folder.mkdir()
    (folder / "payload.bin").write_bytes(os.urandom(PAYLOAD_MB * 1_000_000))
    (folder / "Dockerfile").write_text(f"FROM {PINNED}\nCOPY payload.bin /opt/ngcx-bench/payload.bin\n")
    proc = subprocess.run([DOCKER, "build", "-q", "-t", SECOND, str(folder)], capture_output=True, text=True,
                          env={**os.environ, "DOCKER_BUILDKIT": "0"}, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"building the second image failed: {proc.stderr.strip()[-400:]}")


def _untag(*refs: str) -> None:
    for ref in refs:
        _docker("rmi", ref)


# ----------------------------------------------------------------------------- one round


def _ngcx_push(image: str, registry: str, env: dict[str, str]) -> float:
    """`ngcx push` timed, its remote tag removed again (the engine keeps one per push)."""
    name = image.split("/")[-1].split(":")[0]
    try:
        wall, _ = time_once([script("ngcx"), "push", image, "--registry", f"{registry}/{NAMESPACE}"], env)
    finally:
        _untag(f"{registry}/{NAMESPACE}/{name}:{TAG}")
    return wall


def _push(codec: str, registry: str, env: dict[str, str], figs: Figures) -> dict[str, Any]:
    from .push_compress import host_cpu_seconds, push_compressed
    from .push_registry import manifest, wire_bytes

    cpu0 = host_cpu_seconds()
    if codec == "gzip":
        wall = _ngcx_push(PINNED, registry, env)
        command = f"ngcx push {PINNED} --registry 127.0.0.1:PORT/{NAMESPACE}"
        note = "the engine's push: dockerd compresses each layer with Go's gzip"
    else:
        start = time.perf_counter()
        pushed = push_compressed(PINNED, registry, REPO, TAG, codec)
        wall = time.perf_counter() - start
        figs.facts.setdefault("export", {}).setdefault(codec, []).append(pushed.export_s)
        command = f"docker save {PINNED} | {' '.join(_compressor(codec))} per layer | registry API"
        note = "bench/suites/push_compress.py: streamed; includes docker save's export"
    cpu1 = host_cpu_seconds()
    cpu = cpu1 - cpu0 if cpu0 is not None and cpu1 is not None else None
    served = manifest(registry, REPO, TAG)
    figs.add(push_name(codec), wall, "s", TOOL[codec], command, note, cpu=cpu)
    figs.add(pushed_name(codec), wire_bytes(served) / 1e6, "MB", TOOL[codec], command,
             "compressed layers + config, as the registry's manifest lists them")
    return served


def _compressor(codec: str) -> list[str]:
    from .push_compress import COMPRESSORS

    return COMPRESSORS[codec]


def _pull(site, figs: Figures, name: str, codec: str, how: Callable, setup: Callable | None = None,
          tolerate: bool = False, keep: bool = False):
    """One pull on a fresh machine; a failure is a finding where `tolerate` (zstd), else an error."""
    machine = site.machine()
    if setup:
        setup(machine)
    if setup is None and "unpigz_on_pull_hosts" not in figs.facts:
        figs.facts["unpigz_on_pull_hosts"] = machine.has("unpigz")
        figs.facts["versions"] = machine.versions()
    pull = how(machine)
    if pull.ok:
        engine = "ctr images pull --plain-http" if CONTAINERD in name else "docker pull"
        figs.add(name, pull.seconds, "s", TOOL[codec] if setup is None else "unpigz",
                 f"{engine} RELAY/{REPO}:{TAG} (fresh machine)", "timed inside the machine", cpu=pull.cpu)
    elif tolerate:
        figs.failed(name, {"error": pull.error, "seconds": pull.seconds, "relay_bytes": pull.relay_bytes})
    else:
        raise RuntimeError(f"{name} failed: {pull.error}")
    if not keep:
        machine.discard()
    return machine, pull


def _pulls(codec: str, site, figs: Figures, second: dict[str, Any] | None) -> None:
    machine, pull = _pull(site, figs, pull_name(codec), codec, lambda m: m.docker_pull(REPO, TAG),
                          tolerate=codec == "zstd", keep=second is not None)
    if pull.ok:
        figs.add(pulled_name(codec), pull.relay_bytes / 1e6, "MB", TOOL[codec], "bytes the relay carried",
                 "docker pull: layers, config, manifest and HTTP")
    if second is not None:
        done = machine.docker_pull(SECOND_REPO, TAG)
        machine.discard()
        if not done.ok:
            raise RuntimeError(f"{SECOND_PULL} failed: {done.error}")
        cmd = f"docker pull RELAY/{SECOND_REPO}:{TAG} (after {REPO})"
        figs.add(SECOND_PULL, done.seconds, "s", "second image", cmd, f"FROM {REF} + one {PAYLOAD_MB} MB layer",
                 cpu=done.cpu)
        figs.add(SECOND_PULLED, done.relay_bytes / 1e6, "MB", "second image", cmd, "bytes the relay carried")
        figs.add(SECOND_SIZE, sum(int(x["size"]) for x in second["layers"]) / 1e6 + second["config"]["size"] / 1e6,
                 "MB", "second image", "its manifest", "every layer, as a pull into an empty engine fetches it")
    if codec == "gzip":
        _pull(site, figs, UNPIGZ, codec, lambda m: m.docker_pull(REPO, TAG), setup=lambda m: m.add_unpigz())
    if codec in ("gzip", "zstd"):
        _, ctr = _pull(site, figs, pull_name(codec, CONTAINERD), codec, lambda m: m.ctr_pull(REPO, TAG),
                       tolerate=codec == "zstd")
        if codec == "zstd" and ctr.ok and not pull.ok:  # an engine that pulled zstd itself counted it already
            figs.add(pulled_name(codec), ctr.relay_bytes / 1e6, "MB", TOOL[codec], "bytes the relay carried",
                     "ctr pull (dockerd 20.10 cannot pull zstd)")


def _round(round_: int, work: Path, env: dict[str, str], figs: Figures) -> None:
    from .push_pull import PullSite
    from .push_registry import FreshRegistry, manifest, wire_bytes

    for codec in rotated(CODECS, round_):
        print(f"bench push: round {round_ + 1}, {codec}", file=sys.stderr)
        with FreshRegistry(parent=work) as registry:
            first = _push(codec, registry.address, env, figs)
            second = None
            if codec == "gzip":
                wall = _ngcx_push(SECOND, registry.address, env)
                second = manifest(registry.address, SECOND_REPO, TAG)
                cmd = f"ngcx push {SECOND} --registry 127.0.0.1:PORT/{NAMESPACE} (after {PINNED})"
                figs.add(SECOND_PUSH, wall, "s", "second image", cmd, "into the registry that holds cuda:24.05")
                figs.add(SECOND_PUSHED, new_blob_bytes(first, second) / 1e6, "MB", "second image", cmd,
                         "blobs the registry did not have yet")
                figs.facts["second_full_bytes"] = wire_bytes(second)
            with PullSite(registry.address) as site:
                _pulls(codec, site, figs, second)


# ----------------------------------------------------------------------------- the suite


def run(result: SuiteResult, work: Path, out: Path) -> None:
    """Push and pull cuda:24.05 per compression, result.repeat rounds; ratios and notes from the medians."""
    _require(work)
    env = {**os.environ, "NGCX_STATE_DIR": str(work / "state"), "NGCX_BASE": "offline"}
    figs = Figures()
    try:
        image = _pin_image(env)
        _build_second(work)
        for round_ in range(result.repeat):
            _round(round_, work, env, figs)
    finally:
        _untag(SECOND, PINNED)
    result.measurements = figs.measurements()
    result.ratios = ratios(figs)
    result.notes = notes(figs, image)
    result.extra.update(
        ref=REF, image=image, second_image=f"FROM {REF} + {PAYLOAD_MB} MB of random bytes (one layer)",
        versions=figs.facts.get("versions"), unpigz_on_pull_hosts=figs.facts.get("unpigz_on_pull_hosts"),
        failures=figs.failures, export_seconds=figs.facts.get("export"),
        compressors={c: " ".join(_compressor(c)) for c in ("pigz", "zstd", "none")},
        engine=_docker("version", "--format", "{{.Server.Version}}").stdout.strip())
