"""`ngcx.yaml` projects: a user's model and code built FROM a catalog release, with its guarantees.

spec.py loads and validates the file (parse -> schema -> rules -> complete, like the catalog);
init.py writes a new project, lock.py pins its requirements, build.py and context.py build it,
check.py tests it against examples.yaml, serving.py runs it; the commands (init, build, lock, test,
run, deploy) find the project with find_project_file().
"""

from __future__ import annotations

from pathlib import Path

PROJECT_FILE = "ngcx.yaml"


def find_project_file(where: Path | None = None) -> Path | None:
    """ngcx.yaml in `where` (a folder, or the file itself), or None when there is no project there."""
    where = where or Path.cwd()
    candidate = where if where.name == PROJECT_FILE or where.is_file() else where / PROJECT_FILE
    return candidate if candidate.is_file() else None
