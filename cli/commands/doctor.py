"""`ngcx doctor`: what this machine has for ngcx, one line per check (doctor/checks.py)."""

from __future__ import annotations

from dataclasses import asdict

import typer

from ..core.errors import CheckFailed
from ..doctor.checks import MARKS, run_checks


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_command)


def doctor_command(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """Check the engine, BuildKit, registries, NVIDIA driver/toolkit, disk and the offline base."""
    checks = run_checks()
    failed = any(c.required and c.status == "fail" for c in checks)
    if as_json:
        from ..core.output import emit_json

        emit_json({"ok": not failed, "checks": [asdict(c) for c in checks]})
    else:
        width = max(len(c.name) for c in checks)
        for c in checks:
            line = f"{MARKS[c.status]} {c.name.ljust(width)}  {c.detail}"
            if c.hint and c.status != "ok":
                line += f"  -> {c.hint}"
            print(line)
    if failed:
        raise CheckFailed()
