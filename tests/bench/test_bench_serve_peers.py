"""bench/suites/serve_peers.py: the suite's code path in one tiny round, and how it reads its rounds.

Why: the figures come from `python -m bench serve-peers --repeat 3` (minutes, and every peer's own
virtual environment from PyPI); this proves, without that cost, that ngcx-runtime starts as the
suite starts it, answers correctly in JSON and binary, is measured at every point, and that a peer
which cannot be installed is a line saying why instead of a lost run. The ratio logic (ngcx over
the best peer per point, in the right direction per figure) is checked on rounds written here.
"""

from __future__ import annotations

from pathlib import Path

import bench_samples  # noqa: F401  (puts the repo root on sys.path: bench/ is not installed)
import pytest

from bench.core import SuiteResult
from bench.serve_peers.peers import PEERS, Peer
from bench.suites import SUITES, serve_peers


def test_one_tiny_round_measures_ngcx_at_every_point_and_names_a_peer_that_did_not_install(
        tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    broken = Peer("broken", ("this is not a requirement!",), False, "none")
    assert SUITES["serve-peers"] is serve_peers.run
    result = SuiteResult(suite="serve-peers", status="ok", command="-", repeat=1)
    serve_peers.run(result, tmp_path, tmp_path, peers={"ngcx": PEERS["ngcx"], "broken": broken},
                    clients=(1, 4), seconds=0.3)
    assert result.extra["peers"] == ["ngcx"]
    assert "broken" in result.extra["not_installed"] and "pip" in result.extra["not_installed"]["broken"]
    assert result.notes and result.notes[0].startswith("Not installed: broken:")
    assert not result.extra["errors"], result.extra["errors"]
    names = {m.name for m in result.measurements}
    for model in ("mlp", "convnet"):
        for encoding in ("json", "binary"):
            for clients in (1, 4):
                assert f"ngcx: {model} {encoding} c{clients} rps" in names
        assert f"ngcx: {model} ready_s" in names and f"ngcx: {model} peak_rss" in names
    assert all(m.wall.median > 0 for m in result.measurements)
    assert result.ratios == []                             # no peer ran: nothing to divide by


def _row(rps: float, p50: float, ready: float) -> dict:
    return {"ready_s": ready, "idle_rss": 1e8, "peak_rss": 2e8,
            "points": {"mlp json c1": {"rps": rps, "p50_ms": p50, "p99_ms": 2 * p50, "errors": 0,
                                       "first_error": ""}}}


def test_each_ratio_is_ngcx_over_the_best_peer_of_that_figure() -> None:
    rounds = [{"ngcx mlp": _row(1000, 1.0, 0.5), "kserve mlp": _row(800, 0.8, 2.0), "mlserver mlp": _row(900, 1.2, 3.0)}
              for _ in range(3)]
    result = SuiteResult(suite="serve-peers", status="ok", command="-", repeat=3)
    serve_peers._report(result, rounds, [PEERS["ngcx"], PEERS["kserve"], PEERS["mlserver"]], {})
    ratios = {r.name: r for r in result.ratios}
    assert ratios["mlp json c1 rps: ngcx / mlserver"].wall == pytest.approx(1000 / 900, abs=1e-3)
    assert ratios["mlp json c1 rps: ngcx / mlserver"].ngcx_wins
    assert ratios["mlp json c1 p50_ms: ngcx / kserve"].wall == pytest.approx(1.0 / 0.8, abs=1e-3)
    assert not ratios["mlp json c1 p50_ms: ngcx / kserve"].ngcx_wins
    assert ratios["mlp ready_s: ngcx / kserve"].wall == pytest.approx(0.25, abs=1e-3)
    shown = {m.tool: m.command for m in result.measurements}       # the report's "built from" column
    assert shown["ngcx"].startswith("python -m ngcx_runtime.serve MODEL") and "--max-batch 32" in shown["ngcx"]
    assert shown["mlserver"].startswith("mlserver start FOLDER")
    script = shown["kserve"].split()[1]
    assert script.endswith("kserve_onnx.py") and (Path(serve_peers.ROOT) / script).is_file()


def test_a_point_with_errors_is_left_out_of_the_figures() -> None:
    bad = _row(5000, 0.1, 1.0)
    bad["points"]["mlp json c1"]["errors"] = 3
    rounds = [{"ngcx mlp": _row(1000, 1.0, 0.5), "kserve mlp": bad}]
    result = SuiteResult(suite="serve-peers", status="ok", command="-", repeat=1)
    serve_peers._report(result, rounds, [PEERS["ngcx"], PEERS["kserve"]], {})
    assert not any(r.name.startswith("mlp json c1") for r in result.ratios)


def test_the_summary_leads_with_the_worst_req_s_and_the_worst_p50_point() -> None:
    rounds = [{"ngcx mlp": _row(1000, 1.0, 0.5), "kserve mlp": _row(800, 0.8, 2.0)}]
    rounds[0]["ngcx mlp"]["points"]["mlp json c8"] = {"rps": 3000, "p50_ms": 2.0, "p99_ms": 4.0, "errors": 0,
                                                      "first_error": ""}
    rounds[0]["kserve mlp"]["points"]["mlp json c8"] = {"rps": 1000, "p50_ms": 8.0, "p99_ms": 9.0, "errors": 0,
                                                        "first_error": ""}
    result = SuiteResult(suite="serve-peers", status="ok", command="-", repeat=1)
    serve_peers._report(result, rounds, [PEERS["ngcx"], PEERS["kserve"]], {})
    assert [r.name for r in result.ratios[:2]] == ["mlp json c1 rps: ngcx / kserve",
                                                   "mlp json c1 p50_ms: ngcx / kserve"]
    assert len({r.name for r in result.ratios}) == len(result.ratios) == 2 * 3 + 3
