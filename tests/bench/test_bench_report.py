"""bench/report.py: the BENCHMARKS.md written from the suites' JSON.

Why: the page says which tool wins each ratio; a reading turned around, a unit shown wrong or a
skipped suite shown as measured would mislead its readers.
"""

from __future__ import annotations

from pathlib import Path

from bench_samples import measurement, suite_doc, write_docs

from bench import report
from bench.core import Measurement, Stats, ratio


def test_report_shows_ratios_figures_machine_and_command(tmp_path: Path) -> None:
    ngcx = measurement("ngcx render", [0.18, 0.17, 0.20], cpu=[0.16, 0.17, 0.18])
    ngcx.command, ngcx.note = ".venv/bin/ngcx render pytorch:24.11", "warm cache"
    peer = measurement("hpccm --recipe", [0.07, 0.08, 0.09], cpu=[0.06, 0.07, 0.08])
    peer.command = ".venv/bin/hpccm --recipe r.py"
    fast = measurement("ngcx size", [0.5, 0.5, 0.5])
    cli = suite_doc("cli", measurements=[ngcx, peer], notes=["the gap is start-up"],
                    ratios=[ratio("ngcx render / hpccm", ngcx, peer), ratio("size / naive", fast, peer)])
    write_docs(tmp_path, cli, suite_doc("build", status="skipped", reason="no Docker engine"))
    (tmp_path / "cli.png").write_bytes(b"\x89PNG")
    out = report.write(tmp_path, tmp_path / "BENCHMARKS.md", ["cli", "build", "push"])
    md = out.read_text()

    assert "| [cli](#cli) | ok | ngcx render / hpccm: 2.25; size / naive: 6.25 | 2026-11-22 |" in md
    assert "| [build](#build) | skipped | no Docker engine | 2026-11-22 |" in md
    assert "| push | not run yet | - | - |" in md
    assert "Command: `.venv/bin/python -m bench cli --repeat 3`" in md
    assert "3 repetitions, 2 cores, load average [1.0, 1.1, 1.2] before, [1.5, 1.1, 1.2] after; git abc1234," in md
    assert "| ngcx render / hpccm | **2.25** | 2.43 | ngcx slower |" in md        # 0.18/0.08, 0.17/0.07
    assert ("| ngcx render | `.venv/bin/ngcx render pytorch:24.11` | 0.170 | **0.180** | 0.200 | 0.170 "
            "| warm cache |") in md
    assert "- the gap is start-up" in md and "![cli](cli.png)" in md
    assert "## build\n\nCommand: `.venv/bin/python -m bench build --repeat 3`\n\n**Skipped**: no Docker engine" in md
    assert md.index("## cli") < md.index("## build") and "## push" not in md


def test_report_says_when_ngcx_wins_and_names_throughputs_as_such(tmp_path: Path) -> None:
    quick, slow = measurement("ngcx", [1.0, 1.0, 1.0]), measurement("naive", [2.0, 2.0, 2.0])
    hi = Measurement("int8", "ngcx", "inf/s", "higher", Stats.of([3000.0, 3100.0, 3200.0]), command="bench x")
    lo = Measurement("fp32", "ngcx", "inf/s", "higher", Stats.of([1500.0, 1550.0, 1600.0]), command="bench x")
    write_docs(tmp_path, suite_doc("build", measurements=[quick, slow], ratios=[ratio("ngcx / naive", quick, slow)]),
               suite_doc("runtime", measurements=[hi, lo], ratios=[ratio("int8 / fp32", hi, lo)]))
    md = report.write(tmp_path, tmp_path / "B.md", ["build", "runtime"]).read_text()
    assert "| ngcx / naive | **0.50** | - | ngcx as fast or faster |" in md
    assert "| int8 / fp32 | **2.00** | - | throughput ratio |" in md
    assert "Each row from: `bench x`" in md                      # one command measured many ways: said once
    assert "| int8 | 3,000.0 | **3,100.0** | 3,200.0 |  |" in md


def test_report_mixes_units_in_one_table_and_reads_sizes_and_sharing(tmp_path: Path) -> None:
    def fig(name: str, unit: str, value: float, better: str = "lower") -> Measurement:
        return Measurement(name, name.split(":")[0], unit, better, Stats.of([value]), command="docker build x")

    cold_n, cold_h = fig("ngcx: cold build", "s", 40.0), fig("hpccm: cold build", "s", 38.0)
    size_n, size_v = fig("ngcx: image size", "bytes", 2.05e9), fig("naive: image size", "bytes", 2.48e9)
    share_n, share_v = (fig("ngcx: bytes shared", "bytes", 74.8e6, "higher"),
                        fig("naive: bytes shared", "bytes", 576.7e6, "higher"))
    layers = fig("ngcx: layers", "layers", 8)
    doc = suite_doc("build", measurements=[cold_n, cold_h, size_n, size_v, share_n, share_v, layers],
                    ratios=[ratio("cold", cold_n, cold_h), ratio("size", size_n, size_v),
                            ratio("shared", share_n, share_v)])
    write_docs(tmp_path, doc)
    md = report.write(tmp_path, tmp_path / "B.md", ["build"]).read_text()
    assert "| cold | **1.05** | - | ngcx slower |" in md
    assert "| size | **0.83** | - | ngcx as small or smaller |" in md
    assert "| shared | **0.13** | - | ngcx shares less |" in md
    assert "| ngcx: cold build | 40.0 s | **40.0 s** | 40.0 s | `docker build x` |" in md
    assert "| naive: image size | 2.48 GB | **2.48 GB** | 2.48 GB |" in md
    assert "| ngcx: bytes shared | 74.8 MB | **74.8 MB** |" in md and "| ngcx: layers | 8 | **8** | 8 |" in md
