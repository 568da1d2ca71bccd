"""cli: `ngcx --help`, `ngcx catalog ls`, `ngcx render pytorch:24.11` vs `hpccm --recipe` (same pins).

Each ngcx command is timed twice where a cache matters: warm (the second call of a user, the
validated catalog and the rendered Dockerfile cached) and cold (a fresh empty cache folder for
every run: full validation and templating, what the first call after an edit costs). Reference
rows say where the time goes: the interpreter alone, importing typer, and typer's pydantic-based
option coercion (typer >= 0.29 imports it to parse any option value); what-if rows run the same
ngcx commands with that coercion done without pydantic (bench/whatif_no_pydantic.py), to show what
it costs in figures from the same run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.core import ROOT, Measurement, SuiteResult, Timed, ensure_package, ratio, script, time_interleaved
from bench.peers import write_hpccm_recipe

REF = "pytorch:24.11"
HPCCM = "hpccm"
WHATIF = ROOT / "bench" / "whatif_no_pydantic.py"


def _env(work: Path, cache: str) -> Callable[[], dict[str, str]]:
    """The user's environment without their ngcx settings; `cache` = 'warm' (shared) or 'cold' (new each run)."""
    base = {k: v for k, v in os.environ.items() if k not in ("NGCX_BASE", "NGCX_DATA_DIR")}
    base.update(NGCX_CONFIG_DIR=str(work / "config"), NGCX_STATE_DIR=str(work / "state"))

    def make() -> dict[str, str]:
        folder = work / "cache-warm" if cache == "warm" else Path(tempfile.mkdtemp(prefix="cache-cold-", dir=work))
        return {**base, "XDG_CACHE_HOME": str(folder)}

    return make


def commands(work: Path, recipe: Path) -> list[Timed]:
    """What is timed, in the order of the table."""
    ngcx, hpccm, py = script("ngcx"), script(HPCCM), sys.executable
    warm, cold = _env(work, "warm"), _env(work, "cold")
    return [
        Timed("python -c pass (interpreter floor)", "python", [py, "-c", "pass"], warm,
              note="start-up every Python CLI pays"),
        Timed("python -c 'import typer'", "python", [py, "-c", "import typer"], warm,
              note="the CLI framework every ngcx command imports"),
        Timed("python -c 'import typer._adapters'", "python", [py, "-c", "import typer._adapters"], warm,
              note="typer + the pydantic coercion typer >= 0.29 loads for any option value"),
        Timed("ngcx --help", "ngcx", [ngcx, "--help"], warm),
        Timed("ngcx catalog ls", "ngcx", [ngcx, "catalog", "ls"], warm, note="warm cache"),
        Timed("ngcx catalog ls (cold cache)", "ngcx", [ngcx, "catalog", "ls"], cold,
              note="empty cache folder each run: full validation"),
        Timed(f"ngcx render {REF}", "ngcx", [ngcx, "render", REF], warm, note="warm cache"),
        Timed(f"ngcx render {REF} (cold cache)", "ngcx", [ngcx, "render", REF], cold,
              note="empty cache folder each run: validation + Jinja2"),
        Timed(f"what-if: ngcx render {REF}, typer's coercion without pydantic", "what-if",
              [py, str(WHATIF), "render", REF], warm,
              note="warm cache; not the shipped CLI: patches a private typer function (bench/whatif_no_pydantic.py)"),
        Timed("what-if: ngcx catalog ls, typer's coercion without pydantic", "what-if",
              [py, str(WHATIF), "catalog", "ls"], warm,
              note="warm cache; as above"),
        Timed(f"hpccm --recipe (equivalent of {REF})", "hpccm", [hpccm, "--recipe", str(recipe)], warm),
    ]


def _outputs(work: Path, recipe: Path) -> dict[str, object]:
    """Not timed: both tools really rendered (line counts), and warm == cold == no-cache output."""
    ngcx = script("ngcx")
    warm, cold = _env(work, "warm")(), _env(work, "cold")()
    outs = [subprocess.run([ngcx, "render", REF], capture_output=True, text=True, env=env, check=True).stdout
            for env in (warm, cold, {**warm, "XDG_CACHE_HOME": str(recipe)})]  # a file: no cache at all
    hp = subprocess.run([script(HPCCM), "--recipe", str(recipe)], capture_output=True, text=True, check=True).stdout
    from importlib.metadata import version

    return {"ngcx_dockerfile_lines": len(outs[0].splitlines()), "hpccm_dockerfile_lines": len(hp.splitlines()),
            "ngcx_outputs_identical_warm_cold_uncached": outs[0] == outs[1] == outs[2],
            "hpccm_version": version("hpccm"), "typer_version": version("typer"),
            "ngcx_version": version("ngcx")}


def _by_name(ms: list[Measurement]) -> dict[str, Measurement]:
    return {m.name: m for m in ms}


def run(result: SuiteResult, work: Path, out: Path) -> None:
    """Fill result with the timings, the ngcx / hpccm ratios and the notes that explain a loss."""
    ensure_package(HPCCM, "hpccm")
    recipe = write_hpccm_recipe(REF, out / "peers")
    result.extra.update(_outputs(work, recipe))
    result.extra["hpccm_recipe"] = os.path.relpath(recipe, ROOT)
    result.measurements = time_interleaved(commands(work, recipe), result.repeat)
    m = _by_name(result.measurements)
    hp = m[f"hpccm --recipe (equivalent of {REF})"]
    result.ratios = [
        ratio(f"ngcx render {REF} / hpccm --recipe", m[f"ngcx render {REF}"], hp),
        ratio(f"ngcx render {REF} (cold cache) / hpccm --recipe", m[f"ngcx render {REF} (cold cache)"], hp),
        ratio("ngcx catalog ls / hpccm --recipe", m["ngcx catalog ls"], hp),
        ratio("ngcx --help / hpccm --recipe", m["ngcx --help"], hp),
    ]
    result.notes = notes(m, hp)


def notes(m: dict[str, Measurement], hp: Measurement) -> list[str]:
    """Why ngcx loses where it does, in figures from this same run, and what would fix it."""
    floor, typer, adapters = (m["python -c pass (interpreter floor)"], m["python -c 'import typer'"],
                              m["python -c 'import typer._adapters'"])
    warm, cold = m[f"ngcx render {REF}"], m[f"ngcx render {REF} (cold cache)"]
    whatif = m[f"what-if: ngcx render {REF}, typer's coercion without pydantic"]
    out = [f"The cache saves {cold.cpu.median - warm.cpu.median:.3f} s CPU per `ngcx render` "
           f"({cold.cpu.median:.3f} -> {warm.cpu.median:.3f} s): no pydantic validation, no Jinja2.",
           "`ngcx CMD` imports and registers only the module that owns CMD (cli/main.py COMMAND_OWNERS); "
           "`ngcx --help`, no command and an unknown command still register all 15."]
    if warm.cpu.median > hp.cpu.median:
        out.append(
            f"ngcx render (warm) takes {warm.cpu.median / hp.cpu.median:.2f}x hpccm's CPU ({warm.cpu.median:.3f} "
            f"vs {hp.cpu.median:.3f} s). In this run the interpreter alone is {floor.cpu.median:.3f} s, importing "
            f"typer {typer.cpu.median:.3f} s, typer with its pydantic coercion {adapters.cpu.median:.3f} s. The "
            f"what-if row, the same command with typer's coercion done without pydantic, takes "
            f"{whatif.cpu.median:.3f} s ({whatif.cpu.median / hp.cpu.median:.2f}x hpccm): what is left is typer "
            ">= 0.29, which requires pydantic and builds a pydantic TypeAdapter for every parameter that is not a "
            "boolean flag, even one left at its default None (typer.core._TyperParameter.process_value); no public "
            "setting turns that off (a parser= callback goes through pydantic too). Closing it means pinning "
            "typer < 0.29, patching typer's private build_runtime_param (what the what-if does), or parsing the "
            "command line without typer for hot commands: each a design decision, left to the maintainers.")
    ls = m["ngcx catalog ls"]
    if ls.cpu.median > warm.cpu.median:
        out.append(f"`ngcx catalog ls` costs {ls.cpu.median - warm.cpu.median:.3f} s CPU more than `ngcx render`: "
                   "importing rich and laying out its table (cli/output.py); `--json` skips it.")
    return out
