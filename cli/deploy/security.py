"""A deployment's endpoint security after the host is up: pin its certificate, prove the key is needed,
rotate the key without downtime.

Why its own module: flow.py walks a deploy through the targets' verbs; what "secure" means is one
rule for every target and is checked here once. A deploy is not ready until (1) an https endpoint's
certificate, read through the cloud's command channel, is pinned (core/tls.py), and (2) the
endpoint answers a call with the deployment's key and refuses the same call without it. (2) also
catches an image whose ngcx-runtime predates endpoint keys: it would ignore the hashes file and
answer anyone, so such a deploy fails with the fix instead of serving an open endpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from types import ModuleType

from ..core.errors import UserError
from . import keys, store, target
from .common import LIVE, READY, DeployRecord, NotReady

PROBE = "/v2"                 # server metadata: the cheapest call that needs the key
INDEX = "/v2/repository/index"  # the names the server serves (runtime/routes.py), as a caller must spell them
ROTATION_WAIT_S = 30.0        # ngcx-runtime re-reads its keys file within 0.25 s; a cloud's command channel is slower


def prune() -> None:
    """Forget the key files of deployments that are gone (destroyed, replaced, failed).

    The files are listed before the records are read: a deploy writes its record before its key files
    (flow.py), so a file listed here belongs to a record the read below sees while it lives. The other
    order deleted the mounted hashes of a replica that a concurrent roll created between the two reads,
    and its container could not read its keys file (CI, tests/e2e/test_service_local.py)."""
    kept = keys.kept()
    live = {r.id for r in store.records()}
    for deployment in kept - live:
        keys.forget(deployment)


def pin_of(record: DeployRecord) -> str | None:
    return record.spec.get("tls_sha256")


def secure(module: ModuleType, record: DeployRecord, key: str | None) -> DeployRecord:
    """Pin an https endpoint's certificate; then require that the key opens it and nothing else does."""
    from ..core.tls import pem_fingerprint

    if (record.endpoint or "").startswith("https://"):
        pem, pubkey = module.certificate(record)
        try:
            pin = pem_fingerprint(pem)
        except ValueError:
            raise UserError(f"deployment {record.id}: the host's TLS certificate could not be read") from None
        keys.save_certificate(record.id, pem)
        record = store.update(record.id, spec=dict(record.spec, tls_sha256=pin, tls_pubkey_sha256=pubkey))
    if key:
        check(record, key)
    served = served_models(record.endpoint or "", key, pin_of(record))
    if served:
        record = store.update(record.id, spec=dict(record.spec, served=served))
        gpus = serving_gpus(record.endpoint or "", key, pin_of(record), served)
        if gpus is not None:
            record = store.update(record.id, spec=dict(record.spec, serving_gpus=gpus))
    return record


def served_models(endpoint: str, key: str | None, pin: str | None = None, verify: bool = False) -> list[str]:
    """The model names the endpoint serves, from its repository index; [] when it does not say.

    Why ask the server: the name a caller puts in /v2/models/NAME is the runtime's `--name` (a project's
    model.name, else its name: project/spec.py model_name), or whatever a custom command gives; the
    image's ai.ngcx.project.name label is the project's name, and printing it made a call that failed
    (issue 46: `unknown model 'onnx-zero-code'; this server serves 'convnet'`). A deploy is ready only once
    its model is (flow.wait_ready), so the index lists it by then."""
    import http.client
    import json

    from ..project.client import Client

    client = Client(endpoint, timeout=10.0, key=key, pin=pin, verify=verify)
    try:
        status, _, body = client._request("POST", INDEX, b'{"ready": true}', {"Content-Type": "application/json"})
        rows = json.loads(body) if status == 200 else []
    except (OSError, ValueError, http.client.HTTPException):
        return []          # the line falls back to the label's name: a courtesy, never a reason to fail a deploy
    finally:
        client.close()
    return sorted({str(row["name"]) for row in rows if isinstance(row, dict) and row.get("name")})


def call_name(served: list[str] | None, fallback: str | None) -> str:
    """The NAME of the printed call: the one model the server serves, else the fallback, else NAME."""
    return served[0] if served and len(served) == 1 else (fallback or "NAME")


def _status(record: DeployRecord, key: str | None, with_key: bool = True) -> int:
    """The status of GET /v2 with (or without) the key, over the pinned connection."""
    from ..core.tls import PinMismatch
    from ..project.client import Client

    client = Client(record.endpoint or "", timeout=10.0, key=key, pin=pin_of(record))
    try:
        return client.status("GET", PROBE, with_key=with_key)
    except PinMismatch as exc:
        raise UserError(f"deployment {record.id}: {exc.args[0]}",
                        hint="the host was replaced or someone is in between; do not send it the key") from None
    except OSError as exc:
        raise UserError(f"deployment {record.id} at {record.endpoint} did not answer: {exc}") from None
    finally:
        client.close()


def check(record: DeployRecord, key: str) -> None:
    """The endpoint takes the key (200) and refuses a keyless call (401), or NotReady says which failed."""
    with_key = _status(record, key)
    if with_key != 200:
        raise NotReady(f"deployment {record.id}: the endpoint refused the deployment's own key (HTTP {with_key})",
                       hint=f"see `ngcx deployments logs {record.id}`")
    without = _status(record, key, with_key=False)
    if without != 401:
        raise NotReady(f"deployment {record.id}: the endpoint answers a call without the key (HTTP {without}); "
                       "its image's ngcx-runtime predates endpoint keys",
                       hint="rebuild the image with this ngcx (`ngcx build`), push it, and deploy again")


def rotate(record: DeployRecord, grace: float = 0.0, say: Callable[[str], None] = print) -> None:
    """Replace the key with no failed request: the host accepts old and new, the new one is seen to work and
    becomes the deployment's key (`ngcx deployments key` prints it from then on), the old one stays accepted
    for `grace` seconds while clients switch, then it is dropped. An interrupted rotation (ID.next left
    behind) resumes with the same new key; one killed during the grace leaves both accepted until the next."""
    if record.status != READY:
        raise UserError(f"deployment {record.id} is {record.status}; keys rotate on a ready deployment",
                        hint=f"start it first: ngcx deployments start {record.id}")
    rotate_key(record.id, f"deployment {record.id}", [record], grace, say)


def rotate_key(name: int | str, what: str, records: list[DeployRecord], grace: float,
               say: Callable[[str], None]) -> None:
    """rotate()'s steps for the key `name` (keys.py) that every one of `records` accepts: a deployment's own,
    or a service's (s<ID>), whose replicas all take the new key before it becomes the key."""
    old = keys.get(name)
    if old is None:
        raise UserError(f"{what} has no key (deployed with --no-auth)", hint="deploy again without --no-auth")
    new = keys.begin_rotation(name)
    for record in records:
        target(record.cloud).install_key_hashes(record, keys.hashes_text(name, [old, new]))
    late = _until(records, new, 200)
    if late is not None:
        raise UserError(f"{what} did not accept its new key within {ROTATION_WAIT_S:.0f} s; the old key "
                        "still works", hint=f"run `ngcx deployments rotate-key {name}` again")
    keys.finish_rotation(name)
    if grace > 0:
        say(f"the new key is in place; the old one is accepted for {grace:.0f} s more while clients switch")
        time.sleep(grace)
    for record in records:
        target(record.cloud).install_key_hashes(record, keys.hashes_text(name, [new]))
    late = _until(records, old, 401)
    if late is not None:
        raise UserError(f"{what}: deployment {late.id} still accepts the old key {ROTATION_WAIT_S:.0f} s after it "
                        "was dropped; the new key is the key and works", hint=f"run `ngcx deployments rotate-key "
                        f"{name}` again, or `ngcx deployments logs {late.id}` to see why its keys file is not read")


def _until(records: list[DeployRecord], key: str, status: int) -> DeployRecord | None:
    """Ask every record's endpoint with `key` until it answers `status`; the first one that did not within
    ROTATION_WAIT_S (None: all did). Why wait for the 401 as for the 200: a host's ngcx-runtime re-reads its
    keys file on a request at most every 0.25 s (runtime/keys.py CHECK_INTERVAL_S), so the old key still
    worked for a moment after the hashes were written (a CI run: the service answered it right after
    `rotate-key --grace 0` returned). The command returns once no endpoint takes a dropped key."""
    deadline = time.monotonic() + ROTATION_WAIT_S
    for record in records:
        while _status(record, key) != status:
            if time.monotonic() > deadline:
                return record
            time.sleep(0.1)
    return None


def key_of(record: DeployRecord) -> str:
    """The deployment's key, or one line saying why there is none."""
    if record.status not in LIVE:
        raise UserError(f"deployment {record.id} is {record.status}: its key was deleted with it")
    key = keys.get(record.id)
    if key is None:
        raise UserError(f"deployment {record.id} has no key here",
                        hint="it was deployed with --no-auth, or from another machine's ngcx state")
    return key


def how_to_call(record: DeployRecord, show_key: bool = False) -> list[str]:
    """The lines that say how to call a deployment: its key (once, on a terminal) and a curl that pins TLS.

    The key is printed only when asked (`show_key`: the deploy's own terminal), never into a log that
    a CI job or a pipe keeps; `ngcx deployments key ID` prints it on demand."""
    key = keys.get(record.id)
    lines = []
    if key and show_key:
        lines.append(f"key (shown once; `ngcx deployments key {record.id}` prints it again): {key}")
    auth = f'-H "Authorization: Bearer $(ngcx deployments key {record.id})" ' if key else ""
    pubkey = record.spec.get("tls_pubkey_sha256")
    # -k skips the CA chain (no CA signed the host's own certificate); --pinnedpubkey still refuses any
    # other key before a byte is sent, so the bearer key reaches only this host
    tls = f"-k --pinnedpubkey sha256//{pubkey} " if pubkey else ""
    name = call_name(record.spec.get("served"), record.model)
    lines.append(f"call it: curl {tls}{auth}{record.endpoint}/v2/models/{name}")
    if not key:
        lines.append("no endpoint key (--no-auth): anyone who reaches the port may call every API")
    return lines


def serving_gpus(endpoint: str, key: str | None, pin: str | None, served: list[str]) -> int | None:
    """How many GPUs the served models' instances run on, from each model's config (its Triton instance_group:
    ngcx-runtime serve places an instance on every GPU the container sees, runtime/placement.py); 0 when they
    run on the CPU, None when no config says. Why ask: `docker run --gpus all` on a 4-GPU host served on one
    GPU before issue 50, and only the server knows where its instances went."""
    import json

    from ..project.client import Client

    client = Client(endpoint, timeout=10.0, key=key, pin=pin)
    gpus: set[int] = set()
    said = False
    try:
        for name in served[:16]:
            status, body = client.get(f"/v2/models/{name}/config")
            groups = json.loads(body).get("instance_group") if status == 200 else None
            if not isinstance(groups, list):
                continue
            said = True
            for group in groups:
                if isinstance(group, dict) and group.get("kind") == "KIND_GPU":
                    gpus.update(g for g in group.get("gpus") or [] if isinstance(g, int))
    except (OSError, ValueError, AttributeError):
        return None        # a courtesy for the ready line, never a reason to fail a deploy
    finally:
        client.close()
    return len(gpus) if said else None


def gpus_line(record: DeployRecord) -> str | None:
    """'4 GPUs serve (all 4 of the g5.12xlarge)' for the deploy's ready line and `deployments show`; None when
    the deploy did not learn it (an older record, or a server that does not say)."""
    n = record.spec.get("serving_gpus")
    if not isinstance(n, int):
        return None
    has = _instance_gpus(record)
    itype = record.instance_type
    if n == 0:
        return f"serving on the CPU (the {itype} has {has} GPUs)" if has else "serving on the CPU"
    text = f"{n} GPU{'s' if n != 1 else ''} serve{'s' if n == 1 else ''}"
    if has and has > 1:
        text += f" (all {has} of the {itype})" if n >= has else f" (the {itype} has {has})"
    return text


def _instance_gpus(record: DeployRecord) -> int | None:
    """The GPU count of the record's instance type in its cloud's offers table; None when not known."""
    if not record.instance_type or record.cloud in ("local", "kubernetes"):
        return None
    from . import offers

    try:
        types, _ = offers.load_table(record.cloud)
    except (UserError, OSError, ValueError):
        return None
    return next((t.gpu_count for t in types if t.name == record.instance_type), None)
