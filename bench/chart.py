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

    if result.suite == "serve-peers":
        return _peers(plt, result, file)
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


PEER_COLORS = {"ngcx": "#76b900", "kserve": "#1f77b4", "mlserver": "#9467bd", "litserve": "#ff7f0e",
               "rayserve": "#d62728"}


def _peers(plt, result: SuiteResult, file: Path) -> Path:
    """serve-peers: per point, one bar per server (req/s above, p50 below), whiskers min..max.

    Why its own shape: the generic one-bar-per-measurement chart is 150 rows for this suite; a
    grouped bar per point shows at a glance who serves most at each load."""
    import numpy as np

    figs: dict[str, dict[str, dict]] = {"rps": {}, "p50_ms": {}}
    for m in result.measurements:                      # "<peer>: <model> <encoding> c<clients> <figure>"
        peer, rest = m.name.split(": ", 1)
        point, figure = rest.rsplit(" ", 1)
        if figure in figs:
            figs[figure].setdefault(point, {})[peer] = m.wall
    peers = [p for p in PEER_COLORS if any(p in v for f in figs.values() for v in f.values())]
    points = sorted(figs["rps"], key=lambda p: (p.split()[0], p.split()[1], int(p.split()[2][1:])))
    fig, axes = plt.subplots(2, 1, figsize=(13, 8))
    width = 0.8 / max(len(peers), 1)
    for ax, (figure, label) in zip(axes, (("rps", "requests/s (higher is better)"),
                                          ("p50_ms", "p50 latency, ms (lower is better, log scale)")), strict=True):
        for i, peer in enumerate(peers):
            xs, med, lo, hi = [], [], [], []
            for j, point in enumerate(points):
                st = figs[figure].get(point, {}).get(peer)
                if st is not None:
                    xs.append(j + (i - (len(peers) - 1) / 2) * width)
                    med.append(st.median)
                    lo.append(st.median - st.min)
                    hi.append(st.max - st.median)
            ax.bar(xs, med, width, yerr=[lo, hi], capsize=2, color=PEER_COLORS[peer], label=peer)
        ax.set_xticks(np.arange(len(points)), points, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(label)
        if figure == "p50_ms":
            ax.set_yscale("log")
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8, ncol=len(peers))
    mach = result.machine
    axes[0].set_title(f"serve-peers: medians of {result.repeat} rounds (whiskers min..max), {mach.get('cores')} cores "
                      f"({result.started[:10]}, {mach.get('git_revision', '')})", fontsize=10)
    fig.tight_layout()
    fig.savefig(file, dpi=90)
    plt.close(fig)
    return file
