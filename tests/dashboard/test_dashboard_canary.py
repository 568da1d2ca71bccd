"""The dashboard's service page shows the service's last canary release: every step, its verdict and the figures
it rested on (requests, errors, p99 of the canary and of the old version), as deploy/canary.py keeps them.

The row is written through the state store's own functions (what `ngcx deploy --canary` writes), and the page
is read from a real `ngcx dashboard` process.
"""

from __future__ import annotations

from pathlib import Path

from .running import Dashboard


def test_the_service_page_shows_each_canary_step_and_the_figures_it_was_judged_on(tmp_path: Path, monkeypatch):
    env = {"NGCX_STATE_DIR": str(tmp_path / "state"), "AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "",
           "ALIBABA_CLOUD_ACCESS_KEY_ID": "", "ALIBABA_CLOUD_ACCESS_KEY_SECRET": ""}
    monkeypatch.setenv("NGCX_STATE_DIR", env["NGCX_STATE_DIR"])
    from dataclasses import asdict

    from ngcx.deploy import store
    from ngcx.deploy.canary import Policy, Step

    svc = store.create_service("local", None, 2, {"image": "ngcx-app/demo:latest", "version": "sha256:" + "a" * 64})
    step = Step(10, "fail", 7.5, ["error rate 6.10 % (5 of 82) is above the 1 % limit at 95 % confidence"],
                {"requests": 82, "errors": 5, "error_rate": 0.061, "p99_ms": 4.2},
                {"requests": 731, "errors": 0, "error_rate": 0.0, "p99_ms": 3.9})
    canary = {"image": "ngcx-app/demo-bad:latest", "version": "sha256:" + "b" * 64,
              "from_version": "sha256:" + "a" * 64,
              "outcome": "rolled back", "reason": "at 10 %: error rate 6.10 %", "policy": asdict(Policy()),
              "steps": [asdict(step)]}
    store.update_service(svc.id, status="ready", config=dict(svc.config, canary=canary),
                         detail="canary bbbbbbbbbbbb rolled back at 10 %")
    with Dashboard(env) as dash:
        status, _, body = dash.call("/deployments/s1")
    page = body.decode()
    assert status == 200 and "<h2>Canary</h2>" in page, page[-2000:]
    assert "rolled back" in page and "ngcx-app/demo-bad:latest" in page
    assert "error rate ≤ 1 %, p99 ≤ 1000 ms and ≤ 2.5x the old version's, 60 s per step" in page
    row = page[page.index("<td>10 %</td>"):]
    row = row[:row.index("</tr>")]
    for cell in ("fail", "7.5 s", "<td>82</td>", "<td>5</td>", "4.2 ms", "<td>731</td>", "<td>0</td>", "3.9 ms",
                 "above the 1 % limit"):
        assert cell in row, (cell, row)
