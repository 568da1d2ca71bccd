"""Spec of the `ngcx` entry point: every stage shows up in --help, start-up stays light.

Why the import check instead of a timer: `ngcx --help` must answer in < 0.3 s (the issue), and
what makes it slow is importing pydantic, Jinja2, the Docker SDK or cloud SDKs at start-up. A
wall-clock assertion would be flaky on a loaded CI box; "these modules are not imported" is exact.
The time itself is measured by bench/cli_startup.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import typer

from ngcx.main import stage_modules

HEAVY = ("pydantic", "jinja2", "docker", "boto3", "botocore", "aliyunsdkcore", "rich", "yaml",
         "numpy", "requests")


def ngcx(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "ngcx", *args], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


# What a user can type today; written out here (not read from COMMAND_MODULES) so a deleted
# command module fails these tests instead of silently shrinking `ngcx --help`.
COMMANDS = {"init", "catalog", "render", "base", "build", "lock", "test", "push", "login", "logout", "run",
            "deploy", "deployments", "hosts", "images", "doctor"}


def implemented_commands() -> dict[str, list[str]]:
    """module -> the command / group names it registers."""
    out: dict[str, list[str]] = {}
    for name, module in stage_modules():
        app = typer.Typer()
        module.register(app)
        names = [c.name or c.callback.__name__ for c in app.registered_commands]
        names += [g.name for g in app.registered_groups]
        out[name] = names
    return out


def test_help_lists_every_registered_command() -> None:
    proc = ngcx("--help")
    assert proc.returncode == 0, proc.stderr
    listed = {line.split()[0] for line in proc.stdout.split("Commands:")[1].splitlines() if line.strip()}
    assert listed == COMMANDS
    assert listed == {n for names in implemented_commands().values() for n in names}


def test_a_missing_command_module_is_an_error_not_a_silent_gap(monkeypatch) -> None:
    import ngcx.main

    monkeypatch.setattr(ngcx.main, "COMMAND_MODULES", (*ngcx.main.COMMAND_MODULES, "no_such_stage"))
    with pytest.raises(ModuleNotFoundError, match="no_such_stage"):
        ngcx.main.build_app()


@pytest.mark.parametrize("group", ["catalog"])
def test_group_help_lists_subcommands(group: str) -> None:
    proc = ngcx(group, "--help")
    assert proc.returncode == 0
    listed = {line.split()[0] for line in proc.stdout.split("Commands:")[1].splitlines() if line.strip()}
    assert listed == {"ls", "show", "check"}


def test_usage_errors_exit_2_without_traceback() -> None:
    for args in (("no-such-command",), ("render", "cuda", "--no-such-option"), ()):
        proc = ngcx(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.startswith("Usage: ") and proc.stdout == ""


PROBE = """
import json, sys
import ngcx.main
ngcx.main.build_app()
loaded_after_build = sorted({m.split('.')[0] for m in sys.modules})
try:
    ngcx.main.main(['--help'])
except SystemExit as exc:
    code = exc.code
print(json.dumps({'build': loaded_after_build, 'help': sorted({m.split('.')[0] for m in sys.modules}),
                  'code': code}))
"""


def test_startup_imports_no_heavy_module() -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc["code"] == 0
    for phase in ("build", "help"):
        assert sorted(set(HEAVY) & set(doc[phase])) == [], f"imported during {phase}"


def test_probe_would_notice_a_heavy_import(tmp_path) -> None:
    """Guard for the test above: the same probe does see pydantic once the catalog is validated
    (an empty cache folder, so the catalog cache cannot spare the validation)."""
    code = "import sys, ngcx.catalog; ngcx.catalog.load_catalog(); print('pydantic' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)})
    assert proc.stdout.strip() == "True", proc.stderr
