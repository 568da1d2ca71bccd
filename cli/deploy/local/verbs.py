"""The workstation target: this host's Docker engine, all GPUs when the host has them.

Why a target like the clouds: `ngcx deploy --cloud local` is the fastest path there is (the host is
running and the image is present, cold-start.md §7 column A), and it must behave like a cloud
deploy — a record, a URL, per-phase seconds, stop/start/destroy/logs/gc — so users learn one flow.
A workstation cannot stop or start its host: stop and start act on the container only.
Deploying the same image again swaps the container and keeps the previous URL (its port).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ...core.errors import UserError
from .. import store
from ..common import (
    IN_FLIGHT,
    LABEL_OWNER,
    PATH_LOCAL,
    REPLACED,
    SERVE_PORT,
    STARTING,
    Capabilities,
    DeployConfig,
    DeployRecord,
    HostStatus,
)

CAPABILITIES = Capabilities(stop_start_host=False, choose_instance=False, bake=False, list_orphans=True)
FAILURE_CHECK_S = 0.0   # asking the local engine whether the container died costs nothing
LABEL_DEPLOYMENT = "ai.ngcx.deployment"
PLAN_CACHE_IN_IMAGE = "/var/cache/ngcx/plans"
AUTH_IN_IMAGE = "/run/ngcx/auth"     # the folder of the key hashes file, mounted read-only


@dataclass
class Plan:
    client: Any
    gpu: bool
    why_no_gpu: str
    image_id: str = ""      # the image the gate checked: the container starts from this id, not the tag


def prepare(config: DeployConfig) -> Plan:
    """The engine answers, the image is here, and the GPU decision is made (driver checked)."""
    from ...core.engine import engine_client, image_or_none
    from ...workstation.host import check_driver, host_gpus, host_has_gpu
    from .. import gate

    client = engine_client()
    image = image_or_none(client, config.image)
    if image is None:
        raise UserError(f"image {config.image} is not on this host", hint="build it first (`ngcx build`)")
    gate.check_local(config, image.id, list(image.attrs.get("RepoDigests") or []))
    has_gpu, why = host_has_gpu()
    if config.gpu_mode == "require" and not has_gpu:
        raise UserError(f"--gpu-mode require, but this host cannot give containers a GPU: {why}",
                        hint="use --gpu-mode auto to serve on the CPU here")
    use_gpu = has_gpu and config.gpu_mode != "off"
    if use_gpu:
        driver, gpus = host_gpus()
        check_driver(config.labels, None, driver, gpus)
    return Plan(client, use_gpu, why, image.id)


def run(config: DeployConfig, record: DeployRecord, plan: Plan) -> DeployRecord:
    """Swap out a previous deployment of the same image (keeping its port), start the container."""
    from ...project.serving import free_port, plan_cache_dir
    from .. import keys

    lone = config.service_id is None       # a service's replicas are rolled by service.py, never swapped here
    port = config.port or (lone and _swap_previous(plan.client, config.image, record.id)) or free_port()
    kwargs: dict[str, Any] = {}
    if plan.gpu:
        kwargs["device_requests"] = [_gpus(config)]
    volumes = {str(plan_cache_dir()): {"bind": PLAN_CACHE_IN_IMAGE, "mode": "rw"}}
    environment = dict(config.env)
    if config.key_hashes:   # the container reads only the keys' hashes, from a folder (a rewrite is seen)
        folder = keys.write_local_hashes(record.id, keys.digests_text(record.id, config.key_hashes))
        volumes[str(folder)] = {"bind": AUTH_IN_IMAGE, "mode": "ro"}
        environment["NGCX_RUNTIME_AUTH_KEYS"] = f"{AUTH_IN_IMAGE}/keys"
    t0 = time.monotonic()
    try:
        container = plan.client.containers.run(
            plan.image_id or config.image, config.cmd or None, detach=True, name=container_name(record.id),
            ports={f"{SERVE_PORT}/tcp": ("127.0.0.1", port)}, environment=environment, volumes=volumes,
            labels={LABEL_DEPLOYMENT: str(record.id), LABEL_OWNER: store.owner_id()}, **kwargs)
    except Exception as exc:
        raise UserError(f"the engine could not start {config.image}: {_one_line(exc)}",
                        hint="is the port free? pass --port, or check `docker ps`") from None
    started = time.monotonic() - t0
    phases = {"api": 0.0, "boot": 0.0, "pull": 0.0, "start": round(started, 3)}
    return store.update(record.id, status=STARTING, container=container.id, host="127.0.0.1",
                        endpoint=f"http://127.0.0.1:{port}", path=PATH_LOCAL, phases=phases,
                        detail=None if plan.gpu else f"CPU only: {plan.why_no_gpu or 'GPU use turned off'}")


def _gpus(config: DeployConfig) -> Any:
    """Every GPU for a lone deploy; one GPU per replica of a service, round-robin, where the host has several."""
    from docker.types import DeviceRequest

    from ...workstation.host import host_gpus

    gpus = host_gpus()[1] if config.service_id is not None else []
    if len(gpus) > 1:
        return DeviceRequest(device_ids=[str(config.replica % len(gpus))], capabilities=[["gpu"]])
    return DeviceRequest(count=-1, capabilities=[["gpu"]])


def balancer(config: DeployConfig | None = None) -> Any:
    """A service's balancer here: haproxy in a container on the service's own network (balancer.py); the
    config (which the clouds need for the region) changes nothing on one engine."""
    from .balancer import LocalBalancer

    return LocalBalancer()


def member(record: DeployRecord) -> tuple[str, int]:
    """What the balancer registers for a replica: its container's name (the balancer's health() keys by it; it is
    reached at its address on the service network) and port."""
    return (container_name(record.id) if record.container else ""), SERVE_PORT


def service_spec(name: str, zones: tuple[str, ...], tags: dict[str, str], options: Any,
                 config: DeployConfig) -> Any:
    """Plain HTTP on 127.0.0.1, as a local deploy serves (balancer.py's docstring)."""
    from ..balancer import BalancerSpec

    return BalancerSpec(name=name, zones=zones, tags=tags, port=options.port or 0, protocol="HTTP",
                        target_port=SERVE_PORT, target_protocol="HTTP", health_interval_s=options.health_interval_s,
                        healthy_threshold=options.healthy_threshold, unhealthy_threshold=options.unhealthy_threshold,
                        drain_s=options.drain_s)


def container_name(record_id: int) -> str:
    return f"ngcx-deploy-{store.owner_id()[:8]}-{record_id}"


def install_key_hashes(record: DeployRecord, hashes_text: str) -> None:
    """Rewrite the hashes the container accepts (it re-reads the file: no restart)."""
    from .. import keys

    keys.write_local_hashes(record.id, hashes_text)


def certificate(record: DeployRecord) -> tuple[str, str]:
    """Local deploys answer on 127.0.0.1 over plain HTTP: there is no certificate to pin."""
    raise UserError(f"deployment {record.id} serves plain HTTP on 127.0.0.1: it has no TLS certificate")


def _swap_previous(client: Any, image: str, new_id: int) -> int | None:
    """Remove the containers of earlier live local deployments of `image`; the port they used."""
    port = None
    for old in store.records(cloud="local"):
        if old.id == new_id or old.image != image or old.service_id is not None:
            continue
        _remove(client, old.container)
        store.update(old.id, status=REPLACED, pid=None, detail=f"replaced by deployment {new_id}")
        if old.endpoint and port is None:
            port = urlsplit(old.endpoint).port
    return port


def _remove(client: Any, container_id: str | None) -> None:
    from docker.errors import APIError, NotFound

    if not container_id:
        return
    with contextlib.suppress(NotFound, APIError):
        client.containers.get(container_id).remove(force=True)


def _container(record: DeployRecord) -> Any:
    from docker.errors import NotFound

    from ...core.engine import engine_client

    if not record.container:
        raise UserError(f"deployment {record.id} has no container", hint="deploy again")
    try:
        return engine_client().containers.get(record.container)
    except NotFound:
        raise UserError(f"deployment {record.id}'s container is gone from this engine",
                        hint=f"remove the record with `ngcx deployments destroy {record.id}`") from None


def container_failure(record: DeployRecord) -> str | None:
    """Why the container stopped before it was ready (exit code and last lines), or None."""
    container = _container(record)
    container.reload()
    if container.status not in ("exited", "dead"):
        return None
    code = container.attrs.get("State", {}).get("ExitCode")
    tail = " | ".join(line for line in logs(record, 6).splitlines() if line.strip())
    return f"the container exited with code {code} before it was ready: {tail[-500:]}"


def cleanup_failed(record: DeployRecord, plan: Plan) -> str:
    _remove(plan.client, record.container)
    return "container removed" if record.container else ""


def query(record: DeployRecord) -> HostStatus:
    from docker.errors import NotFound

    from ...core.engine import engine_client

    try:
        container = engine_client().containers.get(record.container or "")
    except NotFound:
        return HostStatus("gone")
    state = {"running": "running", "created": "pending", "restarting": "starting"}.get(container.status, "stopped")
    return HostStatus(state, "127.0.0.1")


def start(record: DeployRecord) -> DeployRecord:
    _container(record).start()
    return store.update(record.id, status=STARTING, pid=None)


def stop(record: DeployRecord) -> DeployRecord:
    _container(record).stop(timeout=10)   # SIGTERM: the server drains in-flight requests
    return record


def terminate(record: DeployRecord) -> DeployRecord:
    """Remove the container; one whose id never reached the record (an ngcx killed right after `docker run`) is
    found by its name, which only this record's id makes."""
    from ...core.engine import engine_client

    _remove(engine_client(), record.container or container_name(record.id))
    return store.mark_destroyed(record.id)


def logs(record: DeployRecord, tail: int = 50) -> str:
    return _container(record).logs(tail=tail).decode(errors="replace")


def orphans() -> list[dict[str, str]]:
    """Containers labelled by ngcx deploy (this state store's) that no live record owns."""
    from ...core.engine import containers, engine_client

    live = store.records(cloud="local")
    owned = {r.container for r in live if r.container}
    busy = {str(r.id) for r in live if r.status in IN_FLIGHT}   # a deploy between `docker run` and its record
    mine = store.owner_id()
    found = []
    for container in containers(engine_client(), {"label": LABEL_DEPLOYMENT}):
        if (container.id in owned or container.labels.get(LABEL_OWNER) != mine
                or container.labels.get(LABEL_DEPLOYMENT) in busy):
            continue
        found.append({"id": container.id[:12], "name": container.name, "status": container.status,
                      "deployment": container.labels.get(LABEL_DEPLOYMENT, "")})
    return found


def delete_orphan(item: dict[str, str]) -> None:
    from ...core.engine import engine_client

    _remove(engine_client(), item["id"])


def _one_line(exc: Exception) -> str:
    text = getattr(exc, "explanation", None) or str(exc)
    return str(text).splitlines()[0][:300] if text else type(exc).__name__
