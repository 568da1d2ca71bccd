"""Start-up time of `ngcx --help`: median wall time of N fresh processes.

Why a separate benchmark and not a test: the issue asks for < 0.3 s on the dev machine, but a
timed assertion in the suite would be flaky on a loaded CI box; tests/unit/test_cli.py checks the
cause instead (no heavy import at start-up). Run:

    /work/venv/bin/python bench/cli_startup.py [--runs 21] [--json]

It times both the console script (`ngcx`, next to this interpreter) and `python -m ngcx`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

LIMIT_S = 0.3


def commands() -> dict[str, list[str]]:
    """The ways a user starts ngcx: the installed script (if any) and the module."""
    out = {"python -m ngcx --help": [sys.executable, "-m", "ngcx", "--help"]}
    script = Path(sys.executable).parent / "ngcx"
    found = str(script) if script.is_file() else shutil.which("ngcx")
    if found:
        out["ngcx --help"] = [found, "--help"]
    return out


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_runs(argv: list[str], runs: int, warmup: int = 2) -> tuple[list[float], list[float]]:
    """Wall and CPU (user+sys) time of each run; warm-up runs first so the page cache, not the
    disk, is measured. CPU time barely moves with machine load, wall time does."""
    for _ in range(warmup):
        subprocess.run(argv, capture_output=True, check=True)
    walls, cpus = [], []
    for _ in range(runs):
        cpu0, start = _child_cpu(), time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        walls.append(time.perf_counter() - start)
        cpus.append(_child_cpu() - cpu0)
    return walls, cpus


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=21, help="timed runs per command (default 21)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    results = {}
    load_before = os.getloadavg()[0]
    for name, argv in commands().items():
        times, cpus = time_runs(argv, args.runs)
        results[name] = {"median_s": round(statistics.median(times), 4), "min_s": round(min(times), 4),
                         "max_s": round(max(times), 4), "cpu_median_s": round(statistics.median(cpus), 4),
                         "runs": args.runs}
    # A loaded box (other builds, test runs) inflates the median: report the load with the number.
    load = {"before": round(load_before, 2), "after": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()}
    if args.json:
        print(json.dumps({"limit_s": LIMIT_S, "load_average_1m": load, "results": results}, indent=2))
    else:
        print(f"load average (1 min) {load['before']} -> {load['after']} on {load['cpus']} CPUs")
        for name, r in results.items():
            verdict = "ok" if r["median_s"] < LIMIT_S else "TOO SLOW"
            print(f"{name:<24} median {r['median_s'] * 1000:6.1f} ms  (min {r['min_s'] * 1000:.1f}, "
                  f"max {r['max_s'] * 1000:.1f}, cpu {r['cpu_median_s'] * 1000:.1f}, n={r['runs']})  "
                  f"limit {LIMIT_S * 1000:.0f} ms: {verdict}")
    return 0 if all(r["median_s"] < LIMIT_S for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
