"""Push an engine's image with layers compressed by pigz or zstd, or not at all: the alternatives to dockerd's push.

dockerd (20.10, and later versions with their classic graph drivers) pushes every layer as gzip
that it writes itself, one Go gzip stream per layer. The alternatives measured here start from the
same place, an image in the engine, and end at the same one, the image in an empty registry:

    docker save IMAGE  ->  each layer.tar  ->  pigz -6 | zstd -3 -T0  ->  PATCH (streamed)  ->  manifest

Everything is streamed: the layer is compressed while `docker save` produces it and uploaded while
it is compressed, as dockerd's push does. pigz writes gzip (the same Docker v2 manifest dockerd
pushes, any engine pulls it); zstd layers need an OCI manifest (Docker v2 has no zstd media type), and so do
uncompressed ones ("none": the layer tar as docker save writes it, OCI's plain layer type).
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import shutil
import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from .push_registry import image_manifest, push_blob, push_manifest

DOCKER = "/usr/bin/docker"
CHUNK = 1 << 20
COMPRESSORS = {  # the tools' default levels: gzip -6 as dockerd's Go gzip, zstd -3
    "pigz": ["pigz", "-6", "-c"],
    "zstd": ["zstd", "-3", "-T0", "-c", "-q"],
    "none": ["cat"],          # the same streaming path, so the three differ only in what the layer becomes
}


@dataclass
class Pushed:
    """One push's result: the manifest digest and the compressed bytes of its layers and config."""

    digest: str
    layer_bytes: int
    config_bytes: int
    layers: int
    export_s: float          # until docker save's first byte: dockerd 20.10 writes the whole export first

    @property
    def wire_bytes(self) -> int:
        return self.layer_bytes + self.config_bytes


def host_cpu_seconds() -> float | None:
    """CPU seconds used so far by the host's dockerd, this process and its waited-for children.

    Why all three: dockerd's push compresses inside dockerd, `docker save` exports inside dockerd,
    pigz and zstd run as children, and the streaming (HTTP, pipes) runs here. The difference over a
    push is the CPU that push cost, wherever it ran (dockerd's share includes any other work the
    shared engine did meanwhile). None when dockerd's /proc entry cannot be read (not root, remote).
    """
    import os
    import resource

    try:
        pid = Path("/var/run/docker.pid").read_text().strip()
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    engine = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")   # utime + stime
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return engine + own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def missing_tools(codec: str) -> list[str]:
    """The programs a codec's push needs that are not on PATH (the suite installs them with apt)."""
    return [tool for tool in (COMPRESSORS[codec][0], DOCKER) if shutil.which(tool) is None]


def compressed(reader: IO[bytes], argv: list[str]) -> Iterator[bytes]:
    """reader's bytes through the compressor argv, as chunks of its output while it runs.

    A thread feeds the compressor's stdin, the caller's loop drains its stdout: the two pipes never
    wait on each other. A compressor that fails, or a reader that raises, ends the stream with an error.
    """
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    failure: list[BaseException] = []

    def feed() -> None:
        try:
            while chunk := reader.read(CHUNK):
                proc.stdin.write(chunk)
        except BaseException as exc:  # noqa: BLE001 - handed to the draining side
            failure.append(exc)
        finally:
            with contextlib.suppress(OSError):  # a killed compressor: the pipe is already broken
                proc.stdin.close()

    feeder = threading.Thread(target=feed, name=f"feed {argv[0]}", daemon=True)
    feeder.start()
    drained = False
    try:
        while chunk := proc.stdout.read(CHUNK):
            yield chunk
        drained = True
    finally:
        if not drained:  # the upload stopped early: unblock the feeder (it may be waiting on a full pipe)
            proc.kill()
        feeder.join()
        code = proc.wait()
        err = proc.stderr.read().decode("utf-8", "replace").strip()
    if failure:
        raise RuntimeError(f"feeding {argv[0]} failed: {failure[0]}")
    if code != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {code}: {err[-300:]}")


def layer_paths(manifest_json: list[dict], links: dict[str, str]) -> list[str]:
    """The layer.tar path of each layer, bottom first, from docker save's manifest.json; a layer that
    docker save wrote as a symlink to an identical one (same content twice) is followed to it."""
    out = []
    for path in manifest_json[0]["Layers"]:
        seen = set()
        while path in links and path not in seen:
            seen.add(path)
            path = links[path]
        out.append(path)
    return out


def link_target(name: str, linkname: str) -> str:
    """A symlink member's target as a member name (docker save writes relative links: ../ID/layer.tar)."""
    return posixpath.normpath(posixpath.join(posixpath.dirname(name), linkname))


def push_compressed(image: str, address: str, repository: str, tag: str, codec: str) -> Pushed:
    """Export `image` from the engine, compress each layer with `codec` (pigz | zstd | none), push it to
    address/repository:tag. Raises when docker save, a compressor or the registry fails."""
    argv = COMPRESSORS[codec]
    start = time.perf_counter()
    save = subprocess.Popen([DOCKER, "save", image], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    export_s = 0.0
    uploads: dict[str, tuple[str, int]] = {}
    links: dict[str, str] = {}
    jsons: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=save.stdout, mode="r|") as tar:
            export_s = time.perf_counter() - start  # opening the stream read its first header
            for member in tar:
                if member.issym():
                    links[member.name] = link_target(member.name, member.linkname)
                elif member.isfile() and member.name.endswith("/layer.tar"):
                    done = push_blob(address, repository, compressed(tar.extractfile(member), argv))
                    uploads[member.name] = (done.digest, done.size)
                elif member.isfile() and member.name.endswith(".json") and "/" not in member.name:
                    jsons[member.name] = tar.extractfile(member).read()
    finally:
        save.stdout.close()
        code = save.wait()
    if code != 0:
        raise RuntimeError(f"docker save {image} exited {code}: {save.stderr.read().decode(errors='replace')[-300:]}")
    saved = json.loads(jsons["manifest.json"])
    config = jsons[saved[0]["Config"]]
    layers = [uploads[path] for path in layer_paths(saved, links)]
    push_blob(address, repository, [config])
    digest = push_manifest(address, repository, tag, image_manifest(config, layers, codec))
    return Pushed(digest=digest, layer_bytes=sum(size for _, size in layers), config_bytes=len(config),
                  layers=len(layers), export_s=round(export_s, 3))
