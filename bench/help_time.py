"""`ngcx --help` at two commits, interleaved: is the CLI's first screen still as fast (issue 46's check)?

usage: .venv/bin/python bench/help_time.py BEFORE [AFTER] [--rounds N]

BEFORE and AFTER are git revisions of this repository (AFTER: HEAD). Each is checked out as a git worktree under
a temporary folder and imported through a folder of two symlinks (ngcx -> WORKTREE/cli, ngcx_runtime ->
WORKTREE/runtime) on PYTHONPATH, so both run in this same interpreter and venv; the first round prints which
file each imported, to show the right one loaded. The rounds alternate the two, so a load spike hits both;
the figure varies with the machine's load and its disk cache (the first round is the coldest).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CALL = "import sys, ngcx.main; print(ngcx.main.__file__, file=sys.stderr); ngcx.main.main(['--help'])"


def _tree(rev: str, work: Path, name: str) -> Path:
    """A worktree of `rev` and the PYTHONPATH folder that imports it."""
    tree, path = work / name / "src", work / name / "path"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(tree), rev], check=True)
    path.mkdir(parents=True)
    (path / "ngcx").symlink_to(tree / "cli")
    (path / "ngcx_runtime").symlink_to(tree / "runtime")
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after", nargs="?", default="HEAD")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ngcx-help-") as tmp:
        work = Path(tmp)
        paths = {name: _tree(rev, work, name) for name, rev in (("before", args.before), ("after", args.after))}
        try:
            seconds: dict[str, list[float]] = {name: [] for name in paths}
            for round_ in range(args.rounds):
                for name in (list(paths) if round_ % 2 == 0 else list(paths)[::-1]):
                    env = {**os.environ, "PYTHONPATH": str(paths[name])}
                    started = time.perf_counter()
                    done = subprocess.run([sys.executable, "-c", CALL], env=env, capture_output=True, text=True)
                    seconds[name].append(time.perf_counter() - started)
                    if round_ == 0:
                        print(f"{name}: {done.stderr.splitlines()[0] if done.stderr else '?'} (exit {done.returncode})")
            for name, values in seconds.items():
                print(f"{name} ({getattr(args, name)}): median {statistics.median(values):.3f} s, "
                      f"min {min(values):.3f}, max {max(values):.3f} ({len(values)} runs)")
        finally:
            for name in paths:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(work / name / "src")],
                               capture_output=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
