"""`ngcx deploy … --canary PCT`'s flags as a user mistypes them: one line each, exit 2, before any image is read
or any service touched (an image that does not exist is named on purpose: the flags are refused first).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


def ngcx(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ngcx", "deploy", "no-such-image:1", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NGCX_STATE_DIR": str(tmp_path / "state")})


@pytest.mark.parametrize(("args", "said"), [
    (("--canary", "10"), "--canary releases a new version of an existing service"),
    (("--service", "s1", "--canary", "100"), "percentage from 1 to 99"),
    (("--service", "s1", "--canary", "10", "--max-error-rate", "2"), "--max-error-rate 2.0"),
    (("--service", "s1", "--canary", "10", "--max-p99-ms", "0"), "--max-p99-ms 0.0"),
    (("--service", "s1", "--canary", "10", "--canary-window", "0.5"), "--canary-window 0.5"),
    (("--service", "s7", "--canary", "10"), "no service s7"),
])
def test_a_bad_canary_flag_is_one_line_and_exit_2(tmp_path, args, said):
    done = ngcx(tmp_path, *args)
    assert done.returncode == 2 and said in done.stderr, done.stderr
    assert [ln for ln in done.stderr.splitlines() if ln.startswith("ngcx: error")] == \
        [done.stderr.splitlines()[0]] and "Traceback" not in done.stderr


def test_an_autoscaled_service_is_told_canaries_are_for_fixed_replica_services(tmp_path, monkeypatch):
    monkeypatch.setenv("NGCX_STATE_DIR", str(tmp_path / "state"))
    from ngcx.deploy import store

    store.create_service("aws", "us-east-1", 2, {"image": "x", "group": {"min_size": 1, "max_size": 4,
                                                                        "target_requests": 600.0}})
    done = ngcx(tmp_path, "--service", "s1", "--canary", "10")
    assert done.returncode == 2 and "canary releases are for fixed-replica services" in done.stderr, done.stderr
    assert store.service(1).status == "creating" and not store.service(1).canary       # untouched
