"""bench/suites/security.py: the suite's whole code path in one tiny round (five servers, one client over them).

Why: the figures come from `python -m bench security`; this proves the suite still runs (servers
with keys and TLS start, the client pins the certificate and sends the key, the guarded server
refuses a keyless request) without spending the suite's time.
"""

from __future__ import annotations

from pathlib import Path

import bench_samples  # noqa: F401  (puts the repo root on sys.path: bench/ is not installed)
import pytest

from bench.core import SuiteResult
from bench.suites import SUITES, security


def test_one_tiny_round_fills_rows_ratios_and_the_check_cost(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("cryptography")
    assert SUITES["security"] is security.run
    monkeypatch.setattr(security, "CHECKS", 2_000)
    result = SuiteResult(suite="security", status="ok", command="-", repeat=1)
    security.run(result, tmp_path, tmp_path, slice_s=0.05, cycles=2, warmup=5)
    assert [m.name.split(",")[0] for m in result.measurements] == list(security.CONFIGS)
    assert all(m.unit == "inf/s" and m.wall.median > 0 for m in result.measurements)
    assert [r.name for r in result.ratios] == ["keys / open", "TLS / plain", "TLS + keys / open",
                                               "control / open (noise floor)"]
    assert all(0 < r.wall < 10 and r.better == "higher" for r in result.ratios)
    assert result.extra["unauthenticated_status"] == 401
    assert set(result.extra["policy_check_us"]) == {"open", "keys"}
    assert set(result.extra["policy_check_us_while_serving"]) == set(security.CONFIGS)
    assert all(len(v) == 1 for v in result.extra["paired_ratios_per_round"].values())
    assert all(v["cycles"] == 2 for v in result.extra["paired_ratios_per_cycle"].values())
    assert "TLSv1." in result.measurements[3].note and result.extra["tls_versions"]
