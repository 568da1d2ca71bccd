"""Render the host script (recipes/deploy/host.sh.j2): user-data on a fresh host, Cloud Assistant
command on a running one.

Why a template: the steps a host takes are text (shell), kept in recipes/ beside the Dockerfile
blocks; Python only decides the values. Every value is shell-quoted by the `q` filter, so an image
reference, a CMD argument or a token can never break out of its word. The role login's program
(recipes/deploy/role_login.py) and the host's signature check (cli/trust/host_verify.py) are included packed
(packed_program): Python the host runs, kept as files so tests run the very same code against the emulated
metadata services and a real registry.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from ..registry.credentials import Credentials
from .roles import RoleLogin

USER_DATA_LIMIT = 16 * 1024  # ECS: raw user-data up to 16 KB (cloud-apis.md §5.1)
COMMAND_LIMIT = 18 * 1024    # ECS RunCommand: CommandContent up to 18 KB base64-encoded (the RunCommand reference)
CERTIFICATE_MARK = "ngcx-host: tls pubkey sha256 "


def certificate_probe(auth_dir: str) -> str:
    """Shell that prints the host's TLS certificate, then CERTIFICATE_MARK and its key's pin (curl's
    --pinnedpubkey). The host script ends with it, so a deploy onto a running host pins from the one
    command it runs (vm.py certificate_with); the same line reads it back where that output is gone."""
    crt = f'"{auth_dir}/tls.crt"'
    return (f"cat {crt} && echo \"{CERTIFICATE_MARK}$(openssl x509 -in {crt} -pubkey -noout "
            "| openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64)\"")


@dataclass(frozen=True)
class HostJob:
    deployment: int
    pull_ref: str
    registry: str
    min_driver: str
    gpu_mode: str
    login: Credentials | RoleLogin | None   # RoleLogin: the host logs in with its instance role (no secret here)
    cmd: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    port: int = 8000
    auth_hashes: tuple[str, ...] = ()   # SHA-256 of each accepted endpoint key (none: --no-auth)
    tls: bool = True                    # HTTPS with the host's own key pair
    verify_key: str = ""                # public PEM the host checks the image's signature with (none: --allow-unsigned)


def _env():
    import jinja2

    from ..core import paths

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(paths.recipes_dir() / "deploy")),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    env.filters["q"] = lambda value: shlex.quote(str(value))
    env.globals["role_login_program"] = role_login_program
    env.globals["host_verify_program"] = host_verify_program
    env.globals["certificate_probe"] = certificate_probe
    return env


def role_login_program() -> str:
    """recipes/deploy/role_login.py, packed (program_text)."""
    from ..core import paths

    return packed_program((paths.recipes_dir() / "deploy" / "role_login.py").read_text())


def host_verify_program() -> str:
    """cli/trust/host_verify.py (the host's own signature check before `docker run`, standard library only),
    packed (program_text)."""
    from .. import trust

    return packed_program((Path(trust.__file__).parent / "host_verify.py").read_text())


def packed_program(source: str) -> str:
    """A two-line Python program that runs `source`: its docstrings and comments dropped, zlib-compressed and
    base85-encoded (its alphabet has no quote or backslash, and costs 25 % where base64 costs 33 %). Why: both
    host programs ride in the host script, user-data of at most 16 KB or a Cloud Assistant command of at most
    18 KB base64-encoded, where as plain text (comments stripped: 6.2 KB + 11 KB) they would not fit beside the
    script; packed they take about 3 KB + 4 KB. The host's python3 (3.6 on Alibaba Cloud Linux 3) runs it:
    ast.unparse writes no newer syntax than the source's."""
    import ast
    import base64
    import zlib

    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    packed = base64.b85encode(zlib.compress(ast.unparse(tree).encode(), 9)).decode()
    return f'import base64,zlib\nexec(zlib.decompress(base64.b85decode("{packed}")))'


def render(job: HostJob, mode: str) -> str:
    text = _env().get_template("host.sh.j2").render(
        mode=mode, deployment=job.deployment, pull_ref=job.pull_ref, registry=job.registry,
        min_driver=job.min_driver, gpu_mode=job.gpu_mode, login=job.login, cmd=list(job.cmd),
        env=dict(job.env), port=job.port, auth_hashes=list(job.auth_hashes), tls=job.tls,
        verify_key=job.verify_key, digest_hex=job.pull_ref.rpartition("@sha256:")[2])
    text = _without_comments(text)
    size = len(text.encode()) if mode == "user-data" else (len(text.encode()) + 2) // 3 * 4
    limit, what = (USER_DATA_LIMIT, "user-data") if mode == "user-data" else (COMMAND_LIMIT, "base64 command")
    if size > limit:
        from ..core.errors import UserError

        raise UserError(f"the host script is {size} bytes, over the cloud's {limit // 1024} KB {what} limit",
                        hint="shorten the CMD or environment passed to deploy")
    return text


def _without_comments(text: str) -> str:
    """The script without its comment lines, past the first two (the shebang, and the `ngcx host script` line
    scrub() looks for): they explain host.sh.j2 to its readers, and cost a host ~3 KB of the 16 KB of
    user-data that the packed programs need. Safe because the only here-documents are packed programs, which
    hold no line starting with '#'."""
    lines = text.splitlines(keepends=True)
    return "".join(lines[:2] + [line for line in lines[2:] if not line.lstrip().startswith("#")])


def render_bake(refs: list[str], logins: dict[str, Credentials | RoleLogin] | None = None) -> str:
    """The bake script for `ngcx hosts bake` (recipes/deploy/bake.sh.j2); `logins`: registry -> its login,
    through the builder's role (no secret in the script) or a short-lived token."""
    logins = logins or {}
    by_role = {registry: login for registry, login in logins.items() if isinstance(login, RoleLogin)}
    tokens = {registry: login for registry, login in logins.items() if not isinstance(login, RoleLogin)}
    return _env().get_template("bake.sh.j2").render(refs=refs, logins=tokens, role_logins=by_role)
