"""pip's refusals, as one line naming the requirement and the pin it would have replaced.

Why its own module: both `ngcx build` (the wheels step) and `ngcx lock` (pip --dry-run inside the
base image) install under the base's constraints; when pip's resolver gives up (ResolutionImpossible,
a package that does not exist, a replaced base package) its output is dozens of lines, and the
user needs the one that says which of THEIR requirements collided with which pinned package.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from ..core.errors import UserError

if TYPE_CHECKING:
    pass


CANNOT_INSTALL = re.compile(r"ERROR: Cannot install (?P<reqs>.+?) because these package versions")
DEPENDS = re.compile(r"^\s*(?P<pkg>\S+) (?P<ver>\S+) depends on (?P<dep>.+?)\s*$")
USER_REQ = re.compile(r"^\s*The user requested (?P<req>[^(].*?)\s*$")
CONSTRAINT = re.compile(r"^\s*The user requested \(constraint\) (?P<pin>.+?)\s*$")
NOT_FOUND = re.compile(r"ERROR: No matching distribution found for (?P<req>.+?)\s*$")
FROM_FILE = re.compile(r"-r \S+ \(line (\d+)\)")
REPLACED = re.compile(r"ngcx-replaced: (?P<what>.+)$")


def pip_problem(lines: list[str], base_ref: str, requirements: str = "") -> UserError | None:
    """pip's output (a failed wheels step or `ngcx lock`) -> one line naming the requirement and
    the pin it would break; None when it is not a resolution problem. `requirements` is the file pip
    read with -r, so "-r FILE (line 3)" is shown as the requirement written there."""
    reqs = requirements.splitlines()

    def named(match: re.Match) -> str:
        n = int(match.group(1))
        return reqs[n - 1].strip() if 0 < n <= len(reqs) else match.group(0)

    lines = [FROM_FILE.sub(named, line) for line in lines]
    text = "\n".join(lines)
    pins = [m.group("pin") for line in lines if (m := CONSTRAINT.match(line))]
    hint = (f"drop it, pick a version of it that works with what {base_ref} ships, or choose another base "
            "release (`ngcx catalog ls`)")
    if pins:
        wanted = CANNOT_INSTALL.search(text)
        requirement = wanted.group("reqs") if wanted else "?"
        dep = next((m for line in lines if (m := DEPENDS.match(line))), None)
        direct = next((m.group("req") for line in lines if (m := USER_REQ.match(line))), None)
        pin = _matching_pin(pins, dep.group("dep") if dep else direct or "")
        if dep is not None:
            via = f"{dep.group('pkg')} {dep.group('ver')}"
            through = "" if requirement.split("==")[0].lower() == dep.group("pkg").lower() else f" (through {via})"
            return UserError(f"requirement {requirement!r}{through} needs {dep.group('dep')}, but the base "
                             f"{base_ref} pins {pin}; it would replace a pinned package", hint=hint)
        return UserError(f"requirement {direct or requirement!r} would replace {pin}, pinned by the base {base_ref}",
                         hint=hint)
    missing = next((m.group("req") for line in lines if (m := NOT_FOUND.search(line))), None)
    if missing:
        return UserError(f"requirement {missing!r}: no matching distribution on the package index",
                         hint="check its name and version (and --pip-index-url)")
    replaced = next((m.group("what") for line in lines if (m := REPLACED.search(line))), None)
    if replaced:
        return UserError(f"the requirements replaced packages of the base {base_ref}: {replaced}",
                         hint="pin the requirement that pulled them to a version that works with the base")
    return None


def _matching_pin(pins: list[str], dep: str) -> str:
    """The constraint about the same package as dep (e.g. protobuf==7.36.2 for protobuf==3.20.2)."""
    from .spec import canonical

    name = canonical(re.split(r"[<>=!~ \[;]", dep.strip(), maxsplit=1)[0]) if dep else ""
    return next((p for p in pins if canonical(re.split(r"[<>=!~ ]", p, maxsplit=1)[0]) == name), pins[-1])


# ----------------------------------------------------------------------------- build
