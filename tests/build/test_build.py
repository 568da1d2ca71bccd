"""`ngcx build` / `ngcx test` / `ngcx images` against the real Docker Engine (BuildKit).

The cuda:24.05 image is built for real from real wheels (cudart, cuBLAS, cuDNN, NCCL) on the
offline base; `ngcx test` must read every pin back from the libraries loaded in the container.
One build goes through a CA bundle and a pip index URL with a password, and every layer, the
history, the config and the build output are searched for both afterwards.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess

import pytest
import yaml

from support import BASE_IMAGE, SecretScan, run_ngcx

pytestmark = pytest.mark.docker

CUDA_REF = "cuda:24.05"
CUDA_TAG = "ngcx/cuda:24.05-runtime"
CUDART = "nvidia-cuda-runtime-cu12==12.4.127"  # the stack's smallest wheel, its last wheel layer


def test_a_wheel_whose_bytes_differ_fails_the_build_in_one_line(docker_client, base_image, tmp_path):
    """The lock beside a catalog records another sha256 for cudart than the index's file has (as a replaced wheel
    on a mirror or proxy looks from the other side): the build stops at cudart's layer in one line naming the
    package, the sha256 of the bytes pip got and the recorded one, and no image is tagged."""
    from ngcx.core import paths

    catalog = tmp_path / "registry.yaml"
    catalog.write_text(paths.registry_file().read_text())
    lock = json.loads("".join(ln for ln in paths.registry_file().with_name("registry.lock.yaml").read_text()
                              .splitlines(True) if not ln.startswith("#")))
    real, wrong = lock["hashes"][CUDART], "0" * 64
    lock["hashes"][CUDART] = [wrong]
    catalog.with_name("registry.lock.yaml").write_text(yaml.safe_dump(lock))
    tag = "ngcx-test/tampered:cuda"
    result = run_ngcx("build", CUDA_REF, "--base", "offline", "--tag", tag, "--catalog", str(catalog),
                      "--progress", "plain")
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("ngcx: error:")]
    assert len(errors) == 1 and "failed step:" not in result.stderr, result.stderr[-3000:]
    got = re.search(rf"^ngcx: error: {re.escape(CUDART)}: the wheel's sha256 is ([0-9a-f]{{64}}), but the "
                    rf"catalog's lock \(registry.lock.yaml\) has {wrong}: ", errors[0])
    assert got and got.group(1) in real, errors[0]  # the index's own file: its bytes are the ones really locked
    assert not docker_client.images.list(name=tag)


def test_build_through_ca_and_password_index_leaves_no_secret(docker_client, base_image, tmp_path, isolated_state,
                                                              secret_canaries):
    """A no-cache build, so every RUN step really mounts the CA and pip.conf; then no layer may hold them."""
    tag = "ngcx-test/secrets:cuda"
    result = run_ngcx("build", CUDA_REF, "--base", "offline", "--tag", tag, "--no-cache", "--progress", "plain",
                      "--ca-cert", str(secret_canaries.ca_bundle), "--pip-index-url", secret_canaries.pip_index_url())
    try:
        assert result.returncode == 0, result.stderr[-2000:]
        scan = SecretScan(secret_canaries.needles())
        scan.process("build", result)
        scan.image(docker_client, tag, tmp_path)
        print(f"no-cache build: {scan.summary()}")
        assert scan.hits == []
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)


def test_build_then_test_reads_every_pin_from_loaded_libraries(base_image):
    build = run_ngcx("build", CUDA_REF, "--base", "offline")
    assert build.returncode == 0, build.stderr[-2000:]
    assert f"built {CUDA_TAG}" in build.stdout

    result = run_ngcx("test", CUDA_REF, "--json")
    report = json.loads(result.stdout)
    assert result.returncode == 0, result.stdout[-3000:]
    assert report["ok"] is True
    checks = {c["name"]: c for c in report["checks"]}
    for component, pin in (("cudart", "12.4.127"), ("cublas", "12.4.5.8"), ("cudnn", "9.1.0.70"), ("nccl", "2.21.5")):
        assert checks[component]["status"] == "✓"
        assert checks[component]["expected"] == pin
        assert "wheel" in checks[component]["found"]  # read from the loaded library's owning wheel
    assert report["probe"]["libraries"]["cudnn"]["raw"] == 90100  # cudnnGetVersion() itself
    gpu_rows = [c for c in report["checks"] if c["name"].startswith("GPU")]
    assert gpu_rows and all(c["status"] == "skipped" and "no GPU" in c["note"] for c in gpu_rows)
    assert any(c["name"].startswith("image test") and c["status"] == "✓" for c in report["checks"])


def test_warm_rebuild_reuses_every_heavy_layer(base_image):
    first = run_ngcx("build", CUDA_REF, "--base", "offline")
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_ngcx("build", CUDA_REF, "--base", "offline", "--progress", "quiet")
    assert again.returncode == 0
    cached = [ln for ln in again.stderr.splitlines() if ln.startswith("✓ cached")]
    assert any("base OS" in ln and "(RUN)" in ln for ln in cached), again.stderr
    assert any("CUDA 12.4 libraries as pinned wheels" in ln for ln in cached), again.stderr
    m = re.search(r"\((\d+)/(\d+) steps cached\)", again.stdout)
    assert m and int(m.group(1)) >= 5, again.stdout


def test_images_and_catalog_show_report_the_build(base_image):
    assert run_ngcx("build", CUDA_REF, "--base", "offline").returncode == 0
    rows = json.loads(run_ngcx("images", "--json").stdout)
    row = next(r for r in rows if r["tag"] == CUDA_TAG)
    assert row["present"] and row["size_bytes"] > 500_000_000 and row["release"] == "24.05"
    show = json.loads(run_ngcx("catalog", "show", CUDA_REF, "--json").stdout)
    assert any(b["tag"] == CUDA_TAG and b["size_bytes"] for b in show["built"])


def test_gpu_require_without_gpu_fails_in_one_line(base_image):
    assert run_ngcx("build", CUDA_REF, "--base", "offline").returncode == 0
    result = run_ngcx("test", CUDA_REF, "--gpu", "require")
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "no GPU" in result.stderr


def test_failed_step_is_shown_with_its_log_and_no_password(base_image):
    password = f"pw-{secrets.token_hex(8)}"
    result = run_ngcx("build", CUDA_REF, "--base", "offline", "--tag", "ngcx-test/fail:x", "--no-cache",
                      "--pip-index-url", f"http://u:{password}@127.0.0.1:9/simple", "--progress", "quiet")
    assert result.returncode == 1
    assert "failed step: [" in result.stderr and "CUDA 12.4 libraries" in result.stderr
    assert "  | " in result.stderr  # the step's last log lines
    assert "ngcx: error: build failed at [" in result.stderr
    assert password not in result.stdout + result.stderr


@pytest.mark.parametrize(("args", "env", "expect"), [
    (["build", "cuda:99.99"], {}, "unknown release '99.99' of image 'cuda'"),
    (["build", CUDA_REF, "--ca-cert", "/nonexistent/ca.pem"], {}, "does not exist"),
    (["build", CUDA_REF, "--ca-cert", "/etc/hostname"], {}, "is not a PEM certificate bundle"),
    (["build", CUDA_REF, "--base", "ngcx/base:does-not-exist"], {}, "ngcx base bootstrap"),
    (["build", CUDA_REF, "--pip-index-url", "ftp://x"], {}, "is not an http(s) URL"),
    (["build", CUDA_REF, "--variant", "fat"], {}, "unknown variant 'fat'"),
    (["build", CUDA_REF], {"DOCKER_HOST": "unix:///tmp/ngcx-no-such.sock"}, "Docker Engine not reachable"),
    (["test", CUDA_REF], {"DOCKER_HOST": "unix:///tmp/ngcx-no-such.sock"}, "Docker Engine not reachable"),
    (["test", "ngcx/never-built:1"], {}, "unknown image"),
])
def test_bad_input_gives_one_line_and_exit_2(docker_client, args, env, expect):
    result = run_ngcx(*args, env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ngcx: error: "), result.stderr
    assert expect in lines[0]
    assert "Traceback" not in result.stderr


def test_offline_base_is_what_builds_start_from(docker_client, base_image):
    assert run_ngcx("build", CUDA_REF, "--base", "offline").returncode == 0
    labels = docker_client.images.get(CUDA_TAG).labels
    assert base_image == BASE_IMAGE
    assert labels["org.opencontainers.image.base.name"] == BASE_IMAGE
    assert labels["ai.ngcx.pin.cudnn"] == "9.1.0.70" and labels["ai.ngcx.min-driver"] == "525.60.13"


def test_a_retagged_offline_base_is_refused_in_one_line(docker_client, base_image, isolated_state):
    """`ngcx base bootstrap` recorded which image the base tag was; another image under that tag is not built
    from, whatever it holds (here the record names another ID, as after a `docker tag` over the base)."""
    from ngcx.render import basepin

    recorded = "sha256:" + "1" * 64
    basepin.record(BASE_IMAGE, recorded)  # NGCX_STATE_DIR is the isolated one: the build reads this record
    result = run_ngcx("build", CUDA_REF, "--base", "offline", "--tag", "ngcx-test/retagged:cuda")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    actual = docker_client.images.get(BASE_IMAGE).id
    assert lines == [f"ngcx: error: base {BASE_IMAGE} is now image {actual[:19]}, not {recorded[:19]} recorded "
                     "when it was made: refusing a retagged base (if you re-made it on purpose, `ngcx base "
                     f"bootstrap` records the new one; else tag {recorded[:19]} back as {BASE_IMAGE})"]
    assert not docker_client.images.list(name="ngcx-test/retagged")
