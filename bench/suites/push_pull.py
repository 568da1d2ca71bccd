"""Pulls into an empty engine: a fresh machine of tests/emulators (its own dockerd, its own empty disk)
pulls from the suite's registry through a RegistryRelay, as a cloud VM pulls through its VPC endpoint.

Why these machines: the host's engine already holds every layer of the image, so a pull there
measures nothing. A DockerHosts machine is Debian's docker.io 20.10 (what ngcx's hosts run) on a
docker volume of its own, reached only through the relay, which counts the bytes it carries. Its
dockerd also runs a containerd (1.6, the same package), which pulls with `ctr`: the engine that
Kubernetes nodes and Docker Engine's containerd image store pull with.

Times are taken inside the machine (date before and after the pull), so they hold the pull only,
not the exec round trip.
"""

from __future__ import annotations

import contextlib
import io
import re
import secrets
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

from ..core import ROOT

LABEL = "ngcx-bench-push"          # DockerHosts' label: this suite's machines only, never the tests'
CONTAINERD = "/run/docker/containerd/containerd.sock"   # the containerd dockerd 20.10 starts for itself
CTR_NAMESPACE = "ngcx-bench"
PULL_TIMEOUT = 900
MARK = re.compile(r"^ngcx-bench: rc=(\d+) s=([\d.]+) e=([\d.]+)$", re.M)


def _emulators():
    if str(ROOT / "tests") not in sys.path:
        sys.path.insert(0, str(ROOT / "tests"))
    from emulators import docker_hosts

    return docker_hosts


@dataclass
class Pull:
    """One pull: seconds inside the machine, bytes the relay carried from the registry, and the
    engine's own error line when it failed (a finding, not a crash)."""

    seconds: float
    relay_bytes: int
    ok: bool
    error: str = ""
    output: str = ""
    cpu: float | None = None       # CPU seconds of the whole machine (dockerd, containerd, unpigz) over the pull


def timed_script(command: str) -> str:
    """A shell script that runs command and prints its exit code and start/end times, then its output's tail."""
    return (f"s=$(date +%s.%N); {command} >/tmp/ngcx-bench-pull.log 2>&1; rc=$?; e=$(date +%s.%N); "
            'echo "ngcx-bench: rc=$rc s=$s e=$e"; tail -n 6 /tmp/ngcx-bench-pull.log')


def parse_timed(output: str) -> tuple[int, float, str]:
    """(exit code, seconds, the command's output tail) from what timed_script printed."""
    found = MARK.search(output)
    if found is None:
        raise RuntimeError(f"no timing line in the machine's output: {output[-400:]}")
    tail = output[found.end():].strip()
    return int(found.group(1)), float(found.group(3)) - float(found.group(2)), tail


def error_line(tail: str) -> str:
    """The line of a failed pull's output that says why (the engine's own words)."""
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    for line in reversed(lines):
        if re.search(r"error|unsupported|unknown|invalid|failed", line, re.I):
            return line
    return lines[-1] if lines else "(no output)"


class PullSite:
    """A relay to one registry and a DockerHosts backend whose machines trust it (insecure http);
    close() removes every machine, disk and relay it made, also after a failure or Ctrl-C."""

    def __init__(self, registry: str) -> None:
        import docker

        hosts_mod = _emulators()
        self.client = docker.from_env()
        self.relay = hosts_mod.RegistryRelay(registry, listen_host=hosts_mod.bridge_gateway(self.client))
        self.hosts = hosts_mod.DockerHosts(self.client, insecure_registries=[self.relay.address], label=LABEL)
        self.count = 0

    def __enter__(self) -> PullSite:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        try:
            self.hosts.close()
        finally:
            self.relay.close()
            self.client.close()

    def machine(self, boot_timeout: float = 120.0) -> Machine:
        """A new machine with an empty disk, once its dockerd answers."""
        self.count += 1
        instance = f"bench-push-{self.hosts.owner}-{self.count}-{secrets.token_hex(2)}"
        self.hosts.create(instance, "empty-disk", b"")
        machine = Machine(self, instance)
        deadline = time.monotonic() + boot_timeout
        while machine.run("docker info >/dev/null 2>&1", 10).exit_code != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"machine {instance}: dockerd did not answer within {boot_timeout:.0f} s: "
                                   f"{self.hosts.console_output(instance)[-600:]}")
            time.sleep(0.5)
        return machine


@dataclass
class Machine:
    site: PullSite
    instance: str

    def run(self, script: str, timeout: float):
        return self.site.hosts.run_command(self.instance, script, timeout)

    def ref(self, repository: str, tag: str) -> str:
        return f"{self.site.relay.address}/{repository}:{tag}"

    def docker_pull(self, repository: str, tag: str) -> Pull:
        return self._timed(f"docker pull {self.ref(repository, tag)}")

    def ctr_pull(self, repository: str, tag: str) -> Pull:
        """Pull and unpack (overlayfs snapshots) with containerd's own client, into a namespace of its own."""
        return self._timed(f"ctr --address {CONTAINERD} --namespace {CTR_NAMESPACE} images pull --plain-http "
                           f"{self.ref(repository, tag)}")

    def has(self, program: str) -> bool:
        return self.run(f"command -v {program} >/dev/null", 10).exit_code == 0

    def versions(self) -> dict[str, str]:
        out = self.run("docker version --format '{{.Server.Version}}'; ctr --address "
                       f"{CONTAINERD} version | sed -n 's/^ *Version: *//p' | tail -n 1", 20).output.split()
        return {"dockerd": out[0] if out else "?", "containerd": out[1] if len(out) > 1 else "?"}

    def add_unpigz(self, pigz: Path = Path("/usr/bin/pigz")) -> None:
        """Put the host's pigz binary on the machine's PATH as unpigz (what Debian's pigz package
        installs; docker.io recommends it). dockerd looks for unpigz at every layer it unpacks."""
        buf = io.BytesIO()
        data = pigz.read_bytes()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo("unpigz")
            info.size, info.mode, info.mtime = len(data), 0o755, int(time.time())
            tar.addfile(info, io.BytesIO(data))
        container = self.site.client.containers.get(_emulators().NAME_PREFIX + self.instance)
        container.put_archive("/usr/local/bin", buf.getvalue())

    def discard(self) -> None:
        """Remove the machine and its disk now: a pulled CUDA image is 2 GB on this shared disk."""
        self.site.hosts.delete(self.instance)

    def cpu_seconds(self) -> float | None:
        """CPU the machine's cgroup has used (its dockerd, containerd and what they run are all nested
        in it); None where the cgroup cannot be read."""
        cid = self.site.client.containers.get(_emulators().NAME_PREFIX + self.instance).id
        for path, scale in ((f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage", 1e-9),
                            (f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/cpu.stat", 1e-6),
                            (f"/sys/fs/cgroup/docker/{cid}/cpu.stat", 1e-6)):
            with contextlib.suppress(OSError, ValueError, IndexError):
                text = Path(path).read_text()
                if path.endswith("cpu.stat"):  # cgroup v2: "usage_usec N" on the first line
                    return int(text.split()[1]) * scale
                return int(text) * scale
        return None

    def _timed(self, command: str) -> Pull:
        before, cpu0 = self.site.relay.bytes_from_target, self.cpu_seconds()
        done = self.run(timed_script(command), PULL_TIMEOUT)
        carried, cpu1 = self.site.relay.bytes_from_target - before, self.cpu_seconds()
        code, seconds, tail = parse_timed(done.output)
        cpu = round(cpu1 - cpu0, 3) if cpu0 is not None and cpu1 is not None else None
        return Pull(seconds=round(seconds, 3), relay_bytes=carried, ok=code == 0,
                    error="" if code == 0 else error_line(tail), output=tail[-600:], cpu=cpu)
