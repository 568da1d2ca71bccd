"""The machines behind emulated ECS instances: containers that run their own Docker Engine.

Why containers with their own dockerd, and not containers on the host's engine: the user-data that
ngcx hands to RunInstances is a shell script that calls `docker pull` and `docker run -p 8000:8000`
on the VM. To run it unchanged, each "VM" needs its own engine, its own disk (what a stopped
instance keeps: pulled layers, containers) and its own network address. Each instance here is a
container of tests/emulators/host/ (Debian's docker.io, started by boot.sh), with:

- its disk: docker volume `ngcx-ecs-disk-<instance_id>` at /var/lib/docker, kept by stop/start;
- its own network namespace on the engine's default bridge (its own IP, e.g. 172.17.0.2). Never the
  host's namespace: an inner dockerd there (with --bridge=none) deletes the host engine's docker0;
- the few privileges an inner dockerd needs (SYS_ADMIN, NET_ADMIN, no seccomp/AppArmor filter, the
  cgroup tree), since --privileged is refused on the machines this runs on;
- the user-data at /var/lib/cloud/user-data before its first boot; boot.sh runs it once per instance.

The cloud's metadata service answers at its real address (route_metadata: boot.sh DNATs it to the
emulator's server on the bridge gateway), so a host's role login runs unchanged and the emulator
knows the calling instance by its IP.

The "VPC registry" the machines pull from is the host's loopback registry, reached through a
RegistryRelay on the bridge's gateway address; the inner engines trust it as an insecure (http)
registry through /etc/docker/daemon.json.

snapshot() (CreateImage) works on a running or a stopped machine. A running one is paused (cgroup
freezer: its dockerd and, nested under it, its containers) while its root filesystem is committed
and its disk copied, so the image is crash-consistent, like a cloud snapshot of a running disk, and
the machine goes on afterwards with the same IP. The image is that pair: a committed image (files
the user-data wrote outside /var/lib/docker) and a copy of the disk volume.

Errors that the emulator should turn into API errors are HostError; they name the instance, never
the user-data (it may hold registry passwords).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import ipaddress
import json
import math
import re
import secrets
import socket
import tarfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path

from docker.errors import APIError, BuildError, ContainerError, ImageNotFound, NotFound

from .hosts_api import CommandResult

HOST_DIR = Path(__file__).parent / "host"
HOST_REPO = "ngcx-test/ecs-host"
SNAPSHOT_REPO = "ngcx-test/ecs-image"
NAME_PREFIX = "ngcx-ecs-"
DISK_PREFIX = "ngcx-ecs-disk-"
IMAGE_PREFIX = "ngcx-ecs-image-"
LOOPBACK_REGISTRY = "127.0.0.1:5000"
STOP_TIMEOUT = 20
INNER_SHUTDOWN_TIMEOUT = 10  # inner dockerd stops its containers within this, well inside STOP_TIMEOUT
CONSOLE_BYTES = 64 * 1024
RELAY_CHUNK = 64 * 1024
TIMEOUT_EXIT = 124  # run_command's exit code when the script ran past its timeout (GNU timeout's)
# Volume names, container names and image tags are built from the ids: keep them to what all three accept.
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_DOCKERD_CAPS = ["SYS_ADMIN", "NET_ADMIN"]
_DOCKERD_SECURITY = ["seccomp=unconfined", "apparmor=unconfined"]


class HostError(RuntimeError):
    """A machine operation that cannot be done (no such machine, not running, a failed copy)."""


def host_image_tag() -> str:
    """`ngcx-test/ecs-host:<12 hex>`: the content hash of Dockerfile + boot.sh, so an edit rebuilds."""
    digest = hashlib.sha256()
    for name in ("Dockerfile", "boot.sh"):
        digest.update((HOST_DIR / name).read_bytes())
    return f"{HOST_REPO}:{digest.hexdigest()[:12]}"


def ensure_host_image(client) -> str:
    """The host image's tag, built once per content hash (legacy builder: no buildx needed)."""
    tag = host_image_tag()
    with contextlib.suppress(ImageNotFound):
        client.images.get(tag)
        return tag
    try:
        client.images.build(path=str(HOST_DIR), tag=tag, rm=True, forcerm=True, pull=False)
    except BuildError as exc:
        tail = "".join(str(item.get("stream") or item.get("error") or "") for item in exc.build_log)[-1500:]
        raise HostError(f"building {tag} from {HOST_DIR} failed: {exc.msg}\n{tail}") from exc
    return tag


def bridge_gateway(client) -> str:
    """The engine's default bridge gateway (docker0's address, e.g. 172.17.0.1): the host as VMs see it."""
    network = client.api.inspect_network("bridge")
    for config in network.get("IPAM", {}).get("Config") or []:
        if config.get("Gateway"):
            return config["Gateway"].split("/")[0]
        if config.get("Subnet"):
            return str(next(ipaddress.ip_network(config["Subnet"]).hosts()))
    raise HostError("the engine's bridge network has no IPv4 subnet (is docker0 gone?)")


def _check_id(kind: str, value: str) -> str:
    if not _ID.match(value):
        raise ValueError(f"{kind} {value!r} is not usable as a docker name (letters, digits, _ . -; max 100)")
    return value


def _tar(name: str, data: bytes, mode: int) -> bytes:
    """One regular file as a tar archive, for put_archive (root-owned, as cloud-init writes it)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = len(data), mode, int(time.time())
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class DockerHosts:
    """HostBackend: every instance is a container running its own dockerd on its own disk volume.

    Everything made here carries the label `<label>=<owner>` (owner: a random token per backend), so
    close() removes exactly this backend's machines, disks and images even while other test sessions
    use the same engine. memory: a docker memory limit for each machine ("2g"), its containers included.
    """

    def __init__(self, client, *, insecure_registries: Iterable[str] = (), label: str = "ngcx-ecs-emulator",
                 memory: str | None = None) -> None:
        self.client = client
        self.insecure_registries = list(insecure_registries)
        self.label = label
        self.memory = memory
        self.owner = secrets.token_hex(6)
        self.metadata_routes: dict[str, str] = {}
        self._image: str | None = None
        self._image_lock = threading.Lock()

    def route_metadata(self, address: str, target: str) -> None:
        """Machines created from now on reach `target` (HOST:PORT, on the bridge gateway) when they call
        `address` (e.g. "100.100.100.200:80"), as software on the cloud calls its metadata service."""
        self.metadata_routes[address] = target

    # -- HostBackend -------------------------------------------------------------------------------

    def create(self, instance_id: str, image_id: str, user_data: bytes) -> str:
        _check_id("instance id", instance_id)
        disk = DISK_PREFIX + instance_id
        if self._exists(self.client.volumes, disk) or self._exists(self.client.containers, NAME_PREFIX + instance_id):
            raise HostError(f"a machine or disk for {instance_id} already exists")
        snapshot = self._snapshot(image_id)
        try:
            self.client.volumes.create(disk, labels=self._labels(instance=instance_id))
            if snapshot:
                self._copy_volume(IMAGE_PREFIX + image_id, disk)
            container = self._create_container(instance_id, snapshot or self._host_image(), disk)
            container.put_archive("/var/lib/cloud", _tar("user-data", bytes(user_data), 0o700))
            container.put_archive("/etc/docker", _tar("daemon.json", self._daemon_json(), 0o644))
            container.start()
            return self._ip(container)
        except BaseException:
            self._discard(instance_id)
            raise

    def start(self, instance_id: str) -> str:
        container = self._container(instance_id)
        container.start()
        return self._ip(container)

    def stop(self, instance_id: str) -> None:
        self._container(instance_id).stop(timeout=STOP_TIMEOUT)

    def delete(self, instance_id: str) -> None:
        """Idempotent: deleting a machine that is already gone (a failed create cleaned up) is no error."""
        _check_id("instance id", instance_id)
        self._discard(instance_id)

    def snapshot(self, instance_id: str, image_id: str) -> None:
        _check_id("image id", image_id)
        container = self._container(instance_id)
        volume = IMAGE_PREFIX + image_id
        if self._exists(self.client.volumes, volume):
            raise HostError(f"image {image_id} already exists")
        running = container.status == "running"
        try:
            self.client.volumes.create(volume, labels=self._labels(image=image_id))
            if running:
                container.pause()
            try:
                changes = [f'LABEL "{self.label}"="{self.owner}" "{self.label}.image"="{image_id}"']
                container.commit(repository=SNAPSHOT_REPO, tag=image_id, pause=False, changes=changes)
                self._copy_volume(DISK_PREFIX + instance_id, volume)
            finally:
                if running:
                    container.unpause()
        except BaseException:
            self.delete_image(image_id)
            raise

    def delete_image(self, image_id: str) -> None:
        _check_id("image id", image_id)
        with contextlib.suppress(NotFound):
            if self._owned(self.client.images.get(f"{SNAPSHOT_REPO}:{image_id}")):
                # force: a machine made from it keeps its layers; only the name goes
                self.client.images.remove(f"{SNAPSHOT_REPO}:{image_id}", force=True)
        with contextlib.suppress(NotFound):
            volume = self.client.volumes.get(IMAGE_PREFIX + image_id)
            if self._owned(volume):
                volume.remove(force=True)

    def run_command(self, instance_id: str, script: str, timeout: float) -> CommandResult:
        """`sh -c script` as root; past `timeout` it is killed and exits TIMEOUT_EXIT (124)."""
        container = self._container(instance_id)
        if container.status != "running":
            raise HostError(f"{instance_id} is not running ({container.status}): Cloud Assistant needs a running one")
        seconds = str(max(1, math.ceil(timeout)))
        # One pipe for stdout and stderr (2>&1), so the output keeps the order it was written in; timeout(1)
        # signals the script's whole process group, so background jobs cannot hold the exec open either.
        command = ["timeout", "-k", "2", seconds, "sh", "-c", 'exec sh -c "$1" 2>&1', "sh", script]
        result = container.exec_run(command, user="root", workdir="/root", environment={"HOME": "/root"})
        return CommandResult(exit_code=result.exit_code, output=(result.output or b"").decode("utf-8", "replace"))

    def console_output(self, instance_id: str) -> str:
        logs = self._container(instance_id).logs(stdout=True, stderr=True)
        return logs[-CONSOLE_BYTES:].decode("utf-8", "replace")

    def close(self) -> None:
        mine = {"label": f"{self.label}={self.owner}"}
        for container in self.client.containers.list(all=True, filters=mine):
            with contextlib.suppress(NotFound):
                container.remove(force=True, v=True)
        for image in self.client.images.list(filters=mine):
            with contextlib.suppress(NotFound):
                self.client.images.remove(image.id, force=True)
        for volume in self.client.volumes.list(filters=mine):
            with contextlib.suppress(NotFound):
                volume.remove(force=True)

    # -- the pieces --------------------------------------------------------------------------------

    def _labels(self, **extra: str) -> dict[str, str]:
        return {self.label: self.owner, **{f"{self.label}.{key}": value for key, value in extra.items()}}

    def _owned(self, obj) -> bool:
        labels = obj.labels if hasattr(obj, "labels") else obj.attrs.get("Labels") or {}
        return (labels or {}).get(self.label) == self.owner

    @staticmethod
    def _exists(collection, name: str) -> bool:
        try:
            collection.get(name)
        except NotFound:
            return False
        return True

    def _host_image(self) -> str:
        with self._image_lock:
            if self._image is None:
                self._image = ensure_host_image(self.client)
            return self._image

    def _snapshot(self, image_id: str) -> str | None:
        """The committed image of a snapshot() named image_id, or None (a public image: empty disk)."""
        if not _ID.match(image_id):
            return None
        try:
            image = self.client.images.get(f"{SNAPSHOT_REPO}:{image_id}")
            volume = self.client.volumes.get(IMAGE_PREFIX + image_id)
        except NotFound:
            return None
        return f"{SNAPSHOT_REPO}:{image_id}" if self._owned(image) and self._owned(volume) else None

    def _daemon_json(self) -> bytes:
        config = {"insecure-registries": self.insecure_registries, "shutdown-timeout": INNER_SHUTDOWN_TIMEOUT}
        return json.dumps(config, indent=2).encode() + b"\n"

    def _create_container(self, instance_id: str, image: str, disk: str):
        return self.client.containers.create(
            image, name=NAME_PREFIX + instance_id, hostname=instance_id,
            environment={"NGCX_INSTANCE_ID": instance_id,
                         "NGCX_METADATA_ROUTES": " ".join(f"{a}={t}" for a, t in self.metadata_routes.items())},
            labels=self._labels(instance=instance_id),
            cap_add=_DOCKERD_CAPS, security_opt=_DOCKERD_SECURITY, mem_limit=self.memory,
            volumes={disk: {"bind": "/var/lib/docker", "mode": "rw"},
                     "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"}},
            network="bridge",
            log_config={"type": "json-file", "config": {"max-size": "1m", "max-file": "2"}})

    def _container(self, instance_id: str):
        try:
            container = self.client.containers.get(NAME_PREFIX + instance_id)
        except NotFound:
            container = None
        if container is None or not self._owned(container):
            raise HostError(f"no machine for instance {instance_id}")
        return container

    def _ip(self, container, wait: float = 10.0) -> str:
        """The machine's address on the default bridge (assigned at start; it may change on restart)."""
        deadline = time.monotonic() + wait
        while True:
            container.reload()
            settings = container.attrs["NetworkSettings"]
            ip = (settings.get("Networks", {}).get("bridge") or {}).get("IPAddress") or settings.get("IPAddress")
            if ip:
                return ip
            if container.status not in ("created", "running") or time.monotonic() > deadline:
                tail = container.logs(tail=15).decode("utf-8", "replace")
                raise HostError(f"{container.name} has no address ({container.status}); console:\n{tail}")
            time.sleep(0.1)

    def _copy_volume(self, source: str, target: str) -> None:
        """cp -a in a throwaway container; SYS_ADMIN so overlay2's trusted.* xattrs (opaque dirs) survive."""
        try:
            self.client.containers.run(
                self._host_image(), entrypoint=["cp", "-a", "/from/.", "/to/"], network_mode="none",
                volumes={source: {"bind": "/from", "mode": "ro"}, target: {"bind": "/to", "mode": "rw"}},
                cap_add=["SYS_ADMIN"], labels=self._labels(), remove=True)
        except ContainerError as exc:
            stderr = (exc.stderr or b"").decode("utf-8", "replace")[-800:]
            raise HostError(f"copying disk {source} to {target} failed: {stderr}") from exc

    def _discard(self, instance_id: str) -> None:
        """Remove the machine and its disk if they are ours; a missing one is already gone."""
        with contextlib.suppress(NotFound):
            container = self.client.containers.get(NAME_PREFIX + instance_id)
            if self._owned(container):
                container.remove(force=True, v=True)
        for attempt in range(20):
            try:
                volume = self.client.volumes.get(DISK_PREFIX + instance_id)
                if self._owned(volume):
                    volume.remove(force=True)
                return
            except NotFound:
                return
            except APIError:  # "volume is in use" while the engine finishes removing the container
                if attempt == 19:
                    raise
                time.sleep(0.25)


class RegistryRelay:
    """A TCP relay from the bridge's gateway to the host's loopback registry: the VMs' "VPC endpoint".

    The registry listens on 127.0.0.1, which a machine's own network namespace cannot reach; the
    relay listens on the gateway address (docker0, reachable from every machine) and copies bytes
    both ways, one thread per direction. Memory stays bounded: each direction holds at most one
    RELAY_CHUNK, and a slow reader blocks the writer (sendall), so back-pressure reaches the sender.
    Counts what it carried, so a test can see that a restarted machine did not pull again.
    """

    def __init__(self, target: str = LOOPBACK_REGISTRY, listen_host: str | None = None,
                 listen_port: int = 0) -> None:
        host, _, port = target.rpartition(":")
        self._target = (host, int(port))
        if listen_host is None:
            import docker

            with contextlib.closing(docker.from_env()) as client:
                listen_host = bridge_gateway(client)
        self._server = socket.create_server((listen_host, listen_port), backlog=64)
        self._server.settimeout(0.25)
        self.address = f"{listen_host}:{self._server.getsockname()[1]}"
        self.connections = 0
        self.bytes_from_target = 0
        self.bytes_to_target = 0
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._closed = threading.Event()
        self._acceptor = threading.Thread(target=self._accept_loop, name=f"relay {self.address}", daemon=True)
        self._acceptor.start()

    def __enter__(self) -> RegistryRelay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting, cut every open connection, and wait for the threads (idempotent)."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._acceptor.join(5)
        self._server.close()
        with self._lock:
            sockets, threads = list(self._open), list(self._threads)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(5)

    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(self._target, timeout=10)
            except OSError:
                client.close()  # the VM sees a reset, as from an endpoint with nothing behind it
                continue
            upstream.settimeout(None)
            client.settimeout(None)
            with self._lock:
                self.connections += 1
                self._open.update((client, upstream))
                self._threads = [t for t in self._threads if t.is_alive()]
            self._start_pair(client, upstream)

    def _start_pair(self, client: socket.socket, upstream: socket.socket) -> None:
        done = threading.Barrier(2, action=lambda: self._forget(client, upstream))
        for src, dst, counter in ((client, upstream, "bytes_to_target"), (upstream, client, "bytes_from_target")):
            thread = threading.Thread(target=self._pump, args=(src, dst, counter, done), daemon=True)
            with self._lock:
                self._threads.append(thread)
            thread.start()

    def _pump(self, src: socket.socket, dst: socket.socket, counter: str, done: threading.Barrier) -> None:
        how = socket.SHUT_WR  # a clean EOF is passed on as a half-close: HTTP clients may wait for it
        try:
            while data := src.recv(RELAY_CHUNK):
                dst.sendall(data)
                with self._lock:
                    setattr(self, counter, getattr(self, counter) + len(data))
        except OSError:
            how = socket.SHUT_RDWR  # a reset or a cut: end both directions, or the other pump waits forever
        finally:
            for sock in (dst, src) if how == socket.SHUT_RDWR else (dst,):
                with contextlib.suppress(OSError):
                    sock.shutdown(how)
            with contextlib.suppress(threading.BrokenBarrierError):
                done.wait()

    def _forget(self, *sockets: socket.socket) -> None:
        with self._lock:
            for sock in sockets:
                self._open.discard(sock)
                sock.close()
