"""cli: `ngcx --help`, `ngcx catalog ls`, `ngcx render pytorch:24.11` vs `hpccm --recipe` (same pins).

Each ngcx command is timed where a cache matters: warm (the second call of a user, the validated
catalog and the rendered Dockerfile cached), cold (a fresh empty cache folder for every run: a first
call after installing ngcx, which reads the validated catalog and the checked image.yaml shipped with
it, and the shipped catalog's Dockerfiles rendered ahead of time) and cold with an edited catalog (the shipped
one plus a comment, other bytes: full validation, what the first call after an edit costs). Reference
rows say where the time goes: the interpreter alone, importing typer, and typer's pydantic-based
option coercion (typer >= 0.29 imports it to parse any option value); and `ngcx render -- REF`,
the same render through typer's parser (ngcx.fastpath leaves lines with `--` to typer), shows in
figures from the same run what the fast path saves.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..core import ROOT, Measurement, SuiteResult, Timed, ensure_package, ratio, script, shown, time_interleaved
from .peers import write_hpccm_recipe

REF = "pytorch:24.11"
HPCCM = "hpccm"
EDITED = "edited-registry.yaml"   # written in the run's work folder: registry.yaml plus one comment line
OWN_BASE = "registry.example.com/team/base:1"   # a base no seeded Dockerfile has: the render itself, timed


def _env(work: Path, cache: str) -> Callable[[], dict[str, str]]:
    """The user's environment without their ngcx settings; `cache` = 'warm' (shared) or 'cold' (new each run)."""
    base = {k: v for k, v in os.environ.items() if k not in ("NGCX_BASE", "NGCX_DATA_DIR")}
    base.update(NGCX_CONFIG_DIR=str(work / "config"), NGCX_STATE_DIR=str(work / "state"))

    def make() -> dict[str, str]:
        folder = work / "cache-warm" if cache == "warm" else Path(tempfile.mkdtemp(prefix="cache-cold-", dir=work))
        return {**base, "XDG_CACHE_HOME": str(folder)}

    return make


def edited_catalog(work: Path) -> Path:
    """The shipped catalog with one comment more: the same releases, other bytes (no seed, no cache entry)."""
    from ngcx.core import paths

    file = work / EDITED
    file.write_text(paths.registry_file().read_text(encoding="utf-8") + "# edited\n", encoding="utf-8")
    return file


def commands(work: Path, recipe: Path) -> list[Timed]:
    """What is timed, in the order of the table."""
    ngcx, hpccm, py = script("ngcx"), script(HPCCM), sys.executable
    warm, cold, edited = _env(work, "warm"), _env(work, "cold"), str(edited_catalog(work))
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
              note="empty cache folder each run: the shipped catalog's seed"),
        Timed("ngcx catalog ls (cold cache, edited catalog)", "ngcx", [ngcx, "catalog", "ls", "--catalog", edited],
              cold, note="empty cache folder each run, a catalog ngcx did not ship: full validation",
              shown=shown([ngcx, "catalog", "ls", "--catalog", EDITED])),
        Timed(f"ngcx render {REF}", "ngcx", [ngcx, "render", REF], warm, note="warm cache"),
        Timed(f"ngcx render {REF} (cold cache)", "ngcx", [ngcx, "render", REF], cold,
              note="empty cache folder each run: the seeds (catalog, image.yaml, rendered Dockerfiles)"),
        Timed(f"ngcx render {REF} (cold cache, edited catalog)", "ngcx", [ngcx, "render", REF, "--catalog", edited],
              cold, note="empty cache folder each run, a catalog ngcx did not ship: validation (same releases: the "
                         "seeded Dockerfiles)", shown=shown([ngcx, "render", REF, "--catalog", EDITED])),
        Timed(f"ngcx render {REF} --base {OWN_BASE} (cold cache)", "ngcx", [ngcx, "render", REF, "--base", OWN_BASE],
              cold, note="empty cache folder each run, a base of the user's own: no seeded Dockerfile, Jinja2 "
                         "renders from the compiled recipes"),
        Timed(f"ngcx render -- {REF} (through typer)", "ngcx", [ngcx, "render", "--", REF], warm,
              note="warm cache; a line ngcx.fastpath leaves to typer: what every render cost before it"),
        Timed(f"hpccm --recipe (equivalent of {REF})", "hpccm", [hpccm, "--recipe", str(recipe)], warm),
    ]


def _outputs(work: Path, recipe: Path) -> dict[str, object]:
    """Not timed: both tools really rendered (line counts), and warm == cold == no-cache output."""
    ngcx = script("ngcx")
    warm, cold = _env(work, "warm")(), _env(work, "cold")()
    outs = [subprocess.run([ngcx, "render", REF], capture_output=True, text=True, env=env, check=True).stdout
            for env in (warm, cold, {**warm, "XDG_CACHE_HOME": str(recipe)})]  # a file: no cache at all
    outs.append(subprocess.run([ngcx, "render", REF, "--catalog", str(edited_catalog(work))], capture_output=True,
                               text=True, env=_env(work, "cold")(), check=True).stdout)
    typer_out = subprocess.run([ngcx, "render", "--", REF], capture_output=True, text=True, env=warm, check=True).stdout
    hp = subprocess.run([script(HPCCM), "--recipe", str(recipe)], capture_output=True, text=True, check=True).stdout
    from importlib.metadata import version

    return {"ngcx_dockerfile_lines": len(outs[0].splitlines()), "hpccm_dockerfile_lines": len(hp.splitlines()),
            "ngcx_outputs_identical_warm_cold_uncached_edited": outs[0] == outs[1] == outs[2] == outs[3],
            "ngcx_fastpath_output_identical_to_typer_path": outs[0] == typer_out,
            "hpccm_version": version("hpccm"), "typer_version": version("typer"),
            "ngcx_version": version("ngcx")}


def _by_name(ms: list[Measurement]) -> dict[str, Measurement]:
    return {m.name: m for m in ms}


def byte_compile() -> bool:
    """Byte-compile ngcx's own modules, as `pip install` does for hpccm's; True when this machine needed it.

    Why: pip compiles a wheel's modules at install time, but ngcx is installed editable, and where
    PYTHONDONTWRITEBYTECODE is set (these machines set it) Python never writes ngcx's .pyc files, so
    every call would compile ~12 modules from source (~0.015 s) that hpccm loads compiled. Python
    still reads .pyc files that exist; they live in the git-ignored __pycache__ folders.
    """
    needed = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "cli"), str(ROOT / "runtime")],
                   check=True, capture_output=True)
    return needed


def run(result: SuiteResult, work: Path, out: Path) -> None:
    """Fill result with the timings, the ngcx / hpccm ratios and the notes that explain a loss."""
    ensure_package(HPCCM, "hpccm")
    result.extra["byte_compiled_because_PYTHONDONTWRITEBYTECODE"] = byte_compile()
    recipe = write_hpccm_recipe(REF)
    result.extra.update(_outputs(work, recipe))
    result.extra["hpccm_recipe"] = os.path.relpath(recipe, ROOT)
    result.measurements = time_interleaved(commands(work, recipe), result.repeat)
    m = _by_name(result.measurements)
    hp = m[f"hpccm --recipe (equivalent of {REF})"]
    result.ratios = [
        ratio(f"ngcx render {REF} / hpccm --recipe", m[f"ngcx render {REF}"], hp),
        ratio(f"ngcx render {REF} (cold cache) / hpccm --recipe", m[f"ngcx render {REF} (cold cache)"], hp),
        ratio(f"ngcx render {REF} (cold cache, edited catalog) / hpccm --recipe",
              m[f"ngcx render {REF} (cold cache, edited catalog)"], hp),
        ratio(f"ngcx render {REF} --base (cold cache) / hpccm --recipe",
              m[f"ngcx render {REF} --base {OWN_BASE} (cold cache)"], hp),
        ratio("ngcx catalog ls / hpccm --recipe", m["ngcx catalog ls"], hp),
        ratio("ngcx --help / hpccm --recipe", m["ngcx --help"], hp),
    ]
    result.notes = notes(m, hp)


def notes(m: dict[str, Measurement], hp: Measurement) -> list[str]:
    """Where the time goes, in figures from this same run; why ngcx loses where it does, and what would fix it."""
    floor, typer, adapters = (m["python -c pass (interpreter floor)"], m["python -c 'import typer'"],
                              m["python -c 'import typer._adapters'"])
    warm, cold = m[f"ngcx render {REF}"], m[f"ngcx render {REF} (cold cache)"]
    edited = m[f"ngcx render {REF} (cold cache, edited catalog)"]
    own_base = m[f"ngcx render {REF} --base {OWN_BASE} (cold cache)"]
    via_typer, ls, helptext = m[f"ngcx render -- {REF} (through typer)"], m["ngcx catalog ls"], m["ngcx --help"]
    ls_cold, ls_edited = m["ngcx catalog ls (cold cache)"], m["ngcx catalog ls (cold cache, edited catalog)"]
    cpu = {name: x.cpu.median for name, x in
           {"floor": floor, "typer": typer, "adapters": adapters, "warm": warm, "cold": cold, "edited": edited,
            "own_base": own_base, "via_typer": via_typer, "ls": ls, "ls_cold": ls_cold, "ls_edited": ls_edited,
            "help": helptext, "hp": hp}.items()}
    out = ["Both tools load compiled modules: ngcx's are byte-compiled first (python -m compileall cli runtime), "
           "as pip does for hpccm at install; with PYTHONDONTWRITEBYTECODE set and no .pyc, Python would compile "
           "ngcx's sources on every call.",
           f"The caches save {cpu['edited'] - cpu['warm']:.3f} s CPU per `ngcx render` of an edited catalog "
           f"({cpu['edited']:.3f} -> {cpu['warm']:.3f} s): no validation.",
           "The fast path (cli/commands/fastpath.py: plain `render` and `catalog ls` lines parsed without typer) "
           f"saves {cpu['via_typer'] - cpu['warm']:.3f} s CPU: the same render through typer's parser takes "
           f"{cpu['via_typer']:.3f} s, of which importing typer is {cpu['typer'] - cpu['floor']:.3f} s and typer "
           f"0.29's pydantic coercion {cpu['adapters'] - cpu['typer']:.3f} s more. Outputs are identical "
           "(checked in this run and by tests/commands/test_fastpath.py)."]
    for name, key in ((f"ngcx render {REF} (warm)", "warm"), ("ngcx catalog ls (warm)", "ls")):
        verdict = "no slower than" if cpu[key] <= cpu["hp"] else "slower than"
        out.append(f"{name}: {cpu[key]:.3f} s CPU, {cpu[key] / cpu['hp']:.2f}x hpccm ({cpu['hp']:.3f} s): "
                   f"{verdict} hpccm; the interpreter alone is {cpu['floor']:.3f} s of both.")
    validation = cpu["ls_edited"] - cpu["ls_cold"]
    out.append(f"Cold cache, the first call after installing ngcx: {cpu['cold']:.3f} s, {cpu['cold'] / cpu['hp']:.2f}x "
               "hpccm. The shipped catalog comes validated (cli/catalog/registry.seed), the shipped image.yaml files "
               "checked (cli/render/recipes.seed) and its releases' Dockerfiles rendered (cli/render/dockerfiles.seed: "
               "every release x variant x base), each used only when its key matches the exact sources, code and "
               "Jinja2 (tests/render/test_precompiled.py): no pydantic-core, no YAML, no Jinja2 import; "
               f"{cpu['cold'] - cpu['warm']:+.3f} s against the warm call. A catalog, recipe or base of the user's "
               f"own renders from the recipes compiled to Python (cli/render/compiled/): with --base {OWN_BASE}, "
               f"{cpu['own_base']:.3f} s, {cpu['own_base'] / cpu['hp']:.2f}x hpccm, "
               f"{cpu['own_base'] - cpu['cold']:.3f} s of it Jinja2's import and the render itself.")
    out.append(f"Cold cache, edited catalog (the first call after the catalog changes): {cpu['edited']:.3f} s, "
               f"{cpu['edited'] / cpu['hp']:.2f}x hpccm: YAML (libyaml), the schema (pydantic-core, no pydantic "
               "models: catalog/schema.py says why) and every compatibility rule, paid once per catalog change and "
               "never skipped (the key is the catalog's sha256 and the validating code's); validation is "
               f"{validation:.3f} s of it (the catalog ls rows).")
    if cpu["help"] > cpu["hp"]:
        out.append(f"`ngcx --help` ({cpu['help']:.3f} s, {cpu['help'] / cpu['hp']:.2f}x hpccm) goes through "
                   "typer and registers all 15 command modules to list them; typer is the CLI framework and its "
                   "help is its job, so it stays there.")
    return out
