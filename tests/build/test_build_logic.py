"""Pure logic of build / test / run: pin comparison, driver refusal, progress parsing, redaction.

No engine needed: these are the decisions a user sees in `ngcx test` tables and `ngcx run`
refusals, checked on the shipped catalog's real releases.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ngcx.build.image import BuildOptions, detect_ca, pip_conf_text
from ngcx.catalog import load_catalog
from ngcx.core.errors import UserError
from ngcx.core.output import redact
from ngcx.core.progress import ProgressParser
from ngcx.test.image import FAIL, PASS, framework_checks, library_checks, version_matches
from ngcx.workstation.host import check_driver


@pytest.mark.parametrize(("loaded", "pin", "ok"), [
    ("9.1.0", "9.1.0.70", True), ("12.4", "12.4.127", True), ("2.21.5", "2.21.5", True),
    ("2.5.1+cu124", "2.5.1", True), ("9.1.1", "9.1.0.70", False), ("12.5", "12.4.127", False),
    ("", "1.0", False),
])
def test_version_matches_compares_the_components_the_library_reports(loaded, pin, ok):
    assert version_matches(loaded, pin) is ok


def _lib(version: str, soname: str, wheel: str, wheel_version: str) -> dict:
    return {"version": version, "path": f"/x/{soname}", "wheel": {"name": wheel, "version": wheel_version}}


def _labels(ref: str) -> dict[str, str]:
    return load_catalog().resolve(ref).labels()


def test_library_checks_fail_on_a_wrong_wheel_even_when_the_soname_matches():
    labels = _labels("cuda:24.05")
    report = {"libraries": {
        "cudart": _lib("12.4", "libcudart.so.12", "nvidia-cuda-runtime-cu12", "12.4.127"),
        "cublas": _lib("12.4.5", "libcublas.so.12", "nvidia-cublas-cu12", "12.4.5.8"),
        "cudnn": _lib("9.1.0", "libcudnn.so.9", "nvidia-cudnn-cu12", "9.1.0.99"),
        "nccl": {"error": "libnccl.so.2 not found"},
    }}
    status = {c.name: c.status for c in library_checks(labels, report)}
    assert status == {"cudart": PASS, "cublas": PASS, "cudnn": FAIL, "nccl": FAIL}


def test_framework_checks_include_the_frameworks_own_view():
    labels = _labels("pytorch:24.11")
    report = {"python": "3.11.2", "frameworks": {"torch": {"version": "2.5.1+cu124", "cuda": "12.4",
                                                           "cudnn": "9.1.0", "nccl": "2.21.5"}}}
    checks = {c.name: c.status for c in framework_checks(labels, report)}
    assert checks == {"python": PASS, "torch": PASS, "torch CUDA": PASS, "torch cuDNN": PASS, "torch NCCL": PASS}
    report["frameworks"]["torch"]["cuda"] = None  # a CPU wheel slipped in
    assert {c.name: c.status for c in framework_checks(labels, report)}["torch CUDA"] == FAIL


def test_run_refuses_a_driver_below_the_cuda_floor_naming_both_versions():
    release = load_catalog().resolve("cuda:26.03")
    with pytest.raises(UserError, match=r"host driver 550\.54\.14 .* needs >= 580\.65\.06"):
        check_driver(release.labels(), release, "550.54.14",
                     [{"index": 0, "name": "NVIDIA H100", "compute_capability": "9.0"}])
    check_driver(release.labels(), release, "580.159.04",
                 [{"index": 0, "name": "NVIDIA H100", "compute_capability": "9.0"}])


def test_run_raises_the_floor_for_blackwell_and_refuses_unsupported_architectures():
    release = load_catalog().resolve("cuda:25.08")
    blackwell = [{"index": 0, "name": "RTX 5090", "compute_capability": "12.0"}]
    with pytest.raises(UserError, match=r"needs >= 570\.26"):
        check_driver(release.labels(), release, "560.35.03", blackwell)
    check_driver(release.labels(), release, "560.35.03", [{"index": 0, "name": "T4", "compute_capability": "7.5"}])
    with pytest.raises(UserError, match="compute capability 6.1"):
        check_driver(release.labels(), release, "580.1", [{"index": 0, "name": "P40", "compute_capability": "6.1"}])


def test_redact_hides_credentials_in_urls():
    assert redact("Looking in https://bob:hunter2@mirror.example/simple") == \
        "Looking in https://***@mirror.example/simple"
    assert redact("no secret here http://host/x") == "no secret here http://host/x"


def test_pip_conf_carries_index_urls_only_when_asked():
    assert pip_conf_text(BuildOptions()) is None
    text = pip_conf_text(BuildOptions(pip_index_url="https://u:p@m/simple", pip_extra_index_urls=["https://a", "https://b"]))
    assert text == "[global]\nindex-url = https://u:p@m/simple\nextra-index-url = https://a https://b\n"


def test_ca_is_detected_from_the_environment_in_order(tmp_path, monkeypatch):
    pem = tmp_path / "ca.pem"
    pem.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    for var in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        monkeypatch.delenv(var, raising=False)
    assert detect_ca(None) is None
    monkeypatch.setenv("SSL_CERT_FILE", str(pem))
    assert detect_ca(None) == pem
    monkeypatch.setenv("PIP_CERT", str(tmp_path / "missing.pem"))
    with pytest.raises(UserError, match=r"from \$PIP_CERT\) does not exist"):
        detect_ca(None)


PLAIN_LOG = """\
#1 [internal] load build definition from Dockerfile
#1 DONE 0.0s
#5 [2/4] RUN apt-get update
#5 CACHED
#6 [3/4] RUN pip install nvidia-cudnn-cu12==9.1.0.70
#6 0.512 Looking in indexes: https://user:topsecret@mirror/simple
#6 1.020 ERROR: No matching distribution found
#6 ERROR: executor failed running [/bin/bash -o pipefail -c pip install]: exit code: 1
"""


def test_progress_parser_finds_the_failing_step_and_redacts_its_log():
    parser = ProgressParser()
    for line in PLAIN_LOG.splitlines():
        parser.feed(line)
    steps = parser.build_steps()
    assert [s.status for s in steps] == ["cached", "error"]
    failed = parser.failed()
    assert failed is not None and failed.name.startswith("[3/4] RUN pip install")
    assert "topsecret" not in "\n".join(failed.log)
    assert list(failed.log)[-1] == "ERROR: No matching distribution found"


def test_rendered_context_holds_no_secret_material(tmp_path: Path):
    from ngcx.render.dockerfile import write_context

    release = load_catalog().resolve("cuda:24.05")
    ctx = write_context(release, tmp_path / "ctx")
    names = {p.relative_to(ctx.path).as_posix() for p in ctx.path.rglob("*") if p.is_file()}
    assert "Dockerfile" in names and "ngcx-runtime/pyproject.toml" in names
    assert not [n for n in names if n.endswith((".pem", ".crt", "pip.conf"))]


# pip's own output for a wheel whose bytes are not the locked ones, as BuildKit's plain progress shows it (the
# format pip 23 and 26 both print: Debian bookworm's pip runs in the images).
PIP_MISMATCH = """\
#9 [4/12] RUN --mount=type=cache,id=ngcx-wheels,target=/root/.cache/ngcx-wheels,sharing=locked ...
#9 1.204 Looking in links: /root/.cache/ngcx-wheels
#9 1.311 Processing /root/.cache/ngcx-wheels/nvidia_cuda_runtime_cu12-12.4.127-py3-none-manylinux2014_x86_64.whl
#9 1.502 ERROR: THESE PACKAGES DO NOT MATCH THE HASHES FROM THE REQUIREMENTS FILE. If you have updated the package \
versions, please update the hashes. Otherwise, examine the package contents carefully; someone may have tampered \
with them.
#9 1.502     nvidia-cuda-runtime-cu12==12.4.127 from https://files.pythonhosted.org/packages/ea/27/\
nvidia_cuda_runtime_cu12-12.4.127-py3-none-manylinux2014_x86_64.whl (from -r /dev/fd/63 (line 1)):
#9 1.502         Expected sha256 1111111111111111111111111111111111111111111111111111111111111111
#9 1.502         Expected     or 2222222222222222222222222222222222222222222222222222222222222222
#9 1.502              Got        64403288fa2136ee8e467cdc9c9427e0434110899d07c779f25b5c068934faa5
#9 1.502
#9 ERROR: executor failed running [/bin/bash -o pipefail -c ...]: exit code: 1
"""


def test_a_wheel_with_other_bytes_is_one_line_naming_the_package_and_both_hashes(capsys):
    from ngcx.build.image import BuildFailed, _report_failure

    parser = ProgressParser()
    for line in PIP_MISMATCH.splitlines():
        parser.feed(line)
    with pytest.raises(BuildFailed) as info:
        _report_failure(parser)
    assert info.value.line() == (
        "nvidia-cuda-runtime-cu12==12.4.127: the wheel's sha256 is "
        "64403288fa2136ee8e467cdc9c9427e0434110899d07c779f25b5c068934faa5, but the catalog's lock "
        "(registry.lock.yaml) has 1111111111111111111111111111111111111111111111111111111111111111 or "
        "2222222222222222222222222222222222222222222222222222222222222222: its bytes are not the ones locked, so "
        "nothing was installed (a replaced file on the index, mirror or proxy; if the lock is stale: "
        "`ngcx catalog lock`)")
    assert capsys.readouterr().err == ""  # no step log around it: the one line is the whole report


def test_another_failure_still_shows_its_step_log(capsys):
    from ngcx.build.image import BuildFailed, _report_failure

    parser = ProgressParser()
    for line in PIP_MISMATCH.replace("DO NOT MATCH THE HASHES", "could not be found").splitlines():
        parser.feed(line)
    with pytest.raises(BuildFailed, match="build failed at"):
        _report_failure(parser)
    assert "  | " in capsys.readouterr().err
