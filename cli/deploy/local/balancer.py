"""A service's balancer on the workstation: haproxy in a container in front of local replicas (issue 21).

Why: `ngcx deploy --cloud local --replicas N` must behave like a cloud service (one URL, health checks,
drain on deregistration), so the services flow drives this class through balancer.py's contract as it
drives the clouds' ALBs. Why haproxy in a container: nothing to install on the workstation, and it is
the same Debian haproxy 2.6 as the emulators' data plane (tests/emulators/balancer_plane.py), whose
runtime-API lessons this module keeps (Linux engines: the admin socket is shared through a bind mount).

What it makes, all named from spec.name (`ngcx-svc-<service>`; the prefix is added when missing):
- the image ngcx/balancer:<recipe hash> (recipes/deploy/balancer/Dockerfile.j2), built on first use FROM
  ngcx/base:bookworm with the catalog builds' apt mirror, CA secret and proxy variables; a changed recipe
  or base gets a new tag;
- the user-defined bridge network NAME: each replica container joins it and is a server at its IP there,
  in plain HTTP as local deploys serve (spec.protocol, certificate_id and target_protocol do not apply);
- the container NAME-lb (labels: spec.tags, ngcx's owner label, the check settings; restart
  unless-stopped) publishing its frontend, plain HTTP, on 127.0.0.1 only: at spec.port when that port
  is free there (0: any free port), else at a free port. BalancerRef.dns_name is `127.0.0.1:PORT`, host
  and port, as a local URL needs both; balancer_id is the container's name, group_id the network's;
- the folder <state dir>/balancers/NAME (0700) mounted into it: haproxy.cfg, state.json and the admin
  socket (mode 600, the caller's uid/gid), never a TCP port.

Replicas change through the runtime API only, never by a reload (a reload closes idle keep-alive client
connections). register adds a server at weight 0, forces it down, then gives it its weight: it gets
requests only after `healthy_threshold` passing checks ("initial" until then). deregister sets it
draining (no new request; in-flight ones finish) and notes its deadline (drain_s) in state.json; no
cloud keeps that timer here, so every later call on the balancer sweeps: a draining server with no
connection left, or past its deadline (its sessions are then shut), is deleted and its container leaves
the network. haproxy.cfg is rewritten after each change with the registered, non-draining servers by
container name, so a restarted container (engine restart) comes back with them, checked at once.
ensure with other check settings replaces the container (same port, same servers); an existing one
keeps the image it was made with. A replica restarted with a new IP is registered again (the server moves).

Calls on one balancer take a lock on its folder (several ngcx at once keep state.json whole).
Waits, each bounded: the image build (BUILD_TIMEOUT_S), haproxy answering on its socket after a start
(READY_S), one socket command (COMMAND_TIMEOUT_S). register and deregister return at once, as a cloud's
do: health() says when a replica is in and when a drained one is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from ...core.engine import containers
from ...core.errors import UserError
from .. import store
from ..balancer import BalancerRef, BalancerSpec
from ..common import LABEL_OWNER

BASE_IMAGE = "ngcx/base:bookworm"
IMAGE_REPO = "ngcx/balancer"
FOLDER_IN_CONTAINER = "/run/ngcx-balancer"
FRONT_PORT = 8080                        # inside the container; published on 127.0.0.1
BACKEND = "replicas"
LABEL_BALANCER = "ai.ngcx.balancer"      # its value: the network (service) name
LABEL_CHECKS = "ai.ngcx.balancer.checks"  # JSON: health path, interval, thresholds, drain
BUILD_TIMEOUT_S = 600
READY_S = 20.0
COMMAND_TIMEOUT_S = 5.0
WEIGHT = 100
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,60}")
HEALTH_PATH_RE = re.compile(r"/[A-Za-z0-9._~/?&=%+:@!$,;*-]*")
# haproxy runs as the container's root with only what its admin socket needs in the caller's 0700
# folder: write there (DAC_OVERRIDE), give the socket to the caller (CHOWN), then chmod it (FOWNER).
SOCKET_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER"]
PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
ADMIN_MAINT = 0x01 | 0x02 | 0x04 | 0x20  # `show servers state` srv_admin_state bits
ADMIN_DRAIN = 0x08 | 0x10
GOOD_CHECKS = ("", "INI", "L4OK", "L6OK", "L7OK", "L7OKC")


def network_name(spec_name: str) -> str:
    name = spec_name if spec_name.startswith("ngcx-svc-") else f"ngcx-svc-{spec_name}"
    if not NAME_RE.fullmatch(name):
        raise UserError(f"service name {spec_name!r} cannot name a Docker network",
                        hint="use letters, digits, '.', '_' and '-', at most 60 characters")
    return name


def folder_of(network: str) -> Path:
    from ...core import paths

    return paths.state_dir() / "balancers" / network


def checks_of(spec: BalancerSpec) -> dict[str, Any]:
    """The spec's check and drain settings, checked: they are written into haproxy.cfg."""
    if not HEALTH_PATH_RE.fullmatch(spec.health_path):
        raise UserError(f"health path {spec.health_path!r} is not a plain URL path",
                        hint="start it with / and use no spaces or quotes")
    if min(spec.health_interval_s, spec.healthy_threshold, spec.unhealthy_threshold) < 1 or spec.drain_s < 0:
        raise UserError(f"balancer {spec.name}: the check interval and thresholds must be >= 1, the drain >= 0")
    return {"path": spec.health_path, "interval_s": spec.health_interval_s, "rise": spec.healthy_threshold,
            "fall": spec.unhealthy_threshold, "drain_s": spec.drain_s}


def render(template: str, **values: Any) -> str:
    import jinja2

    from ...core import paths

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(paths.recipes_dir())), autoescape=False,
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True, trim_blocks=True)
    return env.get_template(f"deploy/balancer/{template}").render(**values)


def check_words(checks: dict[str, Any]) -> str:
    return f"check inter {checks['interval_s'] * 1000} rise {checks['rise']} fall {checks['fall']}"


def _one_line(exc: Exception) -> str:
    text = str(getattr(exc, "explanation", None) or exc)
    return text.splitlines()[0][:200] if text else type(exc).__name__


class _Admin:
    """One balancer's folder: the admin socket, state.json (servers, drain deadlines) and haproxy.cfg."""

    def __init__(self, network: str, checks: dict[str, Any]) -> None:
        self.network, self.checks, self.folder = network, checks, folder_of(network)
        path = self.folder / "state.json"
        self.state: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.exists() else {}
        self.state.setdefault("servers", {})
        self.state.setdefault("drains", {})

    def run(self, command: str) -> str:
        """One command on haproxy's admin socket, reached as /proc/self/fd/N/admin.sock: a state dir's
        path may be longer than the 107 bytes an AF_UNIX address holds."""
        fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(COMMAND_TIMEOUT_S)
                s.connect(f"/proc/self/fd/{fd}/admin.sock")
                s.sendall(command.encode() + b"\n")
                chunks = []
                while chunk := s.recv(65536):
                    chunks.append(chunk)
        finally:
            os.close(fd)
        return b"".join(chunks).decode(errors="replace")

    def quiet(self, *commands: str) -> None:
        for command in commands:
            answer = self.run(command).strip()
            if answer:
                raise UserError(f"balancer {self.network}: haproxy answered {answer[:200]!r} to {command!r}")

    def rows(self) -> dict[str, dict[str, str]]:
        """Each server haproxy has: its `show servers state` row merged with its `show stat` row."""
        admin = {r["srv_name"]: r for r in _table(self.run(f"show servers state {BACKEND}"), " ")}
        for row in _table(self.run(f"show stat {BACKEND} 4 -1"), ","):
            admin.get(row.get("svname", ""), {}).update(row)
        return admin

    def save(self) -> None:
        """state.json, then haproxy.cfg with the registered, non-draining servers (read at restarts only)."""
        _write(self.folder / "state.json", json.dumps(self.state, indent=1))
        servers = [{"name": name, "host": s["container"], "port": s["port"]}
                   for name, s in sorted(self.state["servers"].items()) if name not in self.state["drains"]]
        _write(self.folder / "haproxy.cfg", render(
            "haproxy.cfg.j2", name=self.network, folder=FOLDER_IN_CONTAINER, uid=os.getuid(), gid=os.getgid(),
            drain_s=max(1, int(self.checks["drain_s"])), front_port=FRONT_PORT, backend=BACKEND,
            health_path=self.checks["path"], check_timeout_ms=min(self.checks["interval_s"] * 1000, 5000),
            check=check_words(self.checks), servers=servers))

    def admit(self, name: str, ip: str, port: int) -> None:
        """Serve `name` at ip:port once its checks pass: weight 0 and forced down first, so no request
        slips in before `rise` good checks (a server leaving maintenance is up before any check)."""
        ref = f"{BACKEND}/{name}"
        row = self.rows().get(name)
        if row is None:
            answer = self.run(f"add server {ref} {ip}:{port} weight 0 {check_words(self.checks)}")
            if "New server registered" not in answer:
                raise UserError(f"balancer {self.network}: add server {ip}:{port}: {answer.strip()[:200]}")
            self.quiet(f"enable health {ref}", f"enable server {ref}", f"set server {ref} health down")
        elif (row["srv_addr"], row["srv_port"]) != (ip, str(port)):
            self.quiet(f"set server {ref} weight 0", f"set server {ref} state maint")
            self.run(f"set server {ref} addr {ip} port {port}")
            self.quiet(f"set server {ref} state ready", f"set server {ref} health down")
        elif int(row["srv_admin_state"]) & (ADMIN_MAINT | ADMIN_DRAIN):
            self.quiet(f"set server {ref} state ready")
        self.quiet(f"set server {ref} weight {WEIGHT}")

    def sweep(self, client: Any) -> None:
        """Delete each draining server with no connection left or past its deadline (sessions shut)."""
        rows, drains = self.rows(), self.state["drains"]
        for name, deadline in list(drains.items()):
            row = rows.get(name)
            busy = int((row or {}).get("scur") or 0)
            if row is not None and busy and time.time() < deadline:
                continue
            if row is not None:
                ref = f"{BACKEND}/{name}"
                self.run(f"set server {ref} state maint")
                if busy:
                    self.run(f"shutdown sessions server {ref}")
                if "Server deleted" not in self.run(f"del server {ref}"):
                    continue               # a connection still closing: the next call retries
            self._forget(client, name)

    def _forget(self, client: Any, name: str) -> None:
        from docker.errors import APIError, NotFound

        self.state["drains"].pop(name, None)
        gone = self.state["servers"].pop(name, {})
        if gone and not any(s["container"] == gone["container"] for s in self.state["servers"].values()):
            with contextlib.suppress(NotFound, APIError):
                client.networks.get(self.network).disconnect(gone["container"], force=True)
        self.save()

    def wait_ready(self, container: Any) -> None:
        """Until haproxy answers on its socket (READY_S): a config it refuses ends the wait with its log."""
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if "Pid: " in self.run("show info"):
                    return
            container.reload()
            if container.status in ("exited", "dead"):
                break
            time.sleep(0.05)
        tail = " | ".join(container.logs(tail=5).decode(errors="replace").splitlines())
        raise UserError(f"balancer {self.network}'s haproxy did not answer in {READY_S:.0f} s: {tail[-400:]}",
                        hint=f"see `docker logs {container.name}`")


def _table(text: str, sep: str) -> list[dict[str, str]]:
    """Rows of `show stat` (CSV, '# ' header) or `show servers state` (version line, '# ' header)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    header = next((ln for ln in lines if ln.startswith("#")), None)
    if header is None:
        return []
    columns = header.lstrip("# ").split(sep)
    return [dict(zip(columns, ln.split(sep), strict=False)) for ln in lines if not ln.startswith("#") and sep in ln]


def _state(row: dict[str, str], checks: dict[str, Any]) -> str:
    """haproxy's view of one server as one of balancer.HEALTH_STATES (as the emulators' plane reads it):
    "initial" while it was never up since it was added (chkdown 1: the forced `health down`) and its
    checks pass or have failed for less than `fall` intervals."""
    admin = int(row.get("srv_admin_state") or 0)
    if admin & ADMIN_MAINT:
        return "unused"
    if admin & ADMIN_DRAIN:
        return "draining"
    if row.get("status", "").startswith(("UP", "DRAIN")):   # DRAIN without the admin bit: up at weight 0
        return "healthy"
    failed = row.get("check_status", "").lstrip("* ") not in GOOD_CHECKS
    failing_long = int(row.get("lastchg") or 0) >= checks["fall"] * checks["interval_s"]
    never_up = int(row.get("chkdown") or 0) <= 1
    return "initial" if never_up and not (failed and failing_long) else "unhealthy"


def _names(server: dict[str, Any], instance_id: str) -> bool:
    """`instance_id` names the server's container: its name, its id or an id prefix of 12 or more."""
    return instance_id == server["container"] or (len(instance_id) >= 12 and server["id"].startswith(instance_id))


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _free_port(port: int) -> int:
    """`port` when it can be bound on 127.0.0.1 (or only root may: dockerd binds it), else a free one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except PermissionError:
            return port
        except OSError:
            s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalBalancer:
    """balancer.Balancer on this machine's Docker engine; see the module docstring."""

    def __init__(self, client: Any = None, apt_mirror: str | None = None) -> None:
        self._client, self.apt_mirror = client, apt_mirror

    @property
    def client(self) -> Any:
        if self._client is None:
            from ...core.engine import engine_client

            self._client = engine_client()
        return self._client

    # --- the contract ----------------------------------------------------------------------------
    def ensure(self, spec: BalancerSpec) -> BalancerRef:
        """Find the balancer by name (this owner's), else make the image, network and container; returns
        once haproxy answers on its socket. A stopped one is started."""
        network, checks = network_name(spec.name), checks_of(spec)
        container = self._find(f"{network}-lb")
        port = spec.port
        stale = not (folder_of(network) / "haproxy.cfg").exists()        # its state folder was removed
        if container is not None and (stale or json.loads(container.labels.get(LABEL_CHECKS, "{}")) != checks):
            port = int(self._ref(container).dns_name.rsplit(":", 1)[1])
            container.remove(force=True)     # checks are no runtime setting: a new haproxy, same servers
            container = None
        if container is None:
            image = self.image()
            self._network(network, spec.tags)
            container = self._create(spec, network, image, port)
        elif container.status != "running":
            container.start()
        with self._admin(self._ref(container)):
            pass
        return self._ref(container)

    def register(self, ref: BalancerRef, instance_id: str, port: int) -> None:
        """Serve the container `instance_id` (name or id) at its IP on the service network and `port`, once its
        checks pass; idempotent (a draining one is taken back)."""
        with self._admin(ref) as admin:
            replica = self._replica(instance_id)
            ip = self._attach(replica, ref.group_id)
            name = f"{replica.name}:{port}"
            admin.state["drains"].pop(name, None)
            admin.state["servers"][name] = {"container": replica.name, "id": replica.id, "port": port}
            admin.admit(name, ip, port)
            admin.save()

    def deregister(self, ref: BalancerRef, instance_id: str, port: int) -> None:
        """Start draining; a later call deletes the server and disconnects the container (module docstring)."""
        with self._admin(ref) as admin:
            name = next((n for n, s in admin.state["servers"].items() if s["port"] == port and _names(s, instance_id)),
                        None)
            if name is None or name in admin.state["drains"]:
                return
            if name in admin.rows():
                admin.quiet(f"set server {BACKEND}/{name} state drain")
            admin.state["drains"][name] = time.time() + admin.checks["drain_s"]
            admin.save()

    def health(self, ref: BalancerRef) -> dict[str, str]:
        """Container name -> one of balancer.HEALTH_STATES, from haproxy's `show stat` / `show servers state`."""
        with self._admin(ref) as admin:
            rows, out = admin.rows(), {}
            for name, server in admin.state["servers"].items():
                row = rows.get(name)
                state = "draining" if name in admin.state["drains"] else _state(row, admin.checks) if row else "unused"
                out[server["container"]] = state
            return out

    def set_weights(self, ref: BalancerRef, weights: Sequence[tuple[str, int, int]]) -> None:
        """haproxy's `set server BACKEND/NAME weight W` on each named member (canary releases): 0..100 as the
        contract's, inside haproxy's 0..256; roundrobin is dynamic, so the next request already follows it. A
        member not registered here, or draining, is left as it is (a rollback names members already gone)."""
        with self._admin(ref) as admin:
            rows = admin.rows()
            for instance, port, weight in weights:
                name = next((n for n, s in admin.state["servers"].items() if s["port"] == port and _names(s, instance)),
                            None)
                if name is None or name in admin.state["drains"] or name not in rows:
                    continue
                admin.quiet(f"set server {BACKEND}/{name} weight {max(0, min(WEIGHT, int(weight)))}")

    def delete(self, ref: BalancerRef) -> None:
        from docker.errors import APIError, NotFound

        """The container, the network (replicas disconnected first) and the folder; what is gone is done."""
        container = self._find(ref.balancer_id)
        if container is not None:
            container.remove(force=True)
        try:
            net = self.client.networks.get(ref.group_id)
            self._owned(net.attrs.get("Labels") or {}, ref.group_id)
            for attached in containers(self.client, {"network": net.id}):   # stopped too
                with contextlib.suppress(NotFound, APIError):
                    net.disconnect(attached, force=True)
            net.remove()
        except NotFound:
            pass
        shutil.rmtree(folder_of(ref.group_id), ignore_errors=True)

    def tagged(self, tags: dict[str, str]) -> list[BalancerRef]:
        """Every balancer container on this engine carrying these labels (gc), stopped ones too."""
        wanted = [LABEL_BALANCER, *(f"{k}={v}" for k, v in tags.items())]
        return [self._ref(c) for c in containers(self.client, {"label": wanted})]

    # --- the image -------------------------------------------------------------------------------
    def image(self) -> str:
        """ngcx/balancer:<hash of the rendered recipe and the base's id>, built when missing."""
        from ...core.engine import image_or_none

        base = image_or_none(self.client, BASE_IMAGE)
        if base is None:
            raise UserError(f"the service balancer's image builds FROM {BASE_IMAGE}, which is not on this engine",
                            hint="make it with `ngcx base bootstrap --suite bookworm`")
        dockerfile = render("Dockerfile.j2", base_image=BASE_IMAGE, folder=FOLDER_IN_CONTAINER)
        tag = f"{IMAGE_REPO}:{hashlib.sha256((dockerfile + base.id).encode()).hexdigest()[:12]}"
        if image_or_none(self.client, tag) is None:
            self._build(tag, dockerfile)
        return tag

    def _build(self, tag: str, dockerfile: str) -> None:
        """BuildKit through the docker CLI, as `ngcx build`: the CA as a secret, proxies from the environment
        (passed by name, never by value), the apt mirror as a build arg."""
        from ...build.image import detect_ca
        from ...core.engine import docker_cli
        from ...core.output import redact

        cli = docker_cli()
        if cli is None:
            raise UserError("the docker CLI is not installed (the balancer image builds with it)",
                            hint="apt-get install docker.io, or run scripts/setup.sh")
        ca = detect_ca(None)
        with tempfile.TemporaryDirectory(prefix="ngcx-balancer-") as context:
            (Path(context) / "Dockerfile").write_text(dockerfile)
            cmd = [cli, "build", "--progress=plain", "-t", tag]
            cmd += [arg for var in PROXY_VARS if os.environ.get(var) for arg in ("--build-arg", var)]
            if self.apt_mirror:
                cmd += ["--build-arg", f"APT_MIRROR={self.apt_mirror.rstrip('/')}"]
            if ca:
                cmd += ["--secret", f"id=ca,src={ca}"]
            try:
                proc = subprocess.run([*cmd, context], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                                      env={**os.environ, "DOCKER_BUILDKIT": "1"})
            except subprocess.TimeoutExpired:
                raise UserError(f"building {tag} took over {BUILD_TIMEOUT_S} s",
                                hint="check the apt mirror and proxy (http_proxy/https_proxy)") from None
        if proc.returncode != 0:
            tail = " | ".join(line for line in proc.stderr.splitlines()[-4:] if line.strip())
            raise UserError(f"building the balancer image {tag} failed: {redact(tail)[-400:]}",
                            hint="check the apt mirror and proxy (http_proxy/https_proxy), or its CA (SSL_CERT_FILE)")

    # --- engine objects --------------------------------------------------------------------------
    def _owned(self, labels: dict[str, str], name: str) -> None:
        if labels.get(LABEL_OWNER) != store.owner_id():
            raise UserError(f"{name} on this engine belongs to another ngcx state store",
                            hint="use another service name, or that store's ngcx")

    def _find(self, name: str) -> Any:
        from docker.errors import NotFound

        try:
            container = self.client.containers.get(name)
        except NotFound:
            return None
        self._owned(container.labels, name)
        return container

    def _network(self, name: str, tags: dict[str, str]) -> Any:
        from docker.errors import APIError, NotFound

        try:
            net = self.client.networks.get(name)
        except NotFound:
            try:
                return self.client.networks.create(name, driver="bridge", check_duplicate=True,
                                                   labels={**tags, LABEL_OWNER: store.owner_id()})
            except APIError:
                net = self.client.networks.get(name)       # made by a concurrent ensure
        self._owned(net.attrs.get("Labels") or {}, name)
        return net

    def _create(self, spec: BalancerSpec, network: str, image: str, port: int) -> Any:
        """The haproxy container on a fresh config (the servers state.json keeps); another free port when
        the chosen one was taken between the check and the start."""
        from docker.errors import APIError

        name = f"{network}-lb"
        folder = folder_of(network)
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(folder, 0o700)
        _Admin(network, checks_of(spec)).save()
        labels = {**spec.tags, LABEL_OWNER: store.owner_id(), LABEL_BALANCER: network,
                  LABEL_CHECKS: json.dumps(checks_of(spec))}
        for attempt in range(2):
            host_port = _free_port(port if attempt == 0 else 0)
            try:
                return self.client.containers.run(
                    image, name=name, detach=True, network=network, labels=labels,
                    ports={f"{FRONT_PORT}/tcp": ("127.0.0.1", host_port)},
                    volumes={str(folder): {"bind": FOLDER_IN_CONTAINER, "mode": "rw"}},
                    restart_policy={"Name": "unless-stopped"}, security_opt=["no-new-privileges"],
                    cap_drop=["ALL"], cap_add=SOCKET_CAPS)
            except APIError as exc:
                found = self._find(name)
                if getattr(exc, "status_code", None) == 409 and found is not None:
                    return found                                  # a concurrent ensure made it
                if found is not None:
                    found.remove(force=True)
                if attempt or "port" not in str(exc).lower():
                    raise UserError(f"the engine could not start balancer {name}: {_one_line(exc)}",
                                    hint="check `docker ps` and `docker logs`") from None
        raise AssertionError("unreachable")

    def _ref(self, container: Any) -> BalancerRef:
        bindings = container.attrs["HostConfig"]["PortBindings"][f"{FRONT_PORT}/tcp"]
        network = container.labels[LABEL_BALANCER]
        return BalancerRef(container.name, network, BACKEND, f"127.0.0.1:{bindings[0]['HostPort']}")

    @contextlib.contextmanager
    def _admin(self, ref: BalancerRef) -> Iterator[_Admin]:
        """The balancer's admin, under its folder's lock, its haproxy running and swept first."""
        container = self._find(ref.balancer_id)
        if container is None:
            raise UserError(f"balancer {ref.balancer_id} is not on this engine", hint="ensure it again")
        if container.status != "running":
            container.start()
        checks = json.loads(container.labels[LABEL_CHECKS])
        folder = folder_of(ref.group_id)
        if not (folder / "haproxy.cfg").exists():
            raise UserError(f"balancer {ref.balancer_id}'s folder {folder} is gone", hint="ensure it again")
        with open(folder / "lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            admin = _Admin(ref.group_id, checks)
            admin.wait_ready(container)
            admin.sweep(self.client)
            yield admin

    def _replica(self, instance_id: str) -> Any:
        from docker.errors import NotFound

        try:
            return self.client.containers.get(instance_id)
        except NotFound:
            raise UserError(f"replica container {instance_id} is not on this engine",
                            hint="check `docker ps`") from None

    def _attach(self, replica: Any, network: str) -> str:
        """Connect the replica to the service network when it is not yet; its IP there."""
        replica.reload()
        if replica.status != "running":
            raise UserError(f"replica container {replica.name} is {replica.status}", hint="start it first")
        if network not in replica.attrs["NetworkSettings"]["Networks"]:
            self.client.networks.get(network).connect(replica)
            replica.reload()
        ip = replica.attrs["NetworkSettings"]["Networks"].get(network, {}).get("IPAddress")
        if not ip:
            raise UserError(f"replica container {replica.name} has no address on {network}", hint="check `docker ps`")
        return str(ip)
