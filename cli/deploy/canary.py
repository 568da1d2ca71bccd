"""Canary releases of a fixed-replica service, judged on the replicas' own metrics (issue 49, part 2).

`ngcx deploy NEW --service sN --canary 10` brings up the new version's replicas beside the old ones (as a rolling
update does: service.py), gives them 10 % of the balancer's requests through its weights (balancer.py
`set_weights`), reads both versions' requests, errors and p99 from their /metrics over a window (slo.py), and
then either shifts the next step (default 10 -> 50 -> 100 %) or rolls back by itself. 100 % is the promotion: the
old replicas get weight 0 and drain out, as at the end of a rolling update, and the new ones are the service.
A rollback gives the old replicas all the weight again before the canary drains out; the old replicas are never
restarted, re-registered or drained, so they fail no request the canary did not take.

Why these defaults (`Policy`), each one a user would accept without reading this:
- max error rate 1 %: "two nines of successful requests" is the loosest SLO an inference API is sold with, and
  Flagger's and Argo Rollouts' documented examples gate on a 99 % success rate;
- max p99 1000 ms: past a second an interactive client has usually timed out; the real latency guard is the
  baseline's own p99 (below), since an absolute default cannot know the model;
- p99 at most 2.5x the old version's (plus 1 ms for the histogram's coarse low buckets, runtime/batching.py's
  REQUEST_BUCKETS_US), judged at 95 % confidence like the error rate (_slow_for_sure): a 3x p99 fails (issue
  49's example of a wrong version), noise between two identical replicas does not: on CI's 2-core machine a good
  canary (the same model) reached 2.3x and then 2.9x the old version's p99 over a 15 s step from its warm-in
  (44.5 vs 19.2 ms, 55.7 vs 19.1 ms, 2026-11-29), so 2x rolled good versions back; p99 is read from a warm-in
  (WARM_IN_S) into each step, errors from its start;
- window 60 s and at least 100 canary requests: one error is then 1 %, the resolution a 1 % limit needs; a
  window with fewer is extended (MAX_EXTENSIONS times), then the canary is rolled back, never promoted blind;
- an early failure needs 95 %-confidence (Wilson's lower bound of the canary's error rate above the limit, over
  at least a quarter of the minimum), so a bad canary leaves within seconds while one unlucky error does not.

The canary's relative checks (against the old version's figures over the same window) apply only when the old
version saw enough requests itself. Every step's judgement (requests, errors, p99 of canary and baseline, the
reasons) is printed, written to the service's row (config["canary"], see ServiceRecord.canary) as it happens,
and shown by `ngcx deployments show` and the dashboard's service page. An interrupted canary leaves the row's
config at the old version: `ngcx deployments reconcile` then replaces the canary replicas (another version than
the row's), which is a rollback: it gives them weight 0 first, evens the weights out once they are gone, and marks
the report rolled back (service.py's _canary_interrupted; a kill -9 leaves `outcome: running` until then).
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..core.errors import UserError
from . import flow, keys, service, slo, store, target
from .common import READY, SVC_UPDATING, DeployConfig, DeployRecord, NotReady, ServiceRecord

Say = Callable[[str], None]
PASS, FAIL, WAIT = "pass", "fail", "wait"
DEFAULT_STEPS = (10, 50, 100)
MAX_EXTENSIONS = 3            # a window without enough traffic is extended this many times, then rolled back
POLL_S = 1.0                  # how often the replicas' /metrics are read inside a window
P99_SLACK_MS = 1.0
EARLY_Z = 1.96                # Wilson's bound at 95 % for an early failure
SCRAPE_TIMEOUT_S = 5.0
# p99 is read from this far into a step (at most a quarter of the window), because a new replica's first
# requests at a share can be slow for reasons that pass (batch sizes it has not run yet, cold caches): in CI on
# 2026-11-29 a good canary, the same model under another name, had a p99 of 88.5 ms over a 15 s window counted
# from its first request, 4.6x the warm old version's 19.4 ms, with 0 errors, and was rolled back. Requests and
# errors still count from the step's start, so a failing canary is caught as early as before.
WARM_IN_S = 5.0


@dataclass(frozen=True)
class Policy:
    """The SLO a canary must keep and how it is watched (module docstring: why these defaults)."""

    steps: tuple[int, ...] = DEFAULT_STEPS
    max_error_rate: float = 0.01
    max_p99_ms: float = 1000.0
    window_s: float = 60.0
    min_requests: int = 100
    p99_factor: float = 2.5


@dataclass(frozen=True)
class Verdict:
    outcome: str                          # PASS, FAIL or WAIT (not enough seen yet)
    reasons: tuple[str, ...] = ()


@dataclass
class Step:
    """One step as the row keeps it: its share, how long it was watched, its verdict and the figures."""

    percent: int
    outcome: str = WAIT
    seconds: float = 0.0
    reasons: list[str] = field(default_factory=list)
    canary: dict[str, Any] = field(default_factory=dict)
    baseline: dict[str, Any] = field(default_factory=dict)


def steps_of(first: int, steps: tuple[int, ...] = DEFAULT_STEPS) -> tuple[int, ...]:
    """`--canary PCT` -> the steps: PCT, then the default steps above it, ending at 100 (the promotion)."""
    if not 1 <= first <= 99:
        raise UserError(f"--canary {first}: the canary's first share of requests is a percentage from 1 to 99",
                        hint="e.g. --canary 10")
    return (first, *(s for s in steps if s > first))


def check(policy: Policy) -> None:
    """The flags, checked before anything is made (one line each)."""
    if not 0 <= policy.max_error_rate < 1:
        raise UserError(f"--max-error-rate {policy.max_error_rate}: a fraction of requests, from 0 to below 1",
                        hint="e.g. 0.01 for 1 %")
    if policy.max_p99_ms <= 0:
        raise UserError(f"--max-p99-ms {policy.max_p99_ms}: milliseconds above 0", hint="e.g. 500")
    if not 1 <= policy.window_s <= 3600:
        raise UserError(f"--canary-window {policy.window_s}: seconds from 1 to 3600", hint="e.g. 60")


# --- the judge (pure) ------------------------------------------------------------------------------------
def wilson_low(errors: int, requests: int, z: float = EARLY_Z) -> float:
    """Wilson score interval's lower bound of an error rate: the rate the canary is at least, at that confidence."""
    if requests <= 0:
        return 0.0
    p = errors / requests
    centre = p + z * z / (2 * requests)
    margin = z * math.sqrt(p * (1 - p) / requests + z * z / (4 * requests * requests))
    return max(0.0, (centre - margin) / (1 + z * z / requests))


def judge(canary: slo.Figures, baseline: slo.Figures, policy: Policy, final: bool) -> Verdict:
    """The canary's figures over a window against the SLO and against the old version's over the same window.
    Not `final` (the window runs on): FAIL only on 95 %-confident evidence, else WAIT. `final`: PASS, FAIL, or
    WAIT when too few requests reached the canary to judge it."""
    pct = f"{100 * canary.error_rate:.1f} %"
    evidence = canary.requests >= policy.min_requests / 4
    if evidence and wilson_low(canary.errors, canary.requests) > policy.max_error_rate:
        return Verdict(FAIL, (f"error rate {pct} ({canary.errors} of {canary.requests}) is above the "
                              f"{100 * policy.max_error_rate:g} % limit at 95 % confidence",))
    if canary.requests < policy.min_requests:
        return Verdict(WAIT, (f"too little traffic to judge: {canary.requests} canary request(s), "
                              f"{policy.min_requests} needed",))
    if not final:
        return Verdict(WAIT)
    reasons = _breaches(canary, baseline, policy)
    return Verdict(FAIL, tuple(reasons)) if reasons else Verdict(PASS, (_summary(canary, baseline),))


def _breaches(canary: slo.Figures, baseline: slo.Figures, policy: Policy) -> list[str]:
    reasons = []
    rate, base_rate = canary.error_rate, baseline.error_rate
    if rate > policy.max_error_rate:
        reasons.append(f"error rate {100 * rate:.2f} % ({canary.errors} of {canary.requests}) is above the "
                       f"{100 * policy.max_error_rate:g} % limit")
    compared = baseline.requests >= policy.min_requests
    if compared and rate > 2 * base_rate and rate - base_rate > policy.max_error_rate / 2:
        reasons.append(f"error rate {100 * rate:.2f} % against the old version's {100 * base_rate:.2f} %")
    if canary.p99_ms is not None and canary.p99_ms > policy.max_p99_ms:
        reasons.append(f"p99 {canary.p99_ms:.1f} ms is above the {policy.max_p99_ms:g} ms limit")
    limit = None if baseline.p99_ms is None else policy.p99_factor * baseline.p99_ms + P99_SLACK_MS
    if compared and canary.p99_ms is not None and limit is not None and canary.p99_ms > limit and \
            _slow_for_sure(canary, limit):
        reasons.append(f"p99 {canary.p99_ms:.1f} ms is {canary.p99_ms / max(baseline.p99_ms, 1e-9):.1f}x the old "
                       f"version's {baseline.p99_ms:.1f} ms (at most {policy.p99_factor:g}x)")
    return reasons


def _slow_for_sure(canary: slo.Figures, limit_ms: float) -> bool:
    """Whether more than 1 % of the canary's requests (what a p99 above the limit says) were slower than the
    limit at 95 % confidence, as the early error check is judged. Why: a p99 from a few hundred requests is set by
    their slowest handful and read from a histogram whose buckets double (runtime/batching.py); in CI on
    2026-11-29 a good canary (the same model) had 8-odd of ~700 requests over 50 ms, a p99 of 55.7 ms, 2.9x the
    old version's 19.1 ms, and was rolled back. A version that is really slower moves its whole distribution,
    and then the share over the limit is far above 1 %. Without the histogram (figures made by hand) the p99
    alone decides."""
    slow, total = canary.slower_than(limit_ms)
    return not total or wilson_low(slow, total) > 0.01


def _summary(canary: slo.Figures, baseline: slo.Figures) -> str:
    def p99(f: slo.Figures) -> str:
        return "-" if f.p99_ms is None else f"{f.p99_ms:.1f} ms"

    return (f"canary {canary.requests} requests, {canary.errors} errors, p99 {p99(canary)}; old version "
            f"{baseline.requests} requests, {baseline.errors} errors, p99 {p99(baseline)}")


def weights(percent: int, olds: int, news: int, top: int = 100) -> tuple[int, int]:
    """(old replicas' weight, new replicas' weight), 0..top each, so that the new ones together take `percent` %
    of the requests: each new replica's weight is proportional to percent x olds, each old's to
    (100 - percent) x news."""
    if percent >= 100 or olds == 0:
        return 0, top
    if percent <= 0 or news == 0:
        return top, 0
    new, old = percent * olds, (100 - percent) * news
    scale = top / max(new, old)
    return max(1, round(old * scale)), max(1, round(new * scale))


# --- the flow --------------------------------------------------------------------------------------------
@dataclass
class _Run:
    """One canary in progress: the service, its balancer, the two versions' replicas and what the row keeps."""

    svc: ServiceRecord
    module: Any
    balancer: Any
    ref: Any
    olds: list[DeployRecord]
    news: list[DeployRecord]
    report: dict[str, Any]


def run(svc: ServiceRecord, new: DeployConfig, policy: Policy, say: Say) -> ServiceRecord:
    """The canary from its first step to promotion or rollback (module docstring). A rollback ends in a
    UserError naming the breach, after the old version has all the traffic again and the canary is gone."""
    check(policy)
    service.require(svc, READY, "release a canary on")
    module = target(svc.cloud)
    old_config, options = service.config_of(svc.config)
    new = service.with_version(replace(new, cloud=svc.cloud, region=old_config.region, auth=old_config.auth,
                                       tls=old_config.tls))
    if new.version == old_config.version and new.cmd == old_config.cmd:
        say(f"service {svc.ref} already runs {_short(new.version)}; nothing to release")
        return svc
    balancer, ref = service.balancer_of(module, svc), service.ref_of(svc)
    balancer.set_weights(ref, [])                # a balancer that cannot weigh members says so before anything
    report = {"image": new.image, "version": new.version, "from_version": old_config.version,
              "outcome": "running", "policy": asdict(policy), "steps": [], "started_at": time.time()}
    base = {k: v for k, v in svc.config.items() if k != "canary"}
    svc = store.update_service(svc.id, status=SVC_UPDATING, pid=os.getpid(), config=dict(base, canary=report),
                               detail=f"canary {_short(new.version)} at {policy.steps[0]} %")
    state = _Run(svc, module, balancer, ref, service.replicas(svc), [], report)
    try:
        _bring_up(state, new, policy.steps[0], say)
        for percent in policy.steps:
            if percent >= 100:
                return _promote(state, new, options, say)
            step = _step(state, percent, policy, say)
            if step.outcome != PASS:
                raise _Breach(step)
    except _Breach as breach:
        return _rollback(state, f"at {breach.step.percent} %: " + "; ".join(breach.step.reasons), say)
    except BaseException as exc:
        try:
            _rollback(state, f"stopped: {flow.reason(exc)}", say, quiet=True)
        finally:
            raise exc
    return store.service(svc.id)


class _Breach(Exception):
    def __init__(self, step: Step) -> None:
        super().__init__(step.reasons)
        self.step = step


def _short(version: str | None) -> str:
    return (version or "?").split(":")[-1][:12]


def _bring_up(state: _Run, new: DeployConfig, percent: int, say: Say) -> None:
    """As many new replicas as the service has, in parallel; each is registered and given its step's weight
    before the balancer's checks pass (so it takes no request at full weight), then waited for."""
    svc, module = state.svc, state.module
    key = keys.get(service.key_name(svc))
    used = {r.spec.get("replica") for r in state.olds}
    indices = [i for i in range(svc.replicas * 3) if i not in used][:svc.replicas]
    zones = tuple(module.service_zones(new)) if hasattr(module, "service_zones") else ()
    w_old, w_new = weights(percent, len(state.olds), len(indices))

    def one(index: int) -> DeployRecord:
        cfg = replace(new, service_id=svc.id, replica=index, port=None,
                      zone=new.zone or (zones[index % len(zones)] if zones else None))
        record = flow.deploy(cfg, service_key=key)
        instance, port = module.member(record)
        state.balancer.register(state.ref, instance, port)
        state.balancer.set_weights(state.ref, [(instance, port, w_new), *_members(state, state.olds, w_old)])
        try:
            service._wait_healthy(module, state.balancer, state.ref, record, new.ready_timeout)
        except NotReady:
            state.balancer.deregister(state.ref, instance, port)
            raise
        say(f"service {svc.ref}: canary replica {record.id} ({_short(new.version)}) is healthy in the balancer")
        return record

    with ThreadPoolExecutor(max_workers=min(service.MAX_PARALLEL, len(indices))) as pool:
        futures = [pool.submit(one, index) for index in indices]
        errors = [f.exception() for f in futures if f.exception() is not None]
    state.news = [r for r in service.replicas(svc) if r.id not in {o.id for o in state.olds}]
    if errors:
        raise errors[0]


def _members(state: _Run, records: list[DeployRecord], weight: int) -> list[tuple[str, int, int]]:
    return [(*state.module.member(r), weight) for r in records]


def _shift(state: _Run, percent: int) -> None:
    w_old, w_new = weights(percent, len(state.olds), len(state.news))
    state.balancer.set_weights(state.ref, _members(state, state.olds, w_old) + _members(state, state.news, w_new))


def _step(state: _Run, percent: int, policy: Policy, say: Say) -> Step:
    """Shift `percent` % to the canary, then watch one window (extended while too little traffic came)."""
    _shift(state, percent)
    say(f"service {state.svc.ref}: canary step {percent} %: {len(state.news)} new replica(s) take {percent} % of "
        f"requests; watching {policy.window_s:g} s (error rate <= {100 * policy.max_error_rate:g} %, p99 <= "
        f"{policy.max_p99_ms:g} ms and <= {policy.p99_factor:g}x the old version's)")
    step = Step(percent)
    state.report["steps"].append(step)
    verdict, canary, baseline, seconds = watch(state, policy, say)
    step.outcome, step.seconds, step.reasons = verdict.outcome, round(seconds, 1), list(verdict.reasons)
    step.canary, step.baseline = canary.as_json(), baseline.as_json()
    if step.outcome == WAIT:                          # still too little traffic after every extension
        step.outcome = FAIL
        step.reasons.append("not promoted blind: rerun with a longer --canary-window or under more traffic")
    say(f"service {state.svc.ref}: canary step {percent} % {'passed' if step.outcome == PASS else 'FAILED'} after "
        f"{seconds:.0f} s: {'; '.join(step.reasons)} [{_summary(canary, baseline)}]")
    _save(state, detail=f"canary {_short(state.report['version'])} at {percent} %: {step.outcome}")
    return step


def watch(state: _Run, policy: Policy, say: Say,
          clock: Callable[[], float] = time.monotonic) -> tuple[Verdict, slo.Figures, slo.Figures, float]:
    """One window of both versions' /metrics, judged every POLL_S (an early failure ends it); a window that
    saw too little of the canary is extended up to MAX_EXTENSIONS times. Bounded: window x (1 + extensions)."""
    key = keys.get(service.key_name(state.svc))
    start = {r.id: _scrape(r, key) for r in state.olds + state.news}
    last, warm = dict(start), None
    t0 = clock()
    deadline, extensions = t0 + policy.window_s, 0
    while True:
        time.sleep(min(POLL_S, max(0.0, deadline - clock())))
        for r in state.olds + state.news:
            last[r.id] = _scrape(r, key) or last[r.id]
        if warm is None and clock() - t0 >= min(WARM_IN_S, policy.window_s / 4):
            warm = dict(last)                      # p99 from here on (WARM_IN_S says why)
        canary, baseline = (_window(start, warm, last, group) for group in (state.news, state.olds))
        final = clock() >= deadline
        verdict = judge(canary, baseline, policy, final)
        if verdict.outcome != WAIT or not final:
            if verdict.outcome != WAIT:
                return verdict, canary, baseline, clock() - t0
            continue
        if extensions >= MAX_EXTENSIONS:
            return verdict, canary, baseline, clock() - t0
        extensions += 1
        deadline += policy.window_s
        say(f"service {state.svc.ref}: {'; '.join(verdict.reasons)} after {clock() - t0:.0f} s; watching "
            f"{policy.window_s:g} s more ({extensions} of {MAX_EXTENSIONS})")


def _window(start: dict[int, slo.Scrape | None], warm: dict[int, slo.Scrape | None] | None,
            last: dict[int, slo.Scrape | None], group: list[DeployRecord]) -> slo.Figures:
    """A group's requests and errors since the step's start, its p99 since the warm-in (None before it)."""
    counted = slo.figures(_deltas(start, last, group))
    p99 = None if warm is None else slo.figures(_deltas(warm, last, group)).p99_ms
    return replace(counted, p99_ms=p99)


def _deltas(start: dict[int, slo.Scrape | None], last: dict[int, slo.Scrape | None],
            group: list[DeployRecord]) -> list[slo.Scrape]:
    return [slo.delta(start[r.id] or slo.Scrape(), last[r.id]) for r in group if last[r.id] is not None]


def _scrape(record: DeployRecord, key: str | None) -> slo.Scrape | None:
    """The replica's /metrics with the service's key and its pinned certificate; None when it did not answer
    (the window keeps its last reading: a replica that never answers adds nothing, so too few requests)."""
    from ..project.client import Client

    client = Client(record.endpoint or "", timeout=SCRAPE_TIMEOUT_S, key=key, pin=record.spec.get("tls_sha256"))
    try:
        status, body = client.get("/metrics")
    except (OSError, UserError, ValueError):
        return None
    finally:
        client.close()
    if status != 200:
        return None
    try:
        return slo.parse(body.decode(errors="replace"))
    except ValueError:
        return None


def _save(state: _Run, **fields: Any) -> None:
    report = dict(state.report, steps=[asdict(s) if isinstance(s, Step) else s for s in state.report["steps"]])
    config = dict(store.service(state.svc.id).config, canary=report)
    state.svc = store.update_service(state.svc.id, config=config, **fields)


def _promote(state: _Run, new: DeployConfig, options: Any, say: Say) -> ServiceRecord:
    """100 %: the old replicas get weight 0 (no new request), drain and leave, as at a rolling update's end; the
    new replicas are left at full weight, an ordinary service of the new version."""
    _shift(state, 100)
    for record in state.olds:
        service._retire(state.module, state.svc, state.balancer, state.ref, store.get(record.id),
                        f"rolled out by service {state.svc.ref}'s canary", keep_warm=True)
        say(f"service {state.svc.ref}: replica {record.id} ({_short(state.report['from_version'])}) drained and "
            "retired")
    state.balancer.set_weights(state.ref, _members(state, state.news, 100))   # one weight again: a plain service
    state.report.update(outcome="promoted", ended_at=time.time())
    state.report["steps"].append(Step(100, PASS, 0.0, ["promoted: the old version drained out"]))
    previous = {k: v for k, v in store.service(state.svc.id).config.items() if k != "canary"}
    _save(state)
    config = dict(service.config_row(new, options), canary=store.service(state.svc.id).config["canary"])
    say(f"service {state.svc.ref}: canary {_short(new.version)} promoted to 100 %")
    return store.update_service(state.svc.id, status=READY, pid=None, config=config, previous=previous,
                                detail=f"canary {_short(new.version)} promoted in steps "
                                       f"{'/'.join(str(s.percent) for s in state.report['steps'])} %")


def _rollback(state: _Run, why: str, say: Say, quiet: bool = False) -> ServiceRecord:
    """The old replicas get all the weight back first, then the canary's replicas drain out and leave; the row's
    config stays the old version's, with the canary's judgement beside it."""
    if state.news:
        _shift(state, 0)
    for record in state.news or [r for r in service.replicas(state.svc) if r.id not in {o.id for o in state.olds}]:
        service._retire(state.module, state.svc, state.balancer, state.ref, store.get(record.id),
                        f"canary of service {state.svc.ref} rolled back")
    _shift_back(state)
    state.report.update(outcome="rolled back", reason=why, ended_at=time.time())
    version = _short(state.report["version"])
    _save(state, status=READY, pid=None, detail=f"canary {version} rolled back {why}")
    if quiet:
        return state.svc
    say(f"service {state.svc.ref}: canary {version} rolled back {why}")
    raise UserError(f"service {state.svc.ref}: canary {version} rolled back {why}; the "
                    f"{len(state.olds)} replica(s) of {_short(state.report['from_version'])} serve all requests",
                    hint=f"see `ngcx deployments show {state.svc.ref}`") from None


def _shift_back(state: _Run) -> None:
    """The old replicas at full weight again (the canary's members are gone)."""
    state.balancer.set_weights(state.ref, _members(state, state.olds, 100))
