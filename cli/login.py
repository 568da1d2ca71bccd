"""`ngcx login` / `ngcx logout`: registry credentials, stored exactly where `docker login` puts them.

Why docker's store: `docker push`, `docker pull`, the docker SDK and ngcx then all share one set
of credentials, and a configured credential helper (pass, secretservice, ecr-login, ...) keeps
working. Credentials are verified against the registry BEFORE anything is written, the password
is never echoed, logged or put in an error message, and the config file is mode 0600.
"""

from __future__ import annotations

import sys

import typer

from ngcx.errors import UserError

DOCKER_HUB_KEY = "https://index.docker.io/v1/"


def register(app: typer.Typer) -> None:
    app.command("login")(login_command)
    app.command("logout")(logout_command)


def normalize_registry(registry: str) -> str:
    """'https://host:5000/ns/' -> 'host:5000' (the key docker uses); Docker Hub -> its v1 URL."""
    from ngcx.registry_api import split_registry

    host, _ = split_registry(registry)
    if host in ("docker.io", "index.docker.io", "registry-1.docker.io"):
        return DOCKER_HUB_KEY
    return host


def api_host(key: str) -> str:
    """The host whose /v2/ API answers for a stored key."""
    return "docker.io" if key == DOCKER_HUB_KEY else key


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


def verify_credentials(key: str, username: str, password: str) -> None:
    """GET /v2/ with the credentials (Basic or Bearer token flow); UserError unless accepted."""
    from ngcx.credentials import Credentials
    from ngcx.registry_api import registry_get

    host = api_host(key)
    resp = registry_get(host, "/v2/", creds=Credentials(username, password))
    if resp.status_code == 200:
        return
    if resp.status_code == 401:
        raise UserError(f"login to {host} as {username} failed: the registry rejected the credentials",
                        hint="nothing was stored; check the credentials and try again")
    raise UserError(f"login to {host} failed: GET /v2/ answered HTTP {resp.status_code}",
                    hint="is this a Docker/OCI registry address?")


def store_credentials(key: str, username: str, password: str) -> str:
    """Write to the configured credential helper, else to config.json auths (0600). Returns where."""
    from ngcx.credentials import Credentials, auth_field, credential_helper, read_docker_config, write_docker_config

    config = read_docker_config()
    helper = credential_helper(config, key)
    auths = config.setdefault("auths", {})
    if helper:
        _helper_call(helper, "store", key, username, password)
        auths[key] = {}
        write_docker_config(config)
        return f"docker-credential-{helper}"
    auths[key] = {"auth": auth_field(Credentials(username, password))}
    return str(write_docker_config(config))


def _helper_call(helper: str, action: str, key: str, username: str = "", password: str = "") -> None:
    """Run a docker credential helper through the docker SDK's client; errors without secrets."""
    from docker.credentials import CredentialsNotFound, Store, StoreError

    store = Store(helper)
    try:
        if action == "store":
            store.store(server=key, username=username, secret=password)
        else:
            store.erase(key)
    except CredentialsNotFound:
        return
    except StoreError as exc:
        first = str(exc).splitlines()[0][:160] if str(exc) else "failed"
        raise UserError(f"credential helper docker-credential-{helper} could not {action} for {key}: {first}",
                        hint="check the helper is installed and unlocked") from None


def logout_command(
    registry: str = typer.Argument(..., help="Registry host[:port] to forget."),
) -> None:
    """Remove stored credentials for REGISTRY (config.json and credential helper)."""
    from ngcx.credentials import credential_helper, read_docker_config, write_docker_config

    key = normalize_registry(registry)
    config = read_docker_config()
    auths = config.get("auths", {})
    helper = credential_helper(config, key)
    if key not in auths and not helper:
        print(f"Not logged in to {api_host(key)}")
        return
    if helper:
        _helper_call(helper, "erase", key)
    auths.pop(key, None)
    write_docker_config(config)
    print(f"Removed login credentials for {api_host(key)}")
