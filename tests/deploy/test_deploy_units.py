"""Deploy's pieces that need no engine and no cloud: credentials, endpoints, the host script, records.

Each test is what a user would notice: a half-set key pair is one line naming the missing variable,
a secret never shows in a repr, a hostile CMD cannot break out of the host script, an interrupted
deploy is recognised by the next command, an unknown cloud is one line.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from ngcx.clouds.aliyun import credentials, endpoint_override, tag_params
from ngcx.core.errors import UserError
from ngcx.deploy import TARGETS, VERBS, store, target
from ngcx.deploy.common import CREATING, INTENT, DeployConfig, format_phases
from ngcx.deploy.hostscript import HostJob, render

REPO = Path(__file__).resolve().parents[2]

SECRET = "s3cr3t-do-not-print"


@pytest.fixture
def no_env(monkeypatch, tmp_path):
    for var in ("ALIBABA_CLOUD_ACCESS_KEY_ID", "ALIBABA_CLOUD_ACCESS_KEY_SECRET", "ALIBABA_CLOUD_PROFILE",
                "NGCX_ALIYUN_ECS_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("NGCX_STATE_DIR", str(tmp_path / "state"))
    return tmp_path


def test_credentials_from_the_environment_never_show_the_secret(no_env, monkeypatch):
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "LTAIexample")
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_SECRET", SECRET)
    creds = credentials()
    assert creds.access_key_id == "LTAIexample" and SECRET not in repr(creds) and SECRET not in creds.source


def test_half_a_key_pair_is_one_line_naming_the_missing_variable(no_env, monkeypatch):
    monkeypatch.setenv("ALIBABA_CLOUD_ACCESS_KEY_ID", "LTAIexample")
    with pytest.raises(UserError, match="ALIBABA_CLOUD_ACCESS_KEY_SECRET is not set"):
        credentials()


def test_credentials_from_an_aliyun_cli_profile(no_env, monkeypatch):
    folder = no_env / ".aliyun"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"current": "work", "profiles": [
        {"name": "default", "mode": "AK", "access_key_id": "A1", "access_key_secret": "x"},
        {"name": "work", "mode": "AK", "access_key_id": "A2", "access_key_secret": SECRET,
         "region_id": "cn-beijing"}]}))
    creds = credentials()
    assert (creds.access_key_id, creds.region) == ("A2", "cn-beijing")
    monkeypatch.setenv("ALIBABA_CLOUD_PROFILE", "nope")
    with pytest.raises(UserError, match="has no profile 'nope'") as err:
        credentials()
    assert SECRET not in str(err.value)


def test_no_credentials_at_all_says_where_they_are_looked_for(no_env):
    with pytest.raises(UserError, match="no Alibaba Cloud credentials") as err:
        credentials()
    assert "ALIBABA_CLOUD_ACCESS_KEY_ID" in err.value.line()


@pytest.mark.parametrize("value, expect", [
    ("127.0.0.1:8443", ("127.0.0.1", 8443, "http")),
    ("localhost:9", ("localhost", 9, "http")),
    ("ecs.example.com:443", ("ecs.example.com", 443, "https")),   # never plain http off loopback
    ("10.0.0.5:80", ("10.0.0.5", 80, "https")),
])
def test_endpoint_override_is_plain_http_only_on_loopback(no_env, monkeypatch, value, expect):
    monkeypatch.setenv("NGCX_ALIYUN_ECS_ENDPOINT", value)
    assert endpoint_override() == expect


@pytest.mark.parametrize("value", ["127.0.0.1", "host:port", ":80", "h:70000"])
def test_a_malformed_endpoint_is_one_line(no_env, monkeypatch, value):
    monkeypatch.setenv("NGCX_ALIYUN_ECS_ENDPOINT", value)
    with pytest.raises(UserError, match="is not HOST:PORT"):
        endpoint_override()


def test_tags_become_numbered_rpc_parameters():
    assert tag_params({"ngcx:owner": "o", "ngcx:deployment": "7"}) == {
        "Tag.1.Key": "ngcx:deployment", "Tag.1.Value": "7", "Tag.2.Key": "ngcx:owner", "Tag.2.Value": "o"}


HOSTILE = "x'; touch /tmp/pwned; echo '"


def test_the_host_script_is_valid_sh_and_every_value_stays_one_word():
    from ngcx.registry.credentials import Credentials

    job = HostJob(7, "registry-vpc.cn-hangzhou.aliyuncs.com/team/app@sha256:" + "a" * 64,
                  "registry-vpc.cn-hangzhou.aliyuncs.com", "525.60.13", "require", Credentials("cr_temp_user", HOSTILE),
                  cmd=("ngcx-runtime", "serve", HOSTILE), env=(("MODE", HOSTILE),))
    text = render(job, "user-data")
    assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0
    assert shlex.quote(HOSTILE) in text and f"'{HOSTILE}'" not in text
    # the token reaches docker login on stdin only, never a command-line argument or an echo
    login = next(line for line in text.splitlines() if "docker login" in line)
    assert login.startswith("printf '%s' ") and "--password-stdin" in login
    run = text[text.index("docker run -d"):text.index(">/dev/null", text.index("docker run -d"))]
    words = shlex.split(run.replace("$GPU_ARGS", "").replace("\\\n", " "))
    assert words[-4:] == [job.pull_ref, "ngcx-runtime", "serve", HOSTILE] and all(w.strip() for w in words)
    assert words[words.index(f"MODE={HOSTILE}") - 1] == "-e"
    assert "no NVIDIA driver answers" in text and "fail " in text.split("no NVIDIA driver answers")[0][-40:]


def test_the_host_gets_key_hashes_and_makes_its_own_tls_key_pair_never_a_key():
    from ngcx.deploy import keys

    key = keys.new_key()
    job = HostJob(3, "r/x@sha256:" + "b" * 64, "r", "1", "auto", None, auth_hashes=(keys.digest(key),), tls=True)
    text = render(job, "user-data")
    assert subprocess.run(["sh", "-n"], input=text, text=True).returncode == 0
    assert keys.digest(key) in text and key not in text
    run = text[text.index("docker run -d"):text.index(">/dev/null", text.index("docker run -d"))]
    words = shlex.split(run.replace("$GPU_ARGS", "").replace("\\\n", " "))
    assert all(w.strip() for w in words) and words[-1] == job.pull_ref              # no stray escaped space
    assert "NGCX_RUNTIME_AUTH_KEYS=/run/ngcx/auth/keys" in words and '"$AUTH":/run/ngcx/auth:ro' in run
    assert "NGCX_RUNTIME_TLS_CERT=/run/ngcx/auth/tls.crt" in words and "openssl req -x509" in text
    open_job = HostJob(3, "r/x@sha256:" + "b" * 64, "r", "1", "auto", None, tls=False)
    open_text = render(open_job, "command")
    assert "NGCX_RUNTIME_AUTH_KEYS" not in open_text and 'rm -f "$AUTH/keys"' in open_text
    assert "openssl" not in open_text
    run = open_text[open_text.index("docker run -d"):open_text.index(">/dev/null", open_text.index("docker run -d"))]
    words = shlex.split(run.replace("$GPU_ARGS", "").replace("\\\n", " "))
    assert all(w.strip() for w in words) and words[-1] == open_job.pull_ref


def test_cpu_fallback_only_when_asked():
    job = HostJob(1, "r/x@sha256:" + "b" * 64, "r", "580.65.06", "auto", None)
    text = render(job, "command")
    assert "serving on the CPU" in text and "docker login" not in text


def test_user_data_over_16_kb_is_refused_in_one_line():
    job = HostJob(1, "r/x@sha256:" + "b" * 64, "r", "1", "auto", None, cmd=("x" * 17000,))
    with pytest.raises(UserError, match="16 KB user-data limit"):
        render(job, "user-data")


def test_an_interrupted_deploy_is_recognised_by_its_dead_pid(no_env):
    config = DeployConfig(cloud="aliyun", image="ngcx-app/x:latest", pull_ref=None, registry=None, labels={},
                          model=None, region="cn-hangzhou")
    record = store.create_intent(config)
    assert record.status == INTENT and store.interrupted() == []          # our own pid: alive
    dead = subprocess.Popen(["true"])
    dead.wait()
    store.update(record.id, status=CREATING, client_token="ngcx-t-1", pid=dead.pid)
    [found] = store.interrupted()
    assert (found.id, found.status, found.client_token) == (record.id, CREATING, "ngcx-t-1")
    assert found.spec["cloud"] == "aliyun" and "labels" not in found.spec


def test_every_target_offers_every_verb_and_an_unknown_cloud_is_one_line():
    for cloud in TARGETS:
        module = target(cloud)
        assert all(hasattr(module, verb) for verb in VERBS)
    assert target("aliyun").CAPABILITIES.stop_start_host and not target("local").CAPABILITIES.stop_start_host
    with pytest.raises(UserError, match="unknown cloud 'gcp'"):
        target("gcp")


def test_phases_read_in_order_with_a_total():
    got = format_phases({"ready": 2.0, "api": 0.25, "pull": 0.0})
    assert got == "api 0.2 s · pull 0.0 s · ready 2.0 s · total 2.2 s"


def test_the_hosts_wait_for_its_engine_counts_as_boot_and_old_marks_still_split():
    """A restarted host's dockerd starts with it; the host script waits for it (its first step, no command of its
    own since vm.run dropped _wait_docker), so that wait is boot, not pull. Marks without `engine` (a host script
    from before) split as they did."""
    from ngcx.deploy.common import DeployRecord
    from ngcx.deploy.vm import report_phases_with

    marks = {"script": 100.0, "engine": 101.25, "pulled": 101.375, "started": 102.0}
    record = DeployRecord(1, "aws", "img", "starting", 0.0, 0.0, phases={"api": 0.125, "boot": 16.5},
                          spec={"marks": marks})
    assert report_phases_with(None, record, 102.5) == {"api": 0.125, "boot": 17.75, "pull": 0.125, "start": 0.625,
                                                        "ready": 0.5}
    old = DeployRecord(2, "aws", "img", "starting", 0.0, 0.0, phases={"api": 0.125, "boot": 16.5},
                       spec={"marks": {k: v for k, v in marks.items() if k != "engine"}})
    split = report_phases_with(None, old, 102.5)
    assert split["boot"] == 16.5 and split["pull"] == 1.375
    script = render(HostJob(1, "r/i@sha256:" + "0" * 64, "r", "0", "auto", None), "command")
    assert script.index("until docker info") < script.index("T_ENGINE=$(now)") < script.index("docker pull")
    assert '"engine": %s' in script


def test_a_missing_cloud_sdk_names_the_extra_to_install(no_env, monkeypatch):
    import sys

    from ngcx.clouds.aliyun import AliyunCredentials, Api

    monkeypatch.setitem(sys.modules, "aliyunsdkcore.client", None)   # as if `ngcx[aliyun]` were not installed
    with pytest.raises(UserError) as err:
        Api("cn-hangzhou", AliyunCredentials("A", SECRET, "test"))
    assert "pip install 'ngcx[aliyun]'" in err.value.line() and SECRET not in err.value.line()


CAPS = ["7.0", "7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]


def test_any_cloud_ranks_every_clouds_candidates_on_one_scale():
    from ngcx.deploy import offers

    choices = [offers.choose(c, compute_capabilities=CAPS, driver_floor=None, gpu="A100", workload="transformer")
               for c in ("aliyun", "aws")]
    ranking = offers.merged(choices)
    # A100 80 GB (aliyun gn7e, 2039 GB/s) outranks A100 40 GB (both clouds, 1555 GB/s) for a transformer
    assert ranking[0][0] == "aliyun" and ranking[0][1].itype.gpu_memory_gib == 80
    assert {cloud for cloud, _ in ranking} == {"aliyun", "aws"}
    assert offers.merged_order(choices) == ["aliyun", "aws"]
    lines = offers.explain_merged(choices)
    assert lines[0].startswith("any: ") and " aws " in "\n".join(lines) and " aliyun " in "\n".join(lines)


def test_a_gpu_model_one_cloud_lacks_leaves_that_cloud_out_of_any():
    from ngcx.deploy.flow import choices_across

    config = DeployConfig(cloud="any", image="x", pull_ref=None, registry=None, model=None, gpu="A10G",
                          labels={"ai.ngcx.compute-capabilities": ",".join(CAPS)})
    [only] = choices_across(config, ["aliyun", "aws"])          # aliyun has no A10G: left out, not an error
    assert only.cloud == "aws" and only.candidates
    config.gpu = "Z9000"
    with pytest.raises(UserError, match="Z9000"):
        choices_across(config, ["aliyun", "aws"])


def test_each_cloud_pulls_from_its_own_registry_when_the_image_is_there():
    config = DeployConfig(cloud="aliyun", image="x", pull_ref=None, registry=None, labels={}, model=None,
                          pushes=[("localhost:5000/ecr/app", "sha256:" + "a" * 64),
                                  ("registry.cn-hangzhou.aliyuncs.com/team/app", "sha256:" + "b" * 64)],
                          allow_unsigned=True)    # the ranking alone: the trust gate has tests of its own
    ref, host = config.pick_push(lambda h: h.endswith(".aliyuncs.com"))
    assert host == "registry.cn-hangzhou.aliyuncs.com" and ref.endswith("@sha256:" + "b" * 64)
    ref, host = config.pick_push(lambda h: False)              # none of its own: the newest push
    assert host == "localhost:5000"
    assert DeployConfig(cloud="aliyun", image="x", pull_ref=None, registry=None, labels={},
                        model=None).pick_push(lambda h: True) is None


def test_the_host_scripts_certificate_lines_give_the_pem_and_the_key_pin(tmp_path):
    """What a running host's deploy pins comes from the host script's last lines (no second command): the
    probe run by a real shell over a real key pair gives back the file's PEM and the key's SHA-256, and output
    cut before the pin line (a truncated command output) gives nothing, so the certificate is read again."""
    import base64

    from ngcx.deploy.hostscript import certificate_probe
    from ngcx.deploy.vm import _certificate

    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=t", "-keyout", str(tmp_path / "tls.key"),
                    "-out", str(tmp_path / "tls.crt")], check=True, capture_output=True)
    out = subprocess.run(["bash", "-c", f"echo 'ngcx-host: started'; {certificate_probe(str(tmp_path))}"],
                         check=True, capture_output=True, text=True).stdout
    pem, pin = _certificate(out)
    assert pem == (tmp_path / "tls.crt").read_text()
    assert len(base64.b64decode(pin, validate=True)) == 32
    assert _certificate(out[:out.index("ngcx-host: tls pubkey")]) is None


def test_replicas_deploying_side_by_side_never_take_the_same_warm_host(no_env):
    """service.py deploys a service's replicas in parallel and each looks for a stopped host of the warm pool:
    exactly one of them may take it; the others go on to the next host (or create one)."""
    from concurrent.futures import ThreadPoolExecutor

    from ngcx.deploy.common import REPLACED, STOPPED

    config = DeployConfig(cloud="aliyun", image="ngcx-app/x:latest", pull_ref=None, registry=None, labels={},
                          model=None, region="cn-hangzhou")
    warm = store.update(store.create_intent(config).id, status=STOPPED, instance_id="i-warm",
                        instance_type="ecs.gn7i-c8g1.2xlarge", zone="cn-hangzhou-h")
    replicas = [store.create_intent(config) for _ in range(6)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        won = list(pool.map(lambda r: store.claim_host(warm, r.id), replicas))
    assert won.count(True) == 1, won
    winner = replicas[won.index(True)]
    assert store.get(warm.id).status == REPLACED
    assert [store.get(r.id).instance_id for r in replicas].count("i-warm") == 1
    assert store.get(winner.id).instance_id == "i-warm" and store.get(winner.id).zone == "cn-hangzhou-h"
    assert store.owned_instance_ids("aliyun") == {"i-warm"}        # owned throughout: gc never takes it

    # a host that cannot start again goes back to the pool, and the replica names no host
    store.release_host(warm, winner.id, "restart failed for capacity")
    assert (store.get(warm.id).status, store.get(warm.id).detail) == (STOPPED, "restart failed for capacity")
    assert store.get(winner.id).instance_id is None
    assert store.claim_host(warm, replicas[0].id)


@pytest.mark.parametrize("program", ["host_verify_program", "role_login_program"])
def test_a_packed_host_program_runs_as_its_source_does(program):
    """The host script carries its Python programs packed (hostscript.packed_program); unpacked by the host's own
    python3 they must behave as the files the other tests run: here, what each says and exits with given no args."""
    import shutil

    from ngcx.deploy import hostscript

    python = shutil.which("python3") or sys.executable
    packed = getattr(hostscript, program)()
    assert len(packed.splitlines()) == 2 and len(packed) < 6000
    source = {"host_verify_program": REPO / "cli" / "trust" / "host_verify.py",
              "role_login_program": REPO / "recipes" / "deploy" / "role_login.py"}[program].read_text()
    ran = [subprocess.run([python, "-"], input=text, capture_output=True, text=True, timeout=30)
           for text in (packed, source)]
    last = [r.stderr.strip().splitlines()[-1] for r in ran]       # (a traceback's line numbers differ, packed)
    assert (ran[0].returncode, ran[0].stdout, last[0]) == (ran[1].returncode, ran[1].stdout, last[1])
    assert ran[0].returncode != 0
