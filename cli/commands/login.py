"""`ngcx login` / `ngcx logout`: registry credentials in the docker config.

registry/login.py checks and stores them; this module prompts and prints.
"""

from __future__ import annotations

import sys

import typer

from ..core.errors import UserError
from ..registry.login import api_host, helper_call, normalize_registry, store_credentials, verify_credentials


def register(app: typer.Typer) -> None:
    app.command("login")(login_command)
    app.command("logout")(logout_command)


def login_command(
    registry: str = typer.Argument(..., help="Registry host[:port], e.g. 127.0.0.1:5000."),
    username: str = typer.Option("", "--username", "-u", help="User name (prompted when omitted)."),
    password_stdin: bool = typer.Option(False, "--password-stdin", help="Read the password from stdin."),
) -> None:
    """Verify credentials against REGISTRY, then store them like `docker login` does."""
    key = normalize_registry(registry)
    username = username or _prompt_username()
    password = _read_password(password_stdin)
    verify_credentials(key, username, password)
    where = store_credentials(key, username, password)
    print(f"Login Succeeded: {api_host(key)} as {username} (stored in {where})")


def _prompt_username() -> str:
    if not sys.stdin.isatty():
        raise UserError("no user name given and no terminal to ask for one", hint="pass --username")
    name = input("Username: ").strip()
    if not name:
        raise UserError("empty user name", hint="pass --username")
    return name


def _read_password(from_stdin: bool) -> str:
    """The password from stdin (one line, trailing newline dropped) or a hidden prompt."""
    if from_stdin:
        password = sys.stdin.read()
        password = password[:-1] if password.endswith("\n") else password
        password = password[:-1] if password.endswith("\r") else password
        if not password:
            raise UserError("--password-stdin: stdin was empty",
                            hint="pipe it in: cat token.txt | ngcx login HOST -u USER --password-stdin")
        return password
    if not sys.stdin.isatty():
        raise UserError("no terminal to ask for the password", hint="use --password-stdin")
    import getpass

    password = getpass.getpass("Password: ")
    if not password:
        raise UserError("empty password", hint="type the password, or use --password-stdin")
    return password


def logout_command(
    registry: str = typer.Argument(..., help="Registry host[:port] to forget."),
) -> None:
    """Remove stored credentials for REGISTRY (config.json and credential helper)."""
    from ..registry.credentials import credential_helper, read_docker_config, write_docker_config

    key = normalize_registry(registry)
    config = read_docker_config()
    auths = config.get("auths", {})
    helper = credential_helper(config, key)
    if key not in auths and not helper:
        print(f"Not logged in to {api_host(key)}")
        return
    if helper:
        helper_call(helper, "erase", key)
    auths.pop(key, None)
    write_docker_config(config)
    print(f"Removed login credentials for {api_host(key)}")
