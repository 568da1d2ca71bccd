"""What the bench tests share: `bench` importable, and small suite results to feed the report with.

bench/ is a top-level folder of the repo, not an installed package: importing this module puts the
repo root on sys.path (pytest puts tests/bench/ there, which is how the tests find this module).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.core import Measurement, Stats, SuiteResult  # noqa: E402


def measurement(name: str, wall: list[float], cpu: list[float] | None = None, better: str = "lower") -> Measurement:
    """A figure in seconds of a tool "x", as a suite records one."""
    return Measurement(name=name, tool="x", unit="s", better=better, wall=Stats.of(wall),
                       cpu=Stats.of(cpu) if cpu else None)


def suite_doc(suite: str, **kw) -> dict:
    """A suite's JSON document (bench/results/<suite>.json) with a fixed machine and date; `kw` sets its fields."""
    result = SuiteResult(suite=suite, status="ok", command=f".venv/bin/python -m bench {suite} --repeat 3",
                         repeat=3, started="2026-11-22T10:00:00Z", duration_s=12.0,
                         machine={"cores": 2, "load_average_before": [1.0, 1.1, 1.2],
                                  "load_average_after": [1.5, 1.1, 1.2], "git_revision": "abc1234",
                                  "git_dirty": False, "python": "3.11.7"})
    for key, value in kw.items():
        setattr(result, key, value)
    return result.as_dict()


def write_docs(folder: Path, *docs: dict) -> None:
    """The documents as a results folder holds them: one <suite>.json each."""
    for doc in docs:
        (folder / f"{doc['suite']}.json").write_text(json.dumps(doc))
