"""Secrets never come back out (issue 8): one run of the whole CLI path with unique canaries for a CA
bundle, a registry password, a pip index password and cloud AccessKey credentials, then a search of
everything ngcx wrote: every command's stdout and stderr (errors included), every row of every table
of the state DB and its raw file, the state/config/cache folders and the build contexts left there,
$TMPDIR, the built image (each layer file, config, manifest, history), the registry's storage and log,
and docker's config.json (where the registry login may exist only as docker keeps it: base64 in
`auths`, file mode 0600).

The build reuses the cached cuda:24.05 layers: layers that existed before the canaries were minted
cannot hold them and are skipped (test_build.py's no-cache build reads every layer of a build that ran
each RUN step with the CA and pip.conf mounted); any layer this build makes anew is read file by file.
The push sends the small offline base to an htpasswd registry.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import stat
from pathlib import Path

import pytest

from support import SecretScan, local_layers, run_ngcx

pytestmark = pytest.mark.docker

CUDA_REF = "cuda:24.05"


@pytest.fixture
def cli_env(tmp_path: Path, isolated_state, secret_canaries) -> dict[str, str]:
    """The environment of every ngcx run: cloud credentials set, private TMPDIR and XDG folders to scan."""
    env = dict(secret_canaries.cloud_env())
    for name in ("TMPDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_DATA_HOME"):
        folder = tmp_path / "ngcx-home" / name.lower()
        folder.mkdir(parents=True)
        env[name] = str(folder)
    return env


def test_no_canary_in_anything_the_cli_writes(docker_client, base_image, auth_registry, isolated_state, tmp_path,
                                              secret_canaries, cli_env, request):
    older_layers = local_layers(docker_client)  # taken before any canary reaches the engine
    host, user, password = auth_registry
    canaries = dataclasses.replace(secret_canaries, registry_user=user, registry_password=password)
    scan = SecretScan(canaries.needles())
    tag = f"ngcx-test/secrets-scan:{os.getpid()}"
    request.addfinalizer(lambda: docker_client.images.remove(tag, noprune=True))  # the tag only: layers stay cached

    def ngcx(name: str, *args: str, stdin: str | None = None, ok: bool | None = True):
        """Run one command (ok: must succeed / must fail / None: either, as doctor on a GPU-less host)."""
        proc = run_ngcx(*args, input=stdin, env=cli_env)
        assert ok is None or (proc.returncode == 0) == ok, (name, proc.returncode, proc.stderr[-1500:])
        assert "Traceback" not in proc.stderr, (name, proc.stderr[-1500:])
        scan.process(name, proc)
        return proc

    # registry login: a wrong password first (the error path), then the right one
    ngcx("login (wrong password)", "login", host, "-u", user, "--password-stdin", stdin=password + "x", ok=False)
    ngcx("push before login", "push", base_image, "--registry", host, ok=False)
    ngcx("login", "login", host, "-u", user, "--password-stdin", stdin=password)

    # build through the CA and two credentialed indexes, with the whole BuildKit log shown (plain)
    ngcx("build", "build", CUDA_REF, "--base", "offline", "--tag", tag, "--progress", "plain",
         "--ca-cert", str(canaries.ca_bundle), "--pip-index-url", canaries.pip_index_url(),
         "--pip-extra-index-url", canaries.pip_index_url("download.pytorch.org"))
    ngcx("build (bad index URL)", "build", CUDA_REF, "--pip-index-url",
         canaries.pip_index_url().replace("https://", "ftp://"), ok=False)
    ngcx("build (bad mirror URL)", "build", CUDA_REF, "--apt-mirror",
         f"ftp://mirror:{canaries.pip_password}@example.org", ok=False)

    ngcx("push", "push", base_image, "--registry", host)
    for args in (["images"], ["images", "--json"], ["doctor"], ["doctor", "--json"],
                 ["catalog", "show", CUDA_REF, "--json"]):
        ngcx(" ".join(args), *args, ok=None if args[0] == "doctor" else True)

    # what ngcx left on disk
    state_dir, config_dir = isolated_state["state"], isolated_state["config"]
    tables = scan.sqlite(state_dir / "state.db")
    assert {"builds", "pushes"} <= set(tables) and list((state_dir / "contexts").iterdir())  # rows + contexts exist
    for folder in (state_dir, config_dir, *(Path(cli_env[n]) for n in ("TMPDIR", "XDG_CACHE_HOME", "XDG_CONFIG_HOME",
                                                                          "XDG_STATE_HOME", "XDG_DATA_HOME"))):
        scan.tree(folder)
    assert not list(Path(cli_env["TMPDIR"]).glob("ngcx-secrets-*")), "the pip.conf secret dir was left behind"

    # docker's config.json: the login exists only as docker keeps it (base64 user:password in auths), 0600
    config_json = isolated_state["docker_config"] / "config.json"
    raw = config_json.read_bytes()
    assert stat.S_IMODE(config_json.stat().st_mode) == 0o600
    assert json.loads(raw)["auths"][host]["auth"] == canaries.registry_auth_b64()
    assert raw.count(canaries.registry_auth_b64().encode()) == 1
    assert base64.b64decode(canaries.registry_auth_b64()).decode() == f"{user}:{password}"
    scan.file(config_json, skip=("registry user:password (base64)",))
    for other in sorted(isolated_state["docker_config"].rglob("*")):
        if other.is_file() and other != config_json:
            scan.file(other)

    # the image, and the registry it went to (storage + its request log)
    scan.image(docker_client, tag, tmp_path, older_layers)  # layers this build (re)made are read in full
    scan.tree(tmp_path / "data")
    scan.file(tmp_path / "registry.log")

    print(f"\nsecrets: {scan.summary()}")
    assert scan.hits == [], scan.hits
    assert scan.places > 50  # the scan really looked (outputs, rows, files, registry blobs, image documents)


def test_ca_from_environment_and_cloud_keys_never_echoed(docker_client, base_image, isolated_state,
                                                         secret_canaries, cli_env, request):
    """The CA taken from $PIP_CERT (not a flag) and cloud keys in the environment: neither is echoed by a
    build or by a bad-input error that names the CA file."""
    tag = f"ngcx-test/secrets-env:{os.getpid()}"
    request.addfinalizer(lambda: docker_client.images.remove(tag, noprune=True))
    scan = SecretScan(secret_canaries.needles())
    env = {**cli_env, "PIP_CERT": str(secret_canaries.ca_bundle)}
    build = run_ngcx("build", CUDA_REF, "--base", "offline", "--tag", tag, "--progress", "plain", env=env)
    assert build.returncode == 0, build.stderr[-1500:]
    scan.process("build with $PIP_CERT", build)
    not_pem = Path(cli_env["TMPDIR"]) / "not-a-ca.pem"
    not_pem.write_text(secret_canaries.cloud_secret)  # a wrong file whose content must not be quoted back
    bad = run_ngcx("build", CUDA_REF, "--ca-cert", str(not_pem), env=env)
    assert bad.returncode == 2 and "is not a PEM certificate bundle" in bad.stderr
    scan.process("build with a non-PEM --ca-cert", bad)
    scan.data("docker inspect", json.dumps(docker_client.api.inspect_image(tag)))
    print(f"\nsecrets (env CA): {scan.summary()}")
    assert scan.hits == [], scan.hits


def test_the_scanner_finds_a_planted_canary_everywhere_it_looks(docker_client, tmp_path, secret_canaries, request):
    """The scan above can fail: each kind of place, given one canary, is reported (by label, not value)."""
    import io
    import sqlite3
    import subprocess
    import tarfile

    needles = secret_canaries.needles()
    planted = {"cloud AccessKey secret": secret_canaries.cloud_secret,
               "registry user:password (base64)": secret_canaries.registry_auth_b64(),
               "CA body line 2": secret_canaries.ca_lines[1]}
    scan = SecretScan(needles)
    scan.process("cmd", subprocess.CompletedProcess([], 0, stdout=f"x {planted['CA body line 2']} y", stderr=""))
    (tmp_path / "tree" / "deep").mkdir(parents=True)
    (tmp_path / "tree" / "deep" / "f").write_text(planted["registry user:password (base64)"])
    scan.tree(tmp_path / "tree")
    with sqlite3.connect(tmp_path / "s.db") as conn:
        conn.execute("CREATE TABLE t (v TEXT)")
        conn.execute("INSERT INTO t VALUES (?)", (f"--secret={planted['cloud AccessKey secret']}",))
    scan.sqlite(tmp_path / "s.db")
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        data = f"key={planted['cloud AccessKey secret']}\n".encode()
        info = tarfile.TarInfo("etc/leak.conf")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    tag = f"ngcx-test/planted:{os.getpid()}"
    docker_client.api.import_image_from_data(layer.getvalue(), repository=tag.split(":")[0], tag=tag.split(":")[1])
    request.addfinalizer(lambda: docker_client.images.remove(tag, force=True))
    scan.image(docker_client, tag, tmp_path)

    assert len(scan.hits) == 4, scan.hits
    assert any(h.startswith("cmd stdout: CA body line 2") for h in scan.hits)
    assert any("deep/f: registry user:password (base64)" in h for h in scan.hits)
    assert any("table t" in h and "cloud AccessKey secret" in h for h in scan.hits)
    assert any(":etc/leak.conf: cloud AccessKey secret" in h for h in scan.hits)
    assert not any(value in " ".join(scan.hits) for value in needles.values())  # hits never quote a secret
