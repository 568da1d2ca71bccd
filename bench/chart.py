"""One PNG per suite: each measurement's median as a bar, its min..max as a whisker, CPU as a dot.

Why this shape: the table gives the numbers; the chart is for seeing at a glance which tool is
faster and whether the spread (a noisy shared machine) is larger than the difference.
"""

from __future__ import annotations

from pathlib import Path

from .core import SuiteResult, ensure_package

COLORS = {"ngcx": "#76b900", "hpccm": "#1f77b4", "naive": "#d62728", "python": "#999999"}


def draw(result: SuiteResult, file: Path) -> Path | None:
    """Write the suite's chart; None for a skipped suite or one without measurements."""
    if result.status != "ok" or not result.measurements:
        return None
    ensure_package("matplotlib", "matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list] = {}
    for m in result.measurements:  # one panel per unit: seconds and bytes on one axis would say nothing
        groups.setdefault(m.unit, []).append(m)
    rows = [len(g) for g in groups.values()]
    fig, axes = plt.subplots(len(groups), 1, figsize=(10, 0.45 * sum(rows) + 1.6 * len(groups)), squeeze=False,
                             gridspec_kw={"height_ratios": rows})
    for ax, (unit, ms) in zip(axes[:, 0], groups.items(), strict=True):
        _panel(ax, unit, ms)
    mach = result.machine
    axes[0, 0].set_title(f"{result.suite}: {result.repeat} repetitions, {mach.get('cores')} cores, load "
                         f"{mach.get('load_average_before', ['?'])[0]} -> {mach.get('load_average_after', ['?'])[0]}"
                         f" ({result.started[:10]}, {mach.get('git_revision', '')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(file, dpi=110)
    plt.close(fig)
    return file


SCALE = {"bytes": (1e9, "GB (uncompressed)")}


def _panel(ax, unit: str, ms: list) -> None:
    """Bars (median) with min..max whiskers, CPU medians as ticks, for measurements of one unit."""
    div, label = SCALE.get(unit, (1.0, unit))
    names = [m.name for m in ms]
    med = [m.wall.median / div for m in ms]
    err = [[(m.wall.median - m.wall.min) / div for m in ms], [(m.wall.max - m.wall.median) / div for m in ms]]
    ax.barh(names, med, xerr=err, color=[COLORS.get(m.tool, "#ff7f0e") for m in ms], capsize=3,
            label="wall time, median (whisker: min..max)" if unit == "s" else f"median {label}")
    cpu = [(m.cpu.median, i) for i, m in enumerate(ms) if m.cpu]
    if cpu:
        ax.plot([c for c, _ in cpu], [i for _, i in cpu], "k|", markersize=14, label="CPU time (user+sys), median")
    ax.invert_yaxis()
    ax.set_xlabel({"s": "seconds (lower is better)", "inf/s": "inferences/s (higher is better)"}.get(unit, label))
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
