"""serve's access flags (bearer keys, model control, TLS): their arguments, environment defaults and start-up lines.

Why apart from serve.py: the flags are one concern (access.py's AccessConfig) with their own
rules: each has an environment default, because `ngcx deploy` configures a container through its
environment without touching the image's CMD, and a flag given on the command line wins over it.
Everything is checked before the server listens (config_from_args: the hashes' form, the keys
files read, the TLS files loaded), so a typo is one line and exit 2, and `serve --mps N` checks
once before it starts its children (which inherit the environment and get the flags again).

The environment:
  NGCX_RUNTIME_AUTH_KEY_SHA256    hex SHA-256 hashes of accepted keys, separated by commas or spaces
  NGCX_RUNTIME_AUTH_KEYS         a keys file (--auth-keys-file)
  NGCX_RUNTIME_ADMIN_KEY_SHA256  admin key hashes, as above
  NGCX_RUNTIME_ADMIN_KEYS        an admin keys file (--admin-keys-file)
  NGCX_RUNTIME_MODEL_CONTROL     none | explicit (--model-control-mode)
  NGCX_RUNTIME_TLS_CERT, NGCX_RUNTIME_TLS_KEY   PEM files (--tls-cert, --tls-key)
An empty variable is unset.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
from collections.abc import Callable
from typing import Any

from .access import MODEL_CONTROL_MODES, AccessConfig, Policy
from .errors import RuntimeUserError

ENV = {"auth_key_sha256": "NGCX_RUNTIME_AUTH_KEY_SHA256", "auth_keys_file": "NGCX_RUNTIME_AUTH_KEYS",
       "admin_key_sha256": "NGCX_RUNTIME_ADMIN_KEY_SHA256", "admin_keys_file": "NGCX_RUNTIME_ADMIN_KEYS",
       "model_control": "NGCX_RUNTIME_MODEL_CONTROL", "tls_cert": "NGCX_RUNTIME_TLS_CERT",
       "tls_key": "NGCX_RUNTIME_TLS_KEY"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The access flags of `serve` (each defaults to its environment variable, read in config_from_args)."""
    p.add_argument("--auth-key-sha256", action="append", default=None, metavar="HEX",
                   help="require `Authorization: Bearer <key>` (gRPC metadata `authorization`) on every endpoint but "
                        "health, accepting the key whose SHA-256 is HEX (repeatable; default "
                        f"${ENV['auth_key_sha256']}); no key configured = open")
    p.add_argument("--auth-keys-file", default=None, metavar="PATH",
                   help="accepted keys as hex SHA-256 lines (# comments), re-read within 0.5 s of a change, so a "
                        f"key rotates without a restart (default ${ENV['auth_keys_file']}); an empty file accepts none")
    p.add_argument("--model-control-mode", default=None, choices=MODEL_CONTROL_MODES,
                   help="none (default): repository load / unload are refused, --load-model still loads at start; "
                        "explicit: they need an admin key (Triton's modes; default "
                        f"${ENV['model_control']})")
    p.add_argument("--admin-key-sha256", action="append", default=None, metavar="HEX",
                   help="the admin key's SHA-256 for --model-control-mode explicit (repeatable; default "
                        f"${ENV['admin_key_sha256']}); accepted wherever a key is")
    p.add_argument("--admin-keys-file", default=None, metavar="PATH",
                   help=f"admin key hashes as lines, re-read like --auth-keys-file (default ${ENV['admin_keys_file']})")
    p.add_argument("--tls-cert", default=None, metavar="PEM",
                   help="serve HTTPS (and TLS on --grpc-port and --metrics-port) with this certificate (chain); "
                        f"with --tls-key (default ${ENV['tls_cert']})")
    p.add_argument("--tls-key", default=None, metavar="PEM",
                   help=f"the certificate's unencrypted private key (default ${ENV['tls_key']})")


def _env(name: str, environ: dict[str, str]) -> str | None:
    value = environ.get(ENV[name], "").strip()
    return value or None


def config_from_args(args: argparse.Namespace, environ: dict[str, str] | None = None,
                     log: Callable[[str], None] | None = None) -> AccessConfig:
    """The AccessConfig of serve's flags over their environment defaults, checked as the server will use it
    (keys files read, TLS files loaded): a RuntimeUserError line otherwise."""
    from .tls import server_context

    environ = dict(os.environ) if environ is None else environ
    values: dict[str, Any] = {}
    for name in ENV:
        flag = getattr(args, name if name != "model_control" else "model_control_mode", None)
        if flag is not None:
            values[name] = tuple(flag) if isinstance(flag, list) else flag
            continue
        value = _env(name, environ)
        if value is None:
            continue
        if name.endswith("_sha256"):
            values[name] = tuple(v for v in value.replace(",", " ").split() if v)
        elif name == "model_control" and value not in MODEL_CONTROL_MODES:
            raise RuntimeUserError(f"${ENV[name]}={value!r}: choose one of {', '.join(MODEL_CONTROL_MODES)}")
        else:
            values[name] = value
    config = AccessConfig(**values)
    Policy(access=config, log=log)                 # the hashes and files, as the server reads them
    if config.tls:
        server_context(str(config.tls_cert), str(config.tls_key))
    return config


def loopback(host: str) -> bool:
    """host is a loopback address (or localhost): only this machine can reach a server bound there."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        return False


def start_lines(policy: Policy, host: str, url: str, repository: bool = False) -> list[str]:
    """What serve says about access once it listens: TLS's fingerprint, the keys, an open server off loopback."""
    from .tls import fingerprint

    config = policy.access
    lines = []
    if config.tls:
        lines.append(f"serve: TLS on every port (certificate SHA-256 fingerprint {fingerprint(str(config.tls_cert))})")
    if not policy.open:
        source = [f"{len(policy.users.fixed)} hash(es) given"] if policy.users.fixed else []
        if policy.users.file is not None:
            source.append(f"{len(policy.users.file.hashes())} in {policy.users.file.path}, re-read on change")
        lines.append(f"serve: bearer keys required on every endpoint but health ({'; '.join(source)})")
    elif not loopback(host):
        lines.append(f"serve: no bearer key is configured: every endpoint at {url} is open to anyone who can reach "
                     f"it; require one with --auth-key-sha256 HEX or --auth-keys-file PATH (${ENV['auth_keys_file']})")
    if config.model_control == "explicit":
        lines.append("serve: model control explicit: repository load / unload need the admin key")
    elif repository:
        lines.append("serve: model control none: repository load / unload are refused (--model-control-mode "
                     "explicit with an admin key allows them)")
    return lines
