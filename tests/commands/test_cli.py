"""Spec of the `ngcx` entry point: every stage shows up in --help, start-up stays light.

Why the import check instead of a timer: `ngcx --help` must answer in < 0.3 s (the issue), and
what makes it slow is importing pydantic, Jinja2, the Docker SDK or cloud SDKs at start-up. A
wall-clock assertion would be flaky on a loaded CI box; "these modules are not imported" is exact.
The time itself is measured by `python -m bench cli`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import typer

from ngcx.core import paths
from ngcx.main import stage_modules

HEAVY = ("pydantic", "pydantic_core", "jinja2", "docker", "boto3", "botocore", "aliyunsdkcore", "rich", "yaml",
         "numpy", "requests")


def ngcx(*args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, "-m", "ngcx", *args], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


# What a user can type today; written out here (not read from COMMAND_MODULES) so a deleted
# command module fails these tests instead of silently shrinking `ngcx --help`.
COMMANDS = {"init", "catalog", "render", "base", "build", "lock", "test", "push", "verify", "sbom", "login", "logout",
            "run", "deploy", "deployments", "hosts", "images", "dashboard", "doctor"}


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
    assert listed == {"ls", "show", "check", "lock"}     # lock: the wheel hashes (registry.lock.yaml)


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
    """Guard for the test above: the same probe does see the validator (pydantic-core, catalog/schema.py)
    once the catalog is validated (an empty cache folder and a catalog other than the shipped one, so neither
    the catalog cache nor its shipped seed can spare the validation)."""
    edited = tmp_path / "registry.yaml"
    edited.write_text(paths.registry_file().read_text(encoding="utf-8") + "# edited\n", encoding="utf-8")
    code = f"import sys, ngcx.catalog as c; c.load_catalog({str(edited)!r}); print('pydantic_core' in sys.modules)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert proc.stdout.strip() == "True", proc.stderr


# ----------------------------------------------------------------------------- one module per command (issue 13)


def test_command_owners_table_matches_what_each_module_registers() -> None:
    """cli/main.py picks the module to import from a static table; a command moved to another module,
    renamed or added without the table would otherwise be 'No such command' (or a wrong import)."""
    import ngcx.main

    registered = {cmd: module for module, cmds in implemented_commands().items() for cmd in cmds}
    assert registered == ngcx.main.COMMAND_OWNERS
    assert set(ngcx.main.COMMAND_OWNERS.values()) == set(ngcx.main.COMMAND_MODULES)


def _every_command_line() -> list[list[str]]:
    """`--help` of the root, of every command and every group's subcommand; no arguments; an unknown
    command; and an unknown option for every command that rejects one (run/deploy pass extras on)."""
    import typer.main

    import ngcx.main

    root = typer.main.get_command(ngcx.main.build_app())
    lines: list[list[str]] = [["--help"], [], ["no-such-command"], ["render"], ["catalog", "show"]]
    for name, cmd in root.commands.items():
        lines.append([name, "--help"])
        lines += [[name, sub, "--help"] for sub in getattr(cmd, "commands", {})]
        if not cmd.context_settings.get("ignore_unknown_options"):
            lines.append([name, "--no-such-option"])
    return lines


def _run_main(argv: list[str], capsys) -> tuple[object, str, str]:
    import ngcx.main

    with pytest.raises(SystemExit) as exc:
        ngcx.main.main(list(argv))
    out = capsys.readouterr()
    return exc.value.code, out.out, out.err


def test_output_is_byte_for_byte_that_of_the_all_modules_app(monkeypatch, capsys) -> None:
    """Registering one module must not change a single byte a user sees: help texts, usage lines,
    'No such command', exit codes; compared with the app that registers all 15 modules."""
    import ngcx.main

    lines = _every_command_line()
    assert len(lines) > 40
    shipped = [_run_main(argv, capsys) for argv in lines]
    monkeypatch.setattr(ngcx.main, "modules_for", lambda argv: ngcx.main.COMMAND_MODULES)
    reference = [_run_main(argv, capsys) for argv in lines]
    for argv, got, want in zip(lines, shipped, reference, strict=True):
        assert got == want, argv
    assert shipped[0][0] == 0 and "Commands:" in shipped[0][1]            # --help really ran
    assert "No such command 'no-such-command'" in shipped[2][2]


PROBE_ONE = """
import json, sys
import ngcx.main
try:
    ngcx.main.main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({'code': code, 'stages': sorted(m for m in sys.modules if m.startswith('ngcx.commands.')
                                                    and m.split('.')[2] in ngcx.main.COMMAND_MODULES)}))
"""


@pytest.mark.parametrize(("argv", "stages"), [
    (["render", "--help"], ["ngcx.commands.render"]),
    (["logout", "--help"], ["ngcx.commands.login"]),
    (["catalog", "ls", "--help"], ["ngcx.commands.catalog"]),
    (["--help"], sorted(f"ngcx.commands.{m}" for m in (
        "init", "catalog", "render", "base", "build", "lock", "test", "push", "verify", "login", "run",
        "sbom", "deploy", "deployments", "hosts", "images", "dashboard", "doctor"))),
])
def test_a_command_imports_only_the_module_that_owns_it(argv: list[str], stages: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-c", PROBE_ONE, *argv], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout.strip().splitlines()[-1])
    assert doc == {"code": 0, "stages": stages}
