"""What the project suite reports: its figures, ratios and notes, from the builds' own output.

Why apart from bench/suites/project.py: everything here is pure (build output, cache records and
image histories in, figures and sentences out), so tests/bench/test_bench_project.py checks it without
Docker; the suite keeps the flow that drives the engine. It borrows the build suite's history and
spread helpers (.build) inside the functions that use them.
"""

from __future__ import annotations

import re
import statistics
from typing import Any

from ..core import Measurement, Ratio, Stats, ratio

BASE_TAG = "ngcx/onnxruntime:25.08-runtime"
TOOLS = ("ngcx", "naive")
CASES = {
    "cold": ("cold build", "no layer cache (--no-cache), fresh project folder"),
    "code": ("rebuild after a code-only edit", "one comment line appended to handler.py"),
    "model": ("rebuild after a model change", "a new model.onnx of the same size (new weights, same shape)"),
    "package": ("rebuild after adding a package", "one more pure-Python package in requirements.txt"),
}
COMMANDS = {"ngcx": "ngcx build", "naive": "docker build -t TAG ."}


# ----------------------------------------------------------------------------- reading the builds


def wheels_step_cached(output: str) -> bool:
    """True when `ngcx build` reports its wheels step as served from the layer cache."""
    return re.search(r"cached\s+\[\d+/\d+\] wheels", output) is not None


def engine_seconds(output: str) -> float | None:
    """The seconds `ngcx build` reports for its own build ("built TAG ID SIZE in 3.3s"), None when absent."""
    m = re.search(r"\bin (\d+(?:\.\d+)?)s \(\d+/\d+ steps cached\)", output)
    return float(m.group(1)) if m else None


NGCX_STEP = re.compile(r"\[\d+/\d+\] (base|system packages|wheels|model|code|config)\b.*\((\w+)\)"
                       r"(?: (\d+(?:\.\d+)?)s)?\s*$")
PLAIN_HEAD = re.compile(r"^#(\d+) (?:\[(?:[\w.-]+ )?\d+/\d+\] (\w+)|(exporting to image)|\[internal\] (load build "
                        r"context))")
PLAIN_DONE = re.compile(r"^#(\d+) DONE (\d+(?:\.\d+)?)s")


def ngcx_steps(output: str) -> dict[str, float]:
    """Seconds per step of `ngcx build`'s progress lines ("✓ [3/7] wheels: ... (RUN) 2.1s"), keyed
    "LAYER INSTRUCTION" (e.g. "wheels RUN"); a cached or sub-0.05 s step counts 0. FROM is left out."""
    out: dict[str, float] = {}
    for line in output.splitlines():
        m = NGCX_STEP.search(line)
        if m and m.group(2) != "FROM":
            key = f"{m.group(1)} {m.group(2)}"
            out[key] = round(out.get(key, 0.0) + (0.0 if " cached " in line else float(m.group(3) or 0)), 3)
    return out


def plain_steps(output: str) -> dict[str, float]:
    """Seconds per step of `docker build --progress plain`, keyed by instruction (RUN, COPY, WORKDIR ...),
    "export" (exporting to image) and "context" (sending the build context); a cached step is not listed."""
    names: dict[str, str] = {}
    out: dict[str, float] = {}
    for line in output.splitlines():
        head = PLAIN_HEAD.match(line)
        if head:
            names[head.group(1)] = head.group(2) or ("export" if head.group(3) else "context")
            continue
        done = PLAIN_DONE.match(line)
        if done and done.group(1) in names:
            key = names[done.group(1)]
            out[key] = round(out.get(key, 0.0) + float(done.group(2)), 3)
    return out


def median_steps(runs: list[dict[str, float]]) -> dict[str, float]:
    """The median seconds of each step over the repetitions (a step absent from a run, cached, counts 0)."""
    keys = sorted({k for run in runs for k in run})
    return {k: round(statistics.median(run.get(k, 0.0) for run in runs), 3) for k in keys}


def project_records(records: list[dict[str, Any]], before: set[str], markers: set[str],
                    min_source_bytes: int) -> list[str]:
    """Build-cache records this run made that may go once its images are gone.

    Mine: new since the run began and (a) made by one of its RUN commands (`markers`) or stacked on a
    record one of them made, even an older one (a rebuild takes the wheels layer from whichever cached
    record has its key, and stacks its new model layer there), (b) the parent of one of those (the
    hand-written file's COPY . /app sits under its RUN), or (c) a build context BuildKit kept (`local
    source for context`) at least min_source_bytes large (one holding the model). Returned leaf first;
    the caller still skips what is shared or in use."""
    def marked(r: dict[str, Any]) -> bool:
        described = " ".join((r.get("Description") or "").split())
        return r.get("Type") == "regular" and any(f"-c {m}" in described for m in markers)

    roots = {r["ID"] for r in records if marked(r)}
    new = {r["ID"]: r for r in records if r["ID"] not in before}
    mine = set(roots) & set(new)
    grew = True
    while grew:
        grew = False
        for rid, r in new.items():
            if rid not in mine and r.get("Type") == "regular" and (r.get("Parent") in mine | roots):
                mine.add(rid)
                grew = True
    parents = {new[rid].get("Parent") for rid in mine}
    grew = True
    while grew:
        grew = False
        for rid in sorted(parents & set(new) - mine):
            if new[rid].get("Type") == "regular":
                mine.add(rid)
                parents.add(new[rid].get("Parent"))
                grew = True
    mine |= {rid for rid, r in new.items() if r.get("Type") == "source.local"
             and (r.get("Description") or "").startswith("local source for context")
             and int(r.get("Size") or 0) >= min_source_bytes}

    def depth(rid: str) -> int:
        n, seen = 0, set()
        while rid in new and rid not in seen:
            seen.add(rid)
            rid, n = new[rid].get("Parent") or "", n + 1
        return n

    return sorted(mine, key=lambda rid: (-depth(rid), rid))


def added_layers(history: list[dict[str, Any]], base_layers: int, n_layers: int) -> list[tuple[str, int]]:
    """(instruction, bytes) of each layer an image adds on top of its base, bottom first; [] when the
    history does not map onto the layers."""
    from .build import EMPTY_INSTRUCTIONS, layer_sizes

    sizes = layer_sizes(history, n_layers)
    if sizes is None:
        return []
    made = [e for e in reversed(history)
            if e.get("Size", 0) > 0 or not EMPTY_INSTRUCTIONS.match((e.get("CreatedBy") or "").strip())]
    return [(_instruction(e.get("CreatedBy") or ""), s) for e, s in zip(made, sizes, strict=True)][base_layers:]


def _instruction(created_by: str) -> str:
    """A history entry's instruction, short: "RUN pip install …", "COPY . /app"."""
    text = " ".join(created_by.replace("/bin/sh -c #(nop) ", "").removesuffix("# buildkit").split())
    text = re.sub(r"^(RUN )?(\|\d+ (\S+=\S* )*)?/bin/(ba)?sh( -o pipefail)? -c ", "RUN ", text)
    if text.startswith("RUN ") and "pip install" in text:
        return "RUN pip install …"
    return text if len(text) <= 48 else text[:47] + "…"


# ----------------------------------------------------------------------------- figures and notes


def figures(times: dict[str, dict[str, list[float]]], sizes: dict[str, list[int]],
             added: dict[str, list[int]]) -> list[Measurement]:
    ms = []
    for case, (label, note) in CASES.items():
        for tool in TOOLS:
            ms.append(Measurement(name=f"{tool}: {label}", tool=tool, unit="s", better="lower",
                                  wall=Stats.of(times[case][tool]), command=COMMANDS[tool], note=note))
    for tool in TOOLS:
        ms.append(Measurement(name=f"{tool}: image size", tool=tool, unit="bytes", better="lower",
                              wall=Stats.of(sizes[tool]), command=COMMANDS[tool],
                              note="docker image inspect .Size (uncompressed), after the package edit"))
    for tool in TOOLS:
        ms.append(Measurement(name=f"{tool}: bytes added to the base", tool=tool, unit="bytes", better="lower",
                              wall=Stats.of(added[tool]), command=COMMANDS[tool],
                              note=f"image size minus {BASE_TAG}'s"))
    return ms


def ratios(ms: list[Measurement]) -> list[Ratio]:
    by = {m.name: m for m in ms}
    out = []
    for label in ("rebuild after a code-only edit", "rebuild after a model change", "rebuild after adding a package",
                  "cold build", "bytes added to the base", "image size"):
        num, den = by[f"ngcx: {label}"], by[f"naive: {label}"]
        if den.wall.median:
            out.append(ratio(f"{label}: ngcx / hand-written", num, den))
    return out


def _mb(n: float) -> str:
    """Bytes as a reader compares them: MB for a model, KB for a wheel, bytes for a handler."""
    if n >= 1e5:
        return f"{n / 1e6:,.1f} MB"
    return f"{n / 1e3:,.1f} KB" if n >= 1e3 else f"{n:,.0f} bytes"


def notes(ms: list[Measurement], steps: dict[str, dict[str, dict[str, float]]], client: dict[str, float],
          layers: dict[str, list[tuple[str, int]]], served: dict[str, Any], model_bytes: int) -> list[str]:
    """Why ngcx wins or loses each figure, from this run's numbers, and what would fix a loss.

    `steps`: case -> tool -> step -> median seconds (ngcx: "wheels RUN", ...; hand-written: "RUN", "COPY",
    "export"); `client`: case -> median seconds of `ngcx build` outside the engine build it reports (Python
    start, project and catalog load, the post-build checks and state record); `layers`: (instruction, bytes)
    each image adds on top of the base; `served`: the serve check."""
    by = {m.name: m for m in ms}
    labels = {case: label for case, (label, _) in CASES.items()}

    def medians(case: str) -> tuple[float, float]:
        return by[f"ngcx: {labels[case]}"].wall.median, by[f"naive: {labels[case]}"].wall.median

    def verdict(case: str) -> str:
        ours, theirs = by[f"ngcx: {labels[case]}"].wall, by[f"naive: {labels[case]}"].wall
        spread = "ranges overlap" if ours.overlaps(theirs) else "ranges apart"
        if ours.median <= theirs.median:
            return f"ngcx {theirs.median / ours.median:.1f}x as fast ({spread})"
        return f"ngcx {ours.median / theirs.median - 1:.0%} slower ({spread})"

    def head(case: str, name: str) -> str:
        ours, theirs = medians(case)
        return f"{name}: ngcx {ours:.2f} s, hand-written {theirs:.2f} s, {verdict(case)}."

    out = [f"Same model (an ONNX MLP, {_mb(model_bytes)}), handler, requirements.txt, base image ({BASE_TAG}) "
           "and engine for both; a figure is the median of the repetitions, the two tools alternating which builds "
           "first; every edit is new to this run. ngcx's time is its whole `ngcx build` process, the hand-written "
           "one's its whole `docker build`."]
    out.append(head("code", "Code-only edit") + " ngcx orders its layers wheels -> model -> code -> config and "
               "its context re-sends only the changed file, so only the code and config COPY steps run; the "
               "hand-written COPY . /app holds model, code and requirements in one layer, so a code edit re-copies "
               f"the model{_took(steps['code']['naive'], 'COPY')}, re-runs pip install"
               f"{_took(steps['code']['naive'], 'RUN')} and exports that layer again"
               f"{_took(steps['code']['naive'], 'export')}.")
    out.append(head("model", "Model change") + " Both copy the new model; ngcx keeps its wheels layer (below the "
               "model), the hand-written file re-runs pip install too"
               f"{_took(steps['model']['naive'], 'RUN')}.")
    out.append(head("package", "Added package") + " Both re-run pip and re-copy the model: ngcx's wheels layer "
               "sits below the model on purpose (the other order would re-run pip on every model change).")
    cold = head("cold", "Cold build") + " Both run every step."
    if steps["cold"]["ngcx"].get("base RUN"):
        cold += (" ngcx's first step (RUN mkdir, the same for every project on a base) runs here only because of "
                 "--no-cache: a user's first build of a new project takes it from the cache of any earlier project "
                 "on that base.")
    out.append(cold)
    lost = [case for case in CASES if medians(case)[0] > medians(case)[1]]
    if lost:
        out += _loss_notes(lost, medians, steps, client)
    out += _size_and_serve_notes(by, layers, served)
    return out


def _took(step_seconds: dict[str, float], key: str) -> str:
    return f" ({step_seconds[key]:.2f} s)" if step_seconds.get(key) else ""


def _loss_notes(lost: list[str], medians: Any, steps: dict[str, dict[str, dict[str, float]]],
                client: dict[str, float]) -> list[str]:
    """Where ngcx is slower: how much of the difference each of ngcx's own costs explains, and the fixes."""
    parts, fixes = [], []
    for case in lost:
        ours, theirs = medians(case)
        own = steps[case]["ngcx"]
        found = [f"{client[case]:.2f} s in the client before and after the engine build"] if case in client else []
        if own.get("wheels RUN") and steps[case]["naive"].get("RUN"):
            found.append(f"its wheels RUN {own['wheels RUN']:.2f} s against the hand-written pip RUN's "
                         f"{steps[case]['naive']['RUN']:.2f} s")
        if own.get("base RUN"):
            found.append(f"a RUN mkdir the hand-written file has no need of, {own['base RUN']:.2f} s")
        parts.append(f"{CASES[case][0]} by {ours - theirs:.2f} s" + (f" ({'; '.join(found)})" if found else ""))
    if any(case in client for case in lost):
        fixes.append("a lighter `ngcx build` client (it starts Python, loads and checks ngcx.yaml against the "
                     "catalog, and after the build checks the image sits on the base's layers and records it)")
    if any(steps[c]["ngcx"].get("wheels RUN") for c in lost):
        fixes.append("a wheels step with one pip start: it runs pip install and then pip check (the "
                     "hand-written file has no check; ngcx's fails the build on a broken dependency instead of the "
                     "first request), and reads the base's package set before and after with importlib.metadata "
                     "(a twentieth of a pip start); dropping the check would trade that guarantee for ~0.5 s")
    if any(steps[c]["ngcx"].get("base RUN") for c in lost):
        fixes.append("no RUN mkdir in the project Dockerfile (COPY and WORKDIR create their folders; the plan "
                     "cache folder could ship in the catalog image)")
    return ["ngcx is slower on " + "; ".join(parts) + " (in brackets: ngcx's own costs, which the hand-written "
            "build does not have). What would close it (not done here): " + "; ".join(fixes) + "."]


def _size_and_serve_notes(by: dict[str, Measurement], layers: dict[str, list[tuple[str, int]]],
                          served: dict[str, Any]) -> list[str]:
    out = []
    ours, theirs = (by[f"{t}: bytes added to the base"].wall.median for t in TOOLS)
    if layers:
        shown = {t: ", ".join(f"`{ins}` {_mb(b)}" for ins, b in layers.get(t, []) if b) or "?" for t in TOOLS}
        out.append(f"On top of the base: ngcx adds {_mb(ours)}, the hand-written file {_mb(theirs)} "
                   f"({_mb(abs(ours - theirs))} {'more' if ours > theirs else 'less'} for ngcx). Non-empty layers "
                   f"(first repetition): ngcx {shown['ngcx']}; hand-written {shown['naive']}.")
    if served:
        out.append(f"Serve check (untimed, first repetition): both images served model '{served['model']}' and "
                   f"answered one KServe v2 inference with output {served['output_shape']}; the two answers differ "
                   f"by at most {served['max_abs_diff']:.2g}.")
    return out
