"""Project rebuild times: cold build, then a code-only edit, a model change and an added package.

Why a benchmark and not a timed test: issue 9 asks for a code-only rebuild <= 5 s on this machine,
and a timed assertion on a shared 2-core box is flaky; the tests check the cause instead (only
the 'code' layer re-runs, the model layer keeps its digest). Run from the repo root:

    .venv/bin/python bench/project_rebuild.py [--reps 3] [--model-mb 100] [--out bench/results/project_rebuild.json]

Each repetition starts a fresh project (new name, new state folder) on onnxruntime:25.08 (which
must be built), an ONNX MLP of about --model-mb MB, a handler and `six`:
  cold     `ngcx build --no-cache` (the base is there; every project layer is built)
  code     handler.py edited                  -> only 'code' and 'config' re-run
  model    a new model file                   -> 'model' and after re-run, wheels stay cached
  package  one more pure-Python package added -> 'wheels' and after re-run
Each edit is unique to its repetition, so no step is served from an earlier repetition's cache.
Times are the wall time of the whole `ngcx build` process, i.e. what the user waits for.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "runtime"))
CASES = ("cold", "code", "model", "package")
ADDED = ("idna", "attrs", "toml", "iniconfig", "pyparsing")   # small pure-Python wheels, one per repetition
TARGET_CODE_S = 5.0
DOCKER = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else "docker"


def make_model(path: Path, mb: float, seed: int) -> None:
    """An MLP whose weights make it about `mb` MB (features 32, 10 classes: 168 bytes per hidden unit)."""
    import models

    hidden = max(64, int(mb * 1e6 / 168)) + seed
    models.mlp(path, hidden=hidden)


def write_project(root: Path, name: str, mb: float, seed: int) -> None:
    root.mkdir(parents=True)
    make_model(root / "model.onnx", mb, seed)
    (root / "handler.py").write_text("class Handler:\n    def load(self, context):\n"
                                     "        self.engine = context.engine\n\n"
                                     "    def predict(self, inputs):\n        return self.engine.infer(inputs)\n")
    (root / "ngcx.yaml").write_text(f"name: {name}\nbase: onnxruntime:25.08\npython_packages: [six]\n"
                                    "model: {path: model.onnx}\nhandler: handler:Handler\n")


def timed_build(root: Path, env: dict[str, str], *extra: str) -> tuple[float, str]:
    """Wall seconds of `ngcx build` in the project folder, and its 'rebuilding ...' report line."""
    start = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "ngcx", "build", *extra], cwd=root, env=env,
                            capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        raise SystemExit(f"ngcx build failed in {root}:\n{result.stderr[-3000:]}")
    report = next((line for line in result.stdout.splitlines()
                   if line.startswith(("rebuilding", "building every", "all layers"))), "")
    return wall, report


def one_repetition(rep: int, work: Path, mb: float) -> tuple[dict[str, float], dict[str, str], str]:
    name = f"bench-{secrets.token_hex(3)}-{rep}"
    root = work / name
    env = {**os.environ, "NGCX_STATE_DIR": str(work / f"state-{rep}"), "NGCX_BASE": "offline"}
    write_project(root, name, mb, seed=rep)
    times, reports = {}, {}
    times["cold"], reports["cold"] = timed_build(root, env, "--no-cache")
    with open(root / "handler.py", "a") as f:
        f.write(f"# edit {name}\n")
    times["code"], reports["code"] = timed_build(root, env)
    make_model(root / "model.onnx", mb, seed=100 + rep)
    times["model"], reports["model"] = timed_build(root, env)
    text = (root / "ngcx.yaml").read_text()
    (root / "ngcx.yaml").write_text(text.replace("[six]", f"[six, {ADDED[rep % len(ADDED)]}]"))
    times["package"], reports["package"] = timed_build(root, env)
    return times, reports, f"ngcx-app/{name}:latest"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--model-mb", type=float, default=100.0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "project_rebuild.json")
    args = parser.parse_args()

    load_before = os.getloadavg()
    runs: dict[str, list[float]] = {c: [] for c in CASES}
    reports: list[dict[str, str]] = []
    tags = []
    work = Path(tempfile.mkdtemp(prefix="ngcx-bench-project-"))
    try:
        for rep in range(args.reps):
            times, lines, tag = one_repetition(rep, work, args.model_mb)
            tags.append(tag)
            reports.append(lines)
            for case in CASES:
                runs[case].append(round(times[case], 2))
            print(f"rep {rep + 1}: " + ", ".join(f"{c} {times[c]:.1f}s" for c in CASES), flush=True)
    finally:
        for tag in tags:
            subprocess.run([DOCKER, "image", "rm", "-f", tag], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    summary = {c: {"min": min(v), "median": statistics.median(v), "max": max(v), "runs": v} for c, v in runs.items()}
    docker = subprocess.run([DOCKER, "version", "--format", "{{.Server.Version}}"], capture_output=True, text=True)
    result = {
        "command": f".venv/bin/python bench/project_rebuild.py --reps {args.reps} --model-mb {args.model_mb:g}",
        "what": "wall seconds of `ngcx build` in a project folder (onnxruntime:25.08 base, ONNX MLP, handler, six)",
        "model_mb": args.model_mb,
        "machine": {"cpu_count": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load_before],
                    "loadavg_after": [round(x, 2) for x in os.getloadavg()], "platform": platform.platform(),
                    "docker": docker.stdout.strip()},
        "seconds": summary,
        "target_code_edit_s": TARGET_CODE_S,
        "code_edit_within_target": summary["code"]["max"] <= TARGET_CODE_S,
        "reports": reports,
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    for case in CASES:
        s = summary[case]
        print(f"{case:8} min {s['min']:6.2f}s  median {s['median']:6.2f}s  max {s['max']:6.2f}s")
    print(f"cores {os.cpu_count()}, load {load_before} -> {os.getloadavg()}; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
