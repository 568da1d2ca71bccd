"""What every suite shares: repeated measurements with min / median / max, the machine beside them,
peers installed on demand, and one result document per suite.

Why ratios and CPU time next to wall time: these machines are shared and noisy (2 cores, other
sessions' test runs), so an absolute figure from one day says little; ngcx and its peer measured
in the same run, alternating, on the same load, give a ratio that does. A child's CPU time
(user + sys) moves much less with load than its wall time, so both are kept.
"""

from __future__ import annotations

import importlib.util
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"


class SuiteSkipped(Exception):  # noqa: N818 - it is a result, not an error
    """A suite that does not apply here (a feature not there yet, no Docker, no GPU): the reason is the result."""


@dataclass
class Stats:
    """min / median / max of one figure over the repetitions, with every value kept."""

    min: float
    median: float
    max: float
    values: list[float]

    @classmethod
    def of(cls, values: Sequence[float]) -> Stats:
        vals = [round(v, 6) for v in values]
        return cls(min(vals), round(statistics.median(vals), 6), max(vals), vals)

    def overlaps(self, other: Stats) -> bool:
        """True when the two min..max ranges overlap: the difference is within this run's spread (a note
        then calls it this machine's noise)."""
        return self.min <= other.max and other.min <= self.max


@dataclass
class Measurement:
    """One figure of one tool: a command's time (lower is better) or a throughput (higher is better)."""

    name: str                      # what a reader sees in the table, e.g. "ngcx render pytorch:24.11"
    tool: str                      # ngcx | hpccm | naive | python | ...
    unit: str                      # s | inf/s | bytes ...
    better: str                    # lower | higher
    wall: Stats
    cpu: Stats | None = None       # the child's user+sys seconds, where a process was timed
    command: str = ""              # the exact command line measured
    note: str = ""


@dataclass
class Ratio:
    """ngcx's figure over a peer's (medians), for wall time and, where there is one, CPU time."""

    name: str
    numerator: str
    denominator: str
    wall: float
    cpu: float | None = None
    better: str = "lower"          # lower ratio is better for ngcx when the unit is time
    unit: str = "s"                # the unit of both figures (s, bytes, inf/s ...): how the report reads it

    @property
    def ngcx_wins(self) -> bool:
        return self.wall <= 1.0 if self.better == "lower" else self.wall >= 1.0


@dataclass
class SuiteResult:
    """What <suite>.json holds."""

    suite: str
    status: str                    # ok | skipped
    command: str
    reason: str = ""
    repeat: int = 0
    started: str = ""
    duration_s: float = 0.0
    machine: dict[str, Any] = field(default_factory=dict)
    measurements: list[Measurement] = field(default_factory=list)
    ratios: list[Ratio] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ----------------------------------------------------------------------------- the machine


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    """Cores, load and software beside every result: a figure without them cannot be compared."""
    return {
        "cores": os.cpu_count(),
        "load_average_before": load_average(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "git_revision": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        return ""


# ----------------------------------------------------------------------------- timing


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def time_once(argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> tuple[float, float]:
    """Wall and CPU seconds of one run of argv; a failing command stops the suite with its stderr."""
    cpu0, start = _children_cpu(), time.perf_counter()
    proc = subprocess.run(list(argv), capture_output=True, text=True, env=env, cwd=cwd, timeout=600)
    wall, cpu = time.perf_counter() - start, _children_cpu() - cpu0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    return wall, cpu


@dataclass
class Timed:
    """A command to time: what it is called, which tool, argv, and an env factory (a fresh one per run)."""

    name: str
    tool: str
    argv: list[str]
    env: Callable[[], dict[str, str]] = field(default=lambda: dict(os.environ))
    note: str = ""
    shown: str = ""                # the command as the report prints it (default: argv joined)


def time_interleaved(commands: Sequence[Timed], repeat: int, warmup: int = 1) -> list[Measurement]:
    """Time each command `repeat` times, round-robin, so a load spike hits every tool alike.

    Warm-up runs first (not counted): the page cache, .pyc files and, for warm-cache commands, the
    cache itself are then what a user's second call sees.
    """
    for cmd in commands:
        for _ in range(warmup):
            time_once(cmd.argv, cmd.env())
    walls: dict[str, list[float]] = {c.name: [] for c in commands}
    cpus: dict[str, list[float]] = {c.name: [] for c in commands}
    for _ in range(repeat):
        for cmd in commands:
            wall, cpu = time_once(cmd.argv, cmd.env())
            walls[cmd.name].append(wall)
            cpus[cmd.name].append(cpu)
    return [Measurement(name=c.name, tool=c.tool, unit="s", better="lower", wall=Stats.of(walls[c.name]),
                        cpu=Stats.of(cpus[c.name]), command=c.shown or shown(c.argv), note=c.note)
            for c in commands]


def shown(argv: Sequence[str]) -> str:
    """A command line as a reader would type it from the repo root (paths inside the repo made relative)."""
    def rel(arg: str) -> str:
        path = Path(arg)
        return os.path.relpath(path, ROOT) if path.is_absolute() and path.is_relative_to(ROOT) else arg

    return shlex.join(rel(a) for a in argv)


def ratio(name: str, num: Measurement, den: Measurement) -> Ratio:
    """num / den on medians (wall and CPU)."""
    cpu = round(num.cpu.median / den.cpu.median, 3) if num.cpu and den.cpu and den.cpu.median else None
    return Ratio(name=name, numerator=num.name, denominator=den.name,
                 wall=round(num.wall.median / den.wall.median, 3), cpu=cpu, better=num.better, unit=num.unit)


# ----------------------------------------------------------------------------- peers


def ensure_package(module: str, requirement: str) -> None:
    """Install a peer or a chart library into this interpreter's environment with pip when missing.

    Why pip here and not a dependency: hpccm and matplotlib are only for measuring and drawing;
    ngcx's users never need them (issue 13: the bench installs its peers itself).
    """
    if importlib.util.find_spec(module) is not None:
        return
    print(f"bench: installing {requirement} with pip into {sys.prefix}", file=sys.stderr)
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", requirement],
                          capture_output=True, text=True, timeout=900)
    importlib.invalidate_caches()
    if proc.returncode != 0 or importlib.util.find_spec(module) is None:
        raise SuiteSkipped(f"cannot install {requirement} with pip: {proc.stderr.strip()[-300:]}")


def script(name: str) -> str:
    """A console script installed beside this interpreter (the venv's ngcx, hpccm ...)."""
    path = Path(sys.executable).parent / name
    if not path.is_file():
        raise SuiteSkipped(f"no {name} next to {sys.executable}: run the README's set-up (pip install -e .)")
    return str(path)


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
