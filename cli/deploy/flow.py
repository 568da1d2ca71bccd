"""One deploy, walked through a target's verbs and the state store, with per-phase seconds.

Why apart from the targets: the rules that must hold for every cloud live here once — intent is
recorded before the first write call; every transition is written; a deploy that fails or is
interrupted (Ctrl-C) tears down what it created and says why in its record; a deploy returns only
when /v2/health/ready answers through the printed endpoint, and ends with where the seconds went.
"""

from __future__ import annotations

import sys
import time
from types import ModuleType
from typing import Any

from ..core.errors import UserError
from . import store, target
from .common import FAILED, READY, STOPPED, DeployConfig, DeployRecord, NoCapacity, NotReady

POLL_S = 0.1          # readiness poll interval: a local deploy's whole budget is ~3 s
FAILURE_CHECK_S = 2.0  # default: how often a target is asked whether the container died (a cloud API call)


def deploy(config: DeployConfig, service_key: str | None = None) -> DeployRecord:
    """Reads first (credentials, image, offers), then intent, then the target's write calls.

    The endpoint's key is made once the record exists (keys.py: a 0600 file named by the record's id)
    and before any host hears of it; the host gets its hash. A service's replica (service.py) takes its
    service's key instead (`service_key`: one key opens the balancer's URL whichever replica answers).
    Ready means /v2/health/ready answers AND the endpoint takes the key and refuses a call without it
    (access.check), over TLS pinned to the certificate the host made (security.pin)."""
    from dataclasses import replace

    from . import keys, security

    module = target(config.cloud)
    plan = module.prepare(config)
    security.prune()
    record = store.create_intent(config)
    key = service_key or (keys.create(record.id) if config.auth else None)
    if key:
        config = replace(config, key_hashes=(keys.digest(key),))
    try:
        record = module.run(config, record, plan)
        ready_s = wait_ready(module, record, config.ready_timeout)
        security.secure(module, store.get(record.id), key)
    except BaseException as exc:
        _fail(module, store.get(record.id), plan, exc)
        keys.forget(record.id)
        raise
    return store.update(record.id, status=READY, phases=_phases(module, store.get(record.id), ready_s), pid=None)


def _phases(module: ModuleType, record: DeployRecord, ready_s: float) -> dict[str, float]:
    """A target that knows when the host pulled and started splits the wait; else it all counts as ready."""
    if hasattr(module, "report_phases"):
        return module.report_phases(record, time.time())
    return dict(record.phases, ready=round(ready_s, 3))


def deploy_any(config: DeployConfig, clouds: list[str]) -> DeployRecord:
    """`--cloud any`: the clouds in the order of their best candidate (offers.merged_order), the next one
    when a cloud has no capacity for any fitting type; each attempt is a record of its own."""
    from dataclasses import replace

    from . import offers

    order = offers.merged_order(choices_across(config, clouds))
    misses = []
    for name in order:
        try:
            return deploy(replace(config, cloud=name))
        except NoCapacity as exc:
            misses.append(exc.message)
            print(f"ngcx: {name}: {exc.message}; trying the next cloud", file=sys.stderr)
    raise NoCapacity(f"no cloud had capacity: {' | '.join(misses) or 'no candidate in any cloud'}",
                     hint="try other --gpu / --max-price, or later")


def choices_across(config: DeployConfig, clouds: list[str]) -> list[Any]:
    """Each cloud's ranked choice; a cloud whose table lacks the --gpu model is left out, not an error,
    unless no cloud has it (then that cloud's one-line error, naming the models it knows, stands)."""
    from dataclasses import replace

    choices, errors = [], []
    for name in clouds:
        try:
            choices.append(target(name).choose(replace(config, cloud=name)))
        except UserError as exc:
            errors.append(exc)
    if not choices and errors:
        raise errors[0]
    return choices


def _fail(module: ModuleType, record: DeployRecord, plan: Any, exc: BaseException) -> None:
    """Tear down what this deploy created and keep the reason in its record."""
    why = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else reason(exc)
    try:
        detail = module.cleanup_failed(record, plan) or ""
    except Exception as cleanup_exc:  # the record must still say what happened
        detail = f"cleanup failed: {reason(cleanup_exc)}; run `ngcx deployments gc`"
    store.update(record.id, status=FAILED, pid=None, detail=f"{why}{'; ' + detail if detail else ''}")


def reason(exc: BaseException) -> str:
    return exc.line() if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"


def wait_ready(module: ModuleType, record: DeployRecord, timeout: float) -> float:
    """Poll the endpoint's /v2/health/ready (the server answers it after load and warm-up). A record with no
    endpoint has no host to ask: that is said at once, never polled for `timeout` (stop 40's CI waited 900 s on
    "deployment 13 at None", a host the cloud had deleted while it booted)."""
    from ..project.client import Client

    if not record.endpoint:
        raise NotReady(f"deployment {record.id} has no address to check ({record.status}): its host never came up",
                       hint=f"the record keeps it: ngcx deployments show {record.id}")
    client = Client(record.endpoint, timeout=5.0)
    start = last_check = time.monotonic()
    try:
        while time.monotonic() - start < timeout:
            if client.ready():
                return time.monotonic() - start
            if time.monotonic() - last_check >= getattr(module, "FAILURE_CHECK_S", FAILURE_CHECK_S):
                last_check = time.monotonic()
                why = module.container_failure(record)
                if why:
                    raise NotReady(f"deployment {record.id}: {why}",
                                   hint=f"the record keeps it: ngcx deployments show {record.id}")
            time.sleep(POLL_S)
    finally:
        client.close()
    tail = _last_lines(module, record)
    raise NotReady(f"deployment {record.id} at {record.endpoint} was not ready after {timeout:.0f} s"
                   f"{'; last log lines: ' + tail if tail else ''}",
                   hint="a large image or model may need --ready-timeout")


def _last_lines(module: ModuleType, record: DeployRecord, n: int = 8) -> str:
    try:
        text = module.logs(record, n)
    except Exception:  # logs are a courtesy here; the timeout is the error
        return ""
    return " | ".join(line.strip() for line in text.splitlines() if line.strip())[-600:]


def start(record: DeployRecord, timeout: float) -> DeployRecord:
    """Start a stopped deployment again (host and container) and wait until it is ready."""
    module = target(record.cloud)
    t0 = time.monotonic()
    record = module.start(record)              # the start call and the wait until the host runs again
    started_s = time.monotonic() - t0
    ready_s = wait_ready(module, record, timeout)
    # this start's own seconds, not the original deploy's: the container comes back by itself (no pull)
    phases = {"api": 0.0, "boot": round(started_s, 3), "pull": 0.0, "start": 0.0, "ready": round(ready_s, 3)}
    return store.update(record.id, status=READY, phases=phases, pid=None)


def stop(record: DeployRecord) -> DeployRecord:
    module = target(record.cloud)
    record = module.stop(record)
    return store.update(record.id, status=STOPPED, pid=None)


def clouds_with_credentials() -> list[str]:
    """The clouds `--cloud any` may use: those whose credentials are configured (no API call made)."""
    from . import CLOUDS

    usable = [name for name in CLOUDS if target(name).has_credentials()]
    if not usable:
        raise UserError("--cloud any: no cloud has credentials here",
                        hint="set ALIBABA_CLOUD_ACCESS_KEY_* or AWS credentials (a profile or AWS_ACCESS_KEY_ID)")
    return usable
