"""The canary's judge (cli/deploy/canary.py) and the window figures it reads (cli/deploy/slo.py), without a replica.

What a user notices: a canary answering 5 % errors is rolled back, one with a p99 three times the old version's is
rolled back, a good one passes, and a window with too little traffic is never passed blind; the weights give the
canary the share of requests the step names; the figures come from the runtime's own /metrics text.
"""

from __future__ import annotations

import pytest

from ngcx.core.errors import UserError
from ngcx.deploy import canary, slo
from ngcx.deploy.canary import FAIL, PASS, WAIT, Policy, judge, steps_of, weights
from ngcx_runtime.metrics import ModelSample, render

POLICY = Policy()
GOOD_BASE = slo.Figures(requests=900, errors=0, p99_ms=10.0)


def test_a_canary_within_the_slo_and_like_the_old_version_passes_at_the_end_of_its_window():
    fine = slo.Figures(requests=100, errors=0, p99_ms=12.0)
    assert judge(fine, GOOD_BASE, POLICY, final=True).outcome == PASS
    assert judge(fine, GOOD_BASE, POLICY, final=False).outcome == WAIT       # never passed before the window ends


def test_a_canary_answering_five_percent_errors_fails_early_on_confident_evidence():
    bad = slo.Figures(requests=60, errors=3, p99_ms=10.0)                   # 5 %, a 1 % limit
    verdict = judge(bad, GOOD_BASE, POLICY, final=False)
    assert verdict.outcome == FAIL and "error rate 5.0 %" in verdict.reasons[0]
    one_unlucky = slo.Figures(requests=30, errors=1, p99_ms=10.0)           # 3 %, but one error is no evidence
    assert judge(one_unlucky, GOOD_BASE, POLICY, final=False).outcome == WAIT


def test_an_error_rate_above_the_limit_fails_at_the_end_of_the_window():
    verdict = judge(slo.Figures(requests=200, errors=3, p99_ms=10.0), GOOD_BASE, POLICY, final=True)   # 1.5 %
    assert verdict.outcome == FAIL and any("above the 1 % limit" in r for r in verdict.reasons)


def test_a_canary_with_three_times_the_old_versions_p99_fails():
    slow = slo.Figures(requests=300, errors=0, p99_ms=30.0)
    verdict = judge(slow, GOOD_BASE, POLICY, final=True)
    assert verdict.outcome == FAIL and "3.0x the old version's 10.0 ms" in verdict.reasons[0]
    assert judge(slo.Figures(300, 0, 18.0), GOOD_BASE, POLICY, final=True).outcome == PASS   # 1.8x: noise


def test_the_absolute_p99_limit_holds_even_when_the_old_version_is_as_slow():
    slow_base = slo.Figures(requests=900, errors=0, p99_ms=1500.0)
    verdict = judge(slo.Figures(300, 0, 1600.0), slow_base, Policy(max_p99_ms=1000), final=True)
    assert verdict.outcome == FAIL and "above the 1000 ms limit" in verdict.reasons[0]


def test_errors_well_above_the_old_versions_fail_though_under_the_absolute_limit():
    base = slo.Figures(requests=1000, errors=1, p99_ms=10.0)               # 0.1 %
    verdict = judge(slo.Figures(1000, 8, 10.0), base, POLICY, final=True)  # 0.8 %: under 1 %, 8x the old
    assert verdict.outcome == FAIL and "against the old version's 0.10 %" in verdict.reasons[0]


def test_the_old_versions_figures_count_only_when_it_saw_enough_requests_itself():
    thin_base = slo.Figures(requests=5, errors=0, p99_ms=2.0)
    assert judge(slo.Figures(200, 0, 30.0), thin_base, POLICY, final=True).outcome == PASS


def test_too_little_traffic_is_said_and_never_passed():
    verdict = judge(slo.Figures(requests=40, errors=0, p99_ms=5.0), GOOD_BASE, POLICY, final=True)
    assert verdict.outcome == WAIT and "too little traffic to judge: 40 canary request(s), 100 needed" in \
        verdict.reasons[0]


@pytest.mark.parametrize(("percent", "olds", "news"), [(10, 2, 2), (50, 2, 2), (10, 3, 3), (25, 1, 4), (90, 5, 1)])
def test_weights_give_the_new_replicas_the_steps_share_of_requests(percent, olds, news):
    w_old, w_new = weights(percent, olds, news)
    assert 0 < w_old <= 100 and 0 < w_new <= 100
    share = news * w_new / (news * w_new + olds * w_old)
    assert share == pytest.approx(percent / 100, abs=0.01)


def test_weights_at_the_ends_send_everything_one_way():
    assert weights(100, 3, 3) == (0, 100) and weights(0, 3, 3) == (100, 0)


def test_steps_start_at_the_canary_share_and_end_with_the_promotion():
    assert steps_of(10) == (10, 50, 100) and steps_of(60) == (60, 100) and steps_of(1) == (1, 10, 50, 100)
    for bad in (0, 100, 150):
        with pytest.raises(UserError, match="percentage from 1 to 99"):
            steps_of(bad)
    with pytest.raises(UserError, match="--max-error-rate"):
        canary.check(Policy(max_error_rate=1.5))


def _text(success: int, failed: int, durations_us: list[int]) -> str:
    from ngcx_runtime.batching import REQUEST_BUCKETS_US

    buckets = [0] * (len(REQUEST_BUCKETS_US) + 1)
    for us in durations_us:
        buckets[next((i for i, le in enumerate(REQUEST_BUCKETS_US) if us <= le), len(REQUEST_BUCKETS_US))] += 1
    stats = {"success": success, "failed": failed, "request_buckets": buckets, "request_ns": 1000 * sum(durations_us)}
    return render([ModelSample("convnet", "1", stats, 0)])


@pytest.mark.parametrize("parser", ["prometheus_client", "small"])
def test_window_figures_come_from_the_runtimes_own_metrics_text(parser, monkeypatch):
    if parser == "small":
        monkeypatch.setattr(slo, "_samples", slo._small_parser)
    before = slo.parse(_text(100, 0, [3_000] * 100))
    after = slo.parse(_text(300, 10, [3_000] * 100 + [4_000] * 190 + [40_000] * 10))
    figures = slo.figures([slo.delta(before, after)])
    assert (figures.requests, figures.errors) == (210, 10)
    assert 20.0 < figures.p99_ms <= 50.0                      # the 10 slow ones are the top 5 %
    restarted = slo.parse(_text(5, 1, [3_000] * 5))            # counters went down: counted from zero
    assert slo.figures([slo.delta(after, restarted)]).requests == 6


def test_a_window_with_too_little_traffic_is_extended_said_and_never_passed(monkeypatch, tmp_path):
    """watch() over replicas whose /metrics grow by 5 requests a reading: each window is extended (said once
    each), MAX_EXTENSIONS times, then the step ends WAIT, which canary._step turns into a rollback."""
    from types import SimpleNamespace

    monkeypatch.setenv("NGCX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(canary, "POLL_S", 0.05)
    readings: dict[int, int] = {}

    def scrape(record, key):
        readings[record.id] = readings.get(record.id, 0) + 5
        return slo.parse(_text(readings[record.id], 0, [3_000] * readings[record.id]))

    monkeypatch.setattr(canary, "_scrape", scrape)
    svc = SimpleNamespace(ref="s1", id=1)
    state = SimpleNamespace(svc=svc, olds=[SimpleNamespace(id=1)], news=[SimpleNamespace(id=2)])
    said: list[str] = []
    verdict, figures, _, seconds = canary.watch(state, Policy(window_s=0.2, min_requests=10_000), said.append)
    assert verdict.outcome == WAIT and "too little traffic to judge" in verdict.reasons[0]
    assert len(said) == canary.MAX_EXTENSIONS and all("watching 0.2 s more" in line for line in said)
    assert 0.2 * (1 + canary.MAX_EXTENSIONS) <= seconds < 5 and 0 < figures.requests < 10_000


def test_a_new_replicas_slow_first_requests_do_not_count_in_its_p99_but_its_errors_do(monkeypatch, tmp_path):
    """watch(): the canary's first reading holds 20 slow requests (300 ms) and one error, then it answers in 3 ms
    like the old version. Judged on p99 from the warm-in, it passes the 2x check; its error stays counted."""
    from types import SimpleNamespace

    monkeypatch.setenv("NGCX_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setattr(canary, "POLL_S", 0.05)
    monkeypatch.setattr(canary, "WARM_IN_S", 0.1)
    served: dict[int, list[int]] = {1: [], 2: []}
    readings = {1: 0, 2: 0}

    def scrape(record, key):                  # reading 1: the step's start; 2: the slow ones; then warm
        readings[record.id] += 1
        if record.id == 1:
            served[1] += [3_000] * 400
        elif readings[2] == 2:
            served[2] += [300_000] * 20
        elif readings[2] > 2:
            served[2] += [3_000] * 40
        failed = 1 if record.id == 2 and readings[2] >= 2 else 0
        return slo.parse(_text(len(served[record.id]), failed, served[record.id]))

    monkeypatch.setattr(canary, "_scrape", scrape)
    state = SimpleNamespace(svc=SimpleNamespace(ref="s1", id=1), olds=[SimpleNamespace(id=1)],
                            news=[SimpleNamespace(id=2)])
    policy = Policy(window_s=1.0, min_requests=100, max_error_rate=0.05)
    verdict, figures, baseline, _ = canary.watch(state, policy, lambda line: None)
    assert verdict.outcome == PASS, verdict
    assert figures.p99_ms is not None and figures.p99_ms < 2 * baseline.p99_ms + canary.P99_SLACK_MS
    assert figures.errors == 1 and figures.requests > 100
    every = slo.figures([slo.delta(slo.Scrape(), slo.parse(_text(len(served[2]), 0, served[2])))])
    assert every.p99_ms > 100                                 # counted from the first request, it would fail


def _figures(durations_us: list[int]) -> slo.Figures:
    return slo.figures([slo.parse(_text(len(durations_us), 0, durations_us))])


def test_a_p99_over_the_limit_from_a_handful_of_slow_requests_is_no_evidence_but_a_slower_version_is():
    """CI, 2026-11-29: a good canary (the same model) had ~8 of ~700 requests over 50 ms, p99 55.7 ms against the old
    version's 19.1 ms (2.9x), and was rolled back. The p99 check now needs more than 1 % of the canary's requests
    over the limit at 95 % confidence; a version 3x slower throughout still fails."""
    base = _figures([5_000] * 600 + [9_000] * 294 + [15_000] * 6)                 # p99 just under 10 ms
    limit = POLICY.p99_factor * base.p99_ms + canary.P99_SLACK_MS
    lucky = _figures([6_000] * 600 + [9_000] * 92 + [60_000] * 8)                 # 8 of 700 slow: p99 in 50..100
    assert lucky.p99_ms > limit and lucky.slower_than(limit) == (8, 700)          # the p99 alone would fail it
    assert judge(lucky, base, POLICY, final=True).outcome == PASS
    slower = _figures([15_000] * 600 + [27_000] * 294 + [45_000] * 6)             # every request 3x the old's
    verdict = judge(slower, base, POLICY, final=True)
    assert verdict.outcome == FAIL and "x the old version's" in verdict.reasons[0], verdict
