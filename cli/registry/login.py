"""Behind `ngcx login` / `ngcx logout`: registry credentials, stored exactly where `docker login` puts them.

Why docker's store: `docker push`, `docker pull`, the docker SDK and ngcx then all share one set
of credentials, and a configured credential helper (pass, secretservice, ecr-login, ...) keeps
working. Credentials are verified against the registry BEFORE anything is written, the password
is never echoed, logged or put in an error message, and the config file is mode 0600.
"""

from __future__ import annotations

from ..core.errors import UserError

DOCKER_HUB_KEY = "https://index.docker.io/v1/"


def normalize_registry(registry: str) -> str:
    """'https://host:5000/ns/' -> 'host:5000' (the key docker uses); Docker Hub -> its v1 URL."""
    from .api import split_registry

    host, _ = split_registry(registry)
    if host in ("docker.io", "index.docker.io", "registry-1.docker.io"):
        return DOCKER_HUB_KEY
    return host


def api_host(key: str) -> str:
    """The host whose /v2/ API answers for a stored key."""
    return "docker.io" if key == DOCKER_HUB_KEY else key


def verify_credentials(key: str, username: str, password: str) -> None:
    """GET /v2/ with the credentials (Basic or Bearer token flow); UserError unless accepted."""
    from .api import registry_get
    from .credentials import Credentials

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
    from .credentials import Credentials, auth_field, credential_helper, read_docker_config, write_docker_config

    config = read_docker_config()
    helper = credential_helper(config, key)
    auths = config.setdefault("auths", {})
    if helper:
        helper_call(helper, "store", key, username, password)
        auths[key] = {}
        write_docker_config(config)
        return f"docker-credential-{helper}"
    auths[key] = {"auth": auth_field(Credentials(username, password))}
    return str(write_docker_config(config))


def helper_call(helper: str, action: str, key: str, username: str = "", password: str = "") -> None:
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
