"""One PNG per suite: each measurement's median as a bar, its min..max as a whisker, CPU as a dot.

Why this shape: the table gives the numbers; the chart is for seeing at a glance which tool is
faster and whether the spread (a noisy shared machine) is larger than the difference.
"""

from __future__ import annotations

from pathlib import Path

from bench.core import SuiteResult, ensure_package

COLORS = {"ngcx": "#76b900", "hpccm": "#1f77b4", "naive": "#d62728", "python": "#999999"}


def draw(result: SuiteResult, file: Path) -> Path | None:
    """Write the suite's chart; None for a skipped suite or one without measurements."""
    if result.status != "ok" or not result.measurements:
        return None
    ensure_package("matplotlib", "matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ms = result.measurements
    names = [m.name for m in ms]
    med = [m.wall.median for m in ms]
    err = [[m.wall.median - m.wall.min for m in ms], [m.wall.max - m.wall.median for m in ms]]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(ms) + 1.6))
    ax.barh(names, med, xerr=err, color=[COLORS.get(m.tool, "#ff7f0e") for m in ms], capsize=3,
            label="wall time, median (whisker: min..max)" if ms[0].unit == "s" else f"median {ms[0].unit}")
    cpu = [(m.cpu.median, i) for i, m in enumerate(ms) if m.cpu]
    if cpu:
        ax.plot([c for c, _ in cpu], [i for _, i in cpu], "k|", markersize=14, label="CPU time (user+sys), median")
    ax.invert_yaxis()
    unit = ms[0].unit
    ax.set_xlabel({"s": "seconds (lower is better)", "inf/s": "inferences/s (higher is better)"}.get(unit, unit))
    mach = result.machine
    ax.set_title(f"{result.suite}: {result.repeat} repetitions, {mach.get('cores')} cores, load "
                 f"{mach.get('load_average_before', ['?'])[0]} -> {mach.get('load_average_after', ['?'])[0]}"
                 f" ({result.started[:10]}, {mach.get('git_revision', '')})", fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(file, dpi=110)
    plt.close(fig)
    return file
