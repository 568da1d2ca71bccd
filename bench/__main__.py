"""`python -m bench SUITE… [--repeat N | --quick] [--out DIR]`: measure ngcx against what a user would do instead.

Writes DIR/<suite>.json (default bench/results/) and DIR/<suite>.png per suite, then BENCHMARKS.md
(at the repo root for the default DIR, else inside DIR) from every suite's latest JSON. `all` runs
every suite; one that does not apply here is recorded as skipped with its reason. Run it with the
project's interpreter (.venv/bin/python): peers (hpccm) and matplotlib are pip-installed into it
when missing.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from . import chart, report
from .core import RESULTS, ROOT, SuiteResult, SuiteSkipped, load_average, machine, now
from .suites import SUITES

MIN_REPEAT = 3


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("suites", nargs="+", metavar="SUITE", help=f"{', '.join(SUITES)} or all")
    p.add_argument("--repeat", type=int, default=3, help=f"repetitions per figure (default 3, at least {MIN_REPEAT})")
    p.add_argument("--quick", action="store_true",
                   help="one repetition per figure: a smoke run of slow suites (build); not min/median/max")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder (default bench/results)")
    args = p.parse_args(argv)
    unknown = [s for s in args.suites if s != "all" and s not in SUITES]
    if unknown:
        p.error(f"unknown suite(s) {', '.join(unknown)}; choose from {', '.join(SUITES)} or all")
    if args.quick:
        if "--repeat" in argv or any(a.startswith("--repeat=") for a in argv):
            p.error("--quick means one repetition: leave out --repeat")
        args.repeat = 1
    elif args.repeat < MIN_REPEAT:
        p.error(f"--repeat must be at least {MIN_REPEAT}: min / median / max need that many")
    args.suites = list(SUITES) if "all" in args.suites else list(dict.fromkeys(args.suites))
    return args


def command_line(suite: str, args: argparse.Namespace) -> str:
    """The exact command that reproduces one suite's result, as BENCHMARKS.md shows it."""
    out = "" if args.out.resolve() == RESULTS.resolve() else f" --out {shlex.quote(str(args.out))}"
    reps = "--quick" if args.quick else f"--repeat {args.repeat}"
    return f".venv/bin/python -m bench {suite} {reps}{out}"


def run_suite(name: str, args: argparse.Namespace) -> SuiteResult:
    """Run one suite in a scratch folder; a skip is a result, a crash is reported and recorded as skipped."""
    result = SuiteResult(suite=name, status="ok", command=command_line(name, args), repeat=args.repeat,
                         started=now(), machine=machine())
    start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix=f"ngcx-bench-{name}-"))
    try:
        SUITES[name](result, work, args.out)
    except SuiteSkipped as exc:
        result.status, result.reason = "skipped", str(exc)
        result.measurements, result.ratios = [], []
    except Exception as exc:  # a broken suite must not hide the others' results
        traceback.print_exc()
        result.status, result.reason = "skipped", f"failed: {type(exc).__name__}: {str(exc)[:300]}"
        result.measurements, result.ratios = [], []
    finally:
        shutil.rmtree(work, ignore_errors=True)
    result.duration_s = round(time.perf_counter() - start, 1)
    result.machine["load_average_after"] = load_average()
    return result


def save(result: SuiteResult, out: Path) -> None:
    import json

    (out / f"{result.suite}.json").write_text(json.dumps(result.as_dict(), indent=2) + "\n")
    png = out / f"{result.suite}.png"
    if chart.draw(result, png) is None:
        png.unlink(missing_ok=True)  # a chart from an earlier run would contradict the skip


def summary(result: SuiteResult) -> str:
    if result.status != "ok":
        return f"{result.suite}: skipped ({result.reason})"
    ratios = "; ".join(f"{r.name} = {r.wall:.2f}" + (f" (CPU {r.cpu:.2f})" if r.cpu else "") for r in result.ratios)
    return f"{result.suite}: {len(result.measurements)} figures in {result.duration_s:.0f} s; {ratios}"


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.suites:
        print(f"bench: {name} ...", file=sys.stderr)
        result = run_suite(name, args)
        save(result, args.out)
        print(summary(result))
    target = ROOT / "BENCHMARKS.md" if args.out.resolve() == RESULTS.resolve() else args.out / "BENCHMARKS.md"
    report.write(args.out, target, list(SUITES))
    print(f"bench: wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
