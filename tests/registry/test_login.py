"""`ngcx login` / `logout`: verified before stored, stored like `docker login`, never echoed."""

from __future__ import annotations

import base64
import json
import os
import socket
import stat
import sys
import textwrap

import pytest

from support import run_ngcx

pytestmark = pytest.mark.docker


def _config(isolated_state) -> dict:
    path = isolated_state["docker_config"] / "config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def test_wrong_password_exit_2_one_line_nothing_stored(auth_registry, isolated_state):
    host, user, password = auth_registry
    wrong = password + "-wrong"
    proc = run_ngcx("login", host, "-u", user, "--password-stdin", input=wrong)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "rejected" in lines[0] and host in lines[0]
    assert wrong not in proc.stdout + proc.stderr
    assert host not in _config(isolated_state).get("auths", {})


def test_login_stores_like_docker_login_0600_and_logout_removes(auth_registry, isolated_state):
    host, user, password = auth_registry
    proc = run_ngcx("login", host, "--username", user, "--password-stdin", input=password + "\n")
    assert proc.returncode == 0, proc.stderr
    assert "Login Succeeded" in proc.stdout
    assert password not in proc.stdout + proc.stderr
    path = isolated_state["docker_config"] / "config.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    auth = _config(isolated_state)["auths"][host]["auth"]
    assert base64.b64decode(auth).decode() == f"{user}:{password}"

    # the docker SDK (what push uses) reads the same credentials
    import docker.auth

    entry = docker.auth.load_config(config_path=str(path)).resolve_authconfig(host)
    assert entry["username"] == user

    out = run_ngcx("logout", host)
    assert out.returncode == 0 and host in out.stdout
    assert host not in _config(isolated_state).get("auths", {})
    again = run_ngcx("logout", host)
    assert again.returncode == 0 and "Not logged in" in again.stdout


def test_login_keeps_other_config_entries(auth_registry, isolated_state):
    host, user, password = auth_registry
    path = isolated_state["docker_config"] / "config.json"
    path.write_text(json.dumps({"auths": {"other.example:5000": {"auth": "eDp5"}}, "psFormat": "table"}))
    assert run_ngcx("login", host, "-u", user, "--password-stdin", input=password).returncode == 0
    config = _config(isolated_state)
    assert config["psFormat"] == "table" and "other.example:5000" in config["auths"]


def test_login_through_credential_helper_keeps_password_out_of_config(auth_registry, isolated_state,
                                                                     tmp_path):
    """With credsStore set, the secret goes to the helper (docker's protocol), not config.json."""
    host, user, password = auth_registry
    bindir, store = tmp_path / "bin", tmp_path / "helper-store.json"
    bindir.mkdir()
    helper = bindir / "docker-credential-ngcxtest"
    helper.write_text(textwrap.dedent(f"""\
        #!{sys.executable}
        # A file-backed credential helper speaking docker's credential-helper protocol.
        import json, sys
        path = {str(store)!r}
        try:
            data = json.load(open(path))
        except FileNotFoundError:
            data = {{}}
        action, payload = sys.argv[1], sys.stdin.read()
        if action == "store":
            body = json.loads(payload)
            data[body["ServerURL"]] = [body["Username"], body["Secret"]]
        elif action == "get":
            if payload.strip() not in data:
                print("credentials not found in native keychain"); sys.exit(1)
            u, s = data[payload.strip()]
            print(json.dumps({{"ServerURL": payload.strip(), "Username": u, "Secret": s}}))
        elif action == "erase":
            data.pop(payload.strip(), None)
        json.dump(data, open(path, "w"))
        """))
    helper.chmod(0o755)
    (isolated_state["docker_config"] / "config.json").write_text(json.dumps({"credsStore": "ngcxtest"}))
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    proc = run_ngcx("login", host, "-u", user, "--password-stdin", input=password, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "docker-credential-ngcxtest" in proc.stdout
    raw = (isolated_state["docker_config"] / "config.json").read_text()
    assert password not in raw and json.loads(raw)["auths"][host] == {}
    assert json.loads(store.read_text())[host] == [user, password]
    assert run_ngcx("logout", host, env=env).returncode == 0
    assert host not in json.loads(store.read_text())


def test_login_to_registry_down_is_one_line(isolated_state):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = run_ngcx("login", f"127.0.0.1:{port}", "-u", "u", "--password-stdin", input="pw-123456")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1 and "not reachable" in proc.stderr
    assert "pw-123456" not in proc.stderr
    assert not (isolated_state["docker_config"] / "config.json").exists()


def test_login_without_password_source_is_one_line(auth_registry, isolated_state):
    host, user, _ = auth_registry
    empty = run_ngcx("login", host, "-u", user, "--password-stdin", input="")
    assert empty.returncode == 2 and "empty" in empty.stderr
    no_tty = run_ngcx("login", host, "-u", user, input="")
    assert no_tty.returncode == 2 and "--password-stdin" in no_tty.stderr


def _pty_run(argv: list[str], answer: str, timeout: float = 30) -> tuple[int, str]:
    """Run argv on a pseudo-terminal, type `answer` at the Password prompt; (exit code, screen)."""
    import pty
    import select
    import time

    pid, fd = pty.fork()
    if pid == 0:  # child: the real ngcx on a terminal
        os.execv(argv[0], argv)
    screen, typed, deadline = b"", False, time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            screen += chunk
        if not typed and b"Password:" in screen:
            os.write(fd, answer.encode() + b"\n")
            typed = True
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), screen.decode(errors="replace")


def test_interactive_login_prompts_without_echo(auth_registry, isolated_state):
    host, user, password = auth_registry
    code, screen = _pty_run([sys.executable, "-m", "ngcx", "login", host, "-u", user], password)
    assert "Password:" in screen
    assert code == 0, screen
    assert "Login Succeeded" in screen
    assert password not in screen, "the typed password was echoed"
    assert host in _config(isolated_state)["auths"]
