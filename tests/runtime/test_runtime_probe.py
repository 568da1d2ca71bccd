"""`ngcx-runtime info`: the ctypes probe, on this host and on real CUDA libraries from NVIDIA's wheels.

The real-library tests download nvidia-cuda-runtime-cu12==12.4.127 and nvidia-nccl-cu12==2.21.5
(pip download --no-deps, cached under /tmp across runs) and unpack them, so the probe reads
cudaRuntimeGetVersion / ncclGetVersion from NVIDIA's own binaries. No GPU is needed for either
call. Without network access to PyPI they are skipped with that reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from ngcx_runtime import probe
from ngcx_runtime.info import render_table

WHEELS = {"nvidia-cuda-runtime-cu12": "12.4.127", "nvidia-nccl-cu12": "2.21.5"}
WHEEL_CACHE = Path("/tmp/ngcx-test-cuda-wheels")
LIBS = ("cudart", "cublas", "cudnn", "nccl", "tensorrt")


@pytest.fixture(scope="session")
def cuda_wheels() -> Path:
    """Both wheels unpacked into one site-like dir (nvidia/<pkg>/lib + *.dist-info)."""
    site = WHEEL_CACHE / "site"
    if (site / ".complete").exists():
        return site
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    for name, version in WHEELS.items():
        if not list(WHEEL_CACHE.glob(f"{name.replace('-', '_')}-{version}-*.whl")):
            proc = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "download",
                    "--no-deps",
                    "--only-binary=:all:",
                    "--platform",
                    "manylinux2014_x86_64",
                    "--python-version",
                    "3.11",
                    "-d",
                    str(WHEEL_CACHE),
                    f"{name}=={version}",
                ],
                capture_output=True,
                text=True,
                timeout=600,
            )
            if proc.returncode != 0:
                pytest.skip(f"cannot download {name}=={version} from PyPI: {proc.stderr.strip()[-200:]}")
    site.mkdir(exist_ok=True)
    for whl in WHEEL_CACHE.glob("*.whl"):
        with zipfile.ZipFile(whl) as z:
            z.extractall(site)
    (site / ".complete").touch()
    return site


def _probe_json(*args: str, env: dict | None = None) -> dict:
    proc = subprocess.run(
        [sys.executable, "-m", "ngcx_runtime.cli", "info", "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_info_json_has_the_stable_shape_on_this_host():
    report = _probe_json()
    assert report["probe_version"] == 1
    assert report["python"] == ".".join(map(str, sys.version_info[:3]))
    assert set(report["libraries"]) == set(LIBS)
    for name, entry in report["libraries"].items():
        # each library is either read (version + raw + path + wheel) or says why not
        assert ("error" in entry) != ("version" in entry), (name, entry)
        if "version" in entry:
            assert {"raw", "path", "wheel"} <= set(entry)
    assert {"driver", "gpus", "backends", "frameworks"} <= set(report)
    assert set(report["backends"]) == {"tensorrt", "onnxruntime", "pytorch"}


@pytest.mark.skipif(Path("/dev/nvidiactl").exists(), reason="this host has an NVIDIA driver")
def test_no_driver_means_null_driver_and_no_gpus():
    report = _probe_json()
    assert report["driver"] is None and report["gpus"] == []
    assert report["driver_note"] == "no NVIDIA driver visible"
    assert report["backends"]["tensorrt"]["usable"] is False


def test_missing_library_is_an_error_string_not_a_crash():
    report = _probe_json()
    assert "libnvinfer.so" in report["libraries"]["tensorrt"]["error"]


def test_onnxruntime_is_reported_as_framework_and_backend():
    ort = pytest.importorskip("onnxruntime")
    report = _probe_json()
    assert report["frameworks"]["onnxruntime"] == {
        "version": ort.__version__,
        "providers": ort.get_available_providers(),
    }
    assert report["backends"]["onnxruntime"]["usable"] is True
    assert "CPUExecutionProvider" in report["backends"]["onnxruntime"]["providers"]


def test_probe_reads_cudart_and_nccl_versions_from_nvidia_wheels(cuda_wheels):
    report = _probe_json("--lib-path", str(cuda_wheels))
    cudart, nccl = report["libraries"]["cudart"], report["libraries"]["nccl"]
    assert (cudart["version"], cudart["raw"]) == ("12.4", 12040)
    assert (nccl["version"], nccl["raw"]) == ("2.21.5", 22105)
    assert cudart["path"].startswith(str(cuda_wheels)) and cudart["path"].endswith("libcudart.so.12")
    assert cudart["wheel"] == {"name": "nvidia-cuda-runtime-cu12", "version": "12.4.127"}
    assert nccl["wheel"] == {"name": "nvidia-nccl-cu12", "version": "2.21.5"}


def test_probe_search_path_from_environment(cuda_wheels):
    report = _probe_json(env={"NGCX_PROBE_LIB_PATH": str(cuda_wheels / "nvidia" / "nccl" / "lib")})
    assert report["libraries"]["nccl"]["version"] == "2.21.5"


def test_probe_library_in_process_api(cuda_wheels):
    entry = probe.probe_library("cudart", [cuda_wheels])
    assert entry["version"] == "12.4"


def test_probe_does_not_load_libraries_into_the_calling_process(cuda_wheels):
    """The probe runs dlopen in a child: loading e.g. a system cuDNN here would make a framework
    imported later bind to it (seen on a GPU host with torch)."""
    code = (
        "import json; from ngcx_runtime import probe; "
        f"probe.libraries([{str(cuda_wheels)!r}]); "
        "print(json.dumps([l for l in open('/proc/self/maps') if 'libnccl' in l or 'libcudart.so.12' in l]))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


def test_human_table_lists_every_library_and_backend():
    report = probe.probe()
    text = render_table(report)
    for name in (*LIBS, "onnxruntime", "pytorch"):
        assert name in text
    assert "driver:" in text
