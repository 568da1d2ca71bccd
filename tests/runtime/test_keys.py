"""keys.py and access.Policy without sockets: the hashes, the keys file and its reload, who is let in.

What an operator notices: a keys file with a typo stops the server at start with one line naming the
file and the line (never the text on it, which may be a key pasted by mistake); a bad rewrite later
keeps the keys that worked; an empty file locks every endpoint but health; an admin key opens model
control and everything else, a normal key everything but model control.
"""

from __future__ import annotations

import os
import time

import pytest

from ngcx_runtime import keys
from ngcx_runtime.access import AccessConfig, Call, Category, Policy, Unauthorized
from ngcx_runtime.errors import RuntimeUserError
from ngcx_runtime.keys import KeyFile, KeySet, bearer_token, digest, matches, parse_hash_lines, sha256_hex
from ngcx_runtime.protocol import ProtocolError

A, B, ADMIN = "key-a-0123456789abcdef", "key-b-fedcba9876543210", "admin-key-00112233"


def call(category: Category | None, key: str | None = None, control: bool = False, raw: str | None = None) -> Call:
    value = raw if raw is not None else (f"Bearer {key}" if key is not None else None)
    return Call(category, "127.0.0.1", {} if value is None else {"authorization": value}, control)


def status_of(policy: Policy, c: Call) -> int:
    try:
        policy.check(c)
    except ProtocolError as exc:
        return exc.status
    return 200


def test_hash_lines_ignore_blanks_and_comments_and_name_a_bad_line_without_its_text():
    text = f"# rotated 2026-11\n\n{sha256_hex(A)}  # ci\n  {sha256_hex(B).upper()}\n"
    assert parse_hash_lines(text, "f") == {digest(A), digest(B)}
    assert parse_hash_lines("", "f") == frozenset() == parse_hash_lines("# only a comment\n", "f")
    with pytest.raises(RuntimeUserError) as exc:
        parse_hash_lines(f"{sha256_hex(A)}\nmy-secret-key-pasted-here\n", "--auth-keys-file k")
    assert "--auth-keys-file k line 2" in str(exc.value) and "my-secret-key" not in str(exc.value)
    assert "sha256sum" in str(exc.value)


def test_matching_compares_with_every_hash():
    accepted = [digest(A), digest(B)]
    assert matches(digest(A), accepted) and matches(digest(B), accepted)
    assert not matches(digest("nope"), accepted) and not matches(digest(A), [])
    calls = []

    def spy(a: bytes, b: bytes) -> bool:
        calls.append(b)
        return a == b

    original = keys.hmac.compare_digest
    keys.hmac.compare_digest = spy
    try:
        assert matches(digest(A), accepted)          # the first matches: the second is compared all the same
    finally:
        keys.hmac.compare_digest = original
    assert calls == accepted


def test_the_bearer_parser_takes_the_scheme_in_any_case_and_nothing_else():
    assert bearer_token(f"Bearer {A}") == A == bearer_token(f"bEaReR   {A}") == bearer_token(f" BEARER {A}\t")
    assert bearer_token("Bearer abc+/==") == "abc+/=="
    for bad in (None, "", "Bearer", "Bearer ", f"Basic {A}", f"Bearer {A} x", f"Bearer\t{A}", f"Bearer {A}\n",
                "Bearer ä", "Bearer a=b", "Bearer " + "a" * 513, "Bearer " + "a" * 2000, b"Bearer x", 7):
        assert bearer_token(bad) is None, bad
    assert bearer_token("Bearer " + "a" * 512) == "a" * 512


def test_a_keys_file_at_start_missing_unreadable_or_malformed_is_one_line(tmp_path):
    with pytest.raises(RuntimeUserError, match=r"--auth-keys-file .*missing: cannot read the keys file"):
        KeyFile(tmp_path / "missing", "--auth-keys-file")
    with pytest.raises(RuntimeUserError, match="is not a regular file"):
        KeyFile(tmp_path, "--auth-keys-file")                    # a folder
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(RuntimeUserError, match="is not a regular file"):
        KeyFile(fifo, "--auth-keys-file")                        # would block a read forever
    with pytest.raises(RuntimeUserError, match="is not a regular file"):
        KeyFile("/dev/zero", "--auth-keys-file")                 # would never end
    big = tmp_path / "big"
    big.write_text((sha256_hex(A) + "\n") * 20_000)
    with pytest.raises(RuntimeUserError, match="is larger than 1048576 bytes"):
        KeyFile(big, "--auth-keys-file")
    bad = tmp_path / "bad"
    bad.write_text("not a hash\n")
    with pytest.raises(RuntimeUserError, match="line 1 is not a SHA-256 in hex"):
        KeyFile(bad, "--auth-keys-file")
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(RuntimeUserError, match="line 1"):
        KeyFile(binary, "--auth-keys-file")


def _rewrite(path, text: str, age_s: float = 1.0) -> None:
    """Write in place, then date it age_s back (an old change is read at once; a young one settles first)."""
    path.write_text(text)
    t = time.time_ns() - int(age_s * 1e9)
    os.utime(path, ns=(t, t))


def test_the_file_is_reread_when_it_changed_and_a_bad_rewrite_keeps_the_last_good_set(tmp_path, monkeypatch):
    monkeypatch.setattr(keys, "CHECK_INTERVAL_S", 0.0)
    path = tmp_path / "keys"
    path.write_text(sha256_hex(A) + "\n")
    logged: list[str] = []
    f = KeyFile(path, "--auth-keys-file", logged.append)
    assert f.hashes() == {digest(A)}
    _rewrite(path, f"{sha256_hex(A)}\n{sha256_hex(B)}\n")
    assert f.hashes() == {digest(A), digest(B)}
    assert logged == [f"serve: --auth-keys-file {path} re-read: 2 key(s) accepted"]
    _rewrite(path, f"{sha256_hex(B)}\nsecret-pasted-by-mistake\n", age_s=2.0)
    assert f.hashes() == {digest(A), digest(B)}, "a malformed rewrite keeps the last good set"
    assert f.hashes() == {digest(A), digest(B)}
    assert len(logged) == 2 and "line 2 is not a SHA-256" in logged[1] and "keeping the 2 key(s)" in logged[1]
    assert "secret" not in logged[1] and sha256_hex(B) not in logged[1]
    path.unlink()
    assert f.hashes() == {digest(A), digest(B)} and "cannot read it" in logged[2], "a vanished file keeps them too"
    _rewrite(path, "# all keys revoked\n", age_s=3.0)
    assert f.hashes() == frozenset() and "none: every guarded endpoint answers 401" in logged[3]


def test_a_young_change_is_read_on_the_next_check_and_checks_are_rate_limited(tmp_path, monkeypatch):
    path = tmp_path / "keys"
    path.write_text(sha256_hex(A) + "\n")
    f = KeyFile(path, "--auth-keys-file", lambda line: None)
    path.write_text(f"{sha256_hex(A)}\n{sha256_hex(B)}\n")          # in place, now: maybe mid-write
    assert f.hashes() == {digest(A)}, "stat-ed at most every CHECK_INTERVAL_S"
    deadline = time.monotonic() + 5
    first = None
    while time.monotonic() < deadline and digest(B) not in f.hashes():
        first = first or time.monotonic()
        time.sleep(0.01)
    waited = time.monotonic() - (first or time.monotonic())
    assert f.hashes() == {digest(A), digest(B)}
    assert waited <= keys.CHECK_INTERVAL_S + keys.SETTLE_S + 0.2, waited


def test_the_policy_lets_in_by_key_and_role():
    policy = Policy(access=AccessConfig(auth_key_sha256=(sha256_hex(A),), model_control="explicit",
                                        admin_key_sha256=(sha256_hex(ADMIN),)))
    cases = {  # (category, control) -> status for no key, a wrong key, the key, the admin key
        (Category.HEALTH, False): (200, 200, 200, 200),
        (Category.METADATA, False): (401, 401, 200, 200),
        (Category.INFERENCE, False): (401, 401, 200, 200),
        (Category.STATISTICS, False): (401, 401, 200, 200),
        (Category.SHARED_MEMORY, False): (401, 401, 200, 200),
        (Category.MODEL_REPOSITORY, False): (401, 401, 200, 200),
        (Category.MODEL_REPOSITORY, True): (401, 401, 403, 200),
        (None, False): (401, 401, 200, 200),                      # no route: the key first, then 404 / 405
    }
    for (category, control), want in cases.items():
        got = tuple(status_of(policy, call(category, key, control)) for key in (None, "wrong", A, ADMIN))
        assert got == want, (category, control, got)
    with pytest.raises(Unauthorized) as exc:
        policy.check(call(Category.INFERENCE, "wrong"))
    assert exc.value.headers == (("WWW-Authenticate", 'Bearer realm="ngcx-runtime", error="invalid_token"'),)
    with pytest.raises(Unauthorized) as exc:
        policy.check(call(Category.INFERENCE, raw="Basic dXNlcjpwYXNz"))
    assert exc.value.headers == (("WWW-Authenticate", 'Bearer realm="ngcx-runtime"'),)
    assert "is not 'Bearer <key>'" in exc.value.message
    with pytest.raises(ProtocolError, match="needs the admin key; this key is not one"):
        policy.check(call(Category.MODEL_REPOSITORY, A, control=True))


def test_open_locked_and_control_off_servers():
    open_policy = Policy()
    assert open_policy.open
    for category in Category:
        assert status_of(open_policy, call(category)) == 200
    assert status_of(open_policy, call(Category.MODEL_REPOSITORY, control=True)) == 403   # off by default
    assert status_of(open_policy, call(Category.MODEL_REPOSITORY, ADMIN, control=True)) == 403
    # keys and control off: a peer without a key gets the 401, one with a key learns control is off
    keyed = Policy(access=AccessConfig(auth_key_sha256=(sha256_hex(A),)))
    assert status_of(keyed, call(Category.MODEL_REPOSITORY, control=True)) == 401
    assert status_of(keyed, call(Category.MODEL_REPOSITORY, A, control=True)) == 403
    # only an admin key: the rest stays open, control needs it
    admin_only = Policy(access=AccessConfig(model_control="explicit", admin_key_sha256=(sha256_hex(ADMIN),)))
    assert admin_only.open and status_of(admin_only, call(Category.INFERENCE)) == 200
    assert status_of(admin_only, call(Category.MODEL_REPOSITORY, control=True)) == 401
    assert status_of(admin_only, call(Category.MODEL_REPOSITORY, A, control=True)) == 401
    assert status_of(admin_only, call(Category.MODEL_REPOSITORY, ADMIN, control=True)) == 200


def test_an_empty_keys_file_locks_instead_of_opening(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# no key yet\n")
    policy = Policy(access=AccessConfig(auth_keys_file=path))
    assert not policy.open
    assert status_of(policy, call(Category.INFERENCE, A)) == 401
    assert status_of(policy, call(Category.HEALTH)) == 200
    assert KeySet().configured is False and KeySet(file=policy.users.file).configured is True


@pytest.mark.parametrize(("config", "fragment"), [
    (AccessConfig(model_control="explicit"), "--model-control-mode explicit needs an admin key"),
    (AccessConfig(model_control="auto"), "--model-control-mode 'auto': choose one of none, explicit"),
    (AccessConfig(auth_key_sha256=("abc",)), "--auth-key-sha256 is not a SHA-256 in hex"),
    (AccessConfig(admin_key_sha256=("x" * 64,)), "--admin-key-sha256 is not a SHA-256 in hex"),
    (AccessConfig(auth_key_sha256=sha256_hex(A)), "give a list of hashes"),          # type: ignore[arg-type]
    (AccessConfig(tls_cert="cert.pem"), "--tls-cert needs --tls-key too"),
    (AccessConfig(tls_key="key.pem"), "--tls-key needs --tls-cert too"),
])
def test_a_bad_config_is_one_line(config, fragment):
    with pytest.raises(RuntimeUserError) as exc:
        Policy(access=config)
    assert fragment in str(exc.value) and "\n" not in str(exc.value)
    assert "x" * 64 not in str(exc.value)
