"""Behind `ngcx test`: start an image, read what is ACTUALLY loaded inside it, compare with its pin labels.

Why: a label says what was asked for; only the running container says what the dynamic linker
and the framework really load (a wrong wheel, a stray LD_LIBRARY_PATH, pip replacing a pin).
The probe is ngcx-runtime's `info --json` (ctypes calls: cudaRuntimeGetVersion, cublasGetProperty,
cudnnGetVersion, ncclGetVersion; framework __version__ and its own CUDA view), then the image's
own tests (`ngcx-runtime selftest`). GPU checks run with a GPU, else they are reported skipped.

In a project folder (ngcx.yaml) the same checks run on the project's image, and then its served
model answers every example in examples.yaml (cli/project/check.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.errors import UserError

PASS, FAIL, SKIP = "✓", "✗", "skipped"


@dataclass
class Check:
    name: str
    expected: str
    found: str
    status: str  # ✓ / ✗ / skipped
    note: str = ""


# ----------------------------------------------------------------------------- comparisons


def version_matches(loaded: str, pin: str) -> bool:
    """A library reports fewer components than its wheel (cuDNN 9.1.0 vs 9.1.0.70): compare the
    components the library reports; local tags (+cu124) are ignored."""
    loaded_parts = loaded.split("+")[0].split(".")
    pin_parts = pin.split("+")[0].split(".")
    n = min(len(loaded_parts), len(pin_parts))
    return n > 0 and loaded_parts[:n] == pin_parts[:n]


def library_checks(labels: dict[str, str], report: dict[str, Any]) -> list[Check]:
    """One check per pinned CUDA library: loaded version and owning wheel vs the pin."""
    checks = []
    libs = report.get("libraries", {})
    for component in ("cudart", "cublas", "cudnn", "nccl", "tensorrt"):
        pin = labels.get(f"ai.ngcx.pin.{component}")
        if pin is None:
            continue
        lib = libs.get(component, {})
        if "error" in lib or not lib.get("version"):
            checks.append(Check(component, pin, lib.get("error", "not reported"), FAIL))
            continue
        wheel = lib.get("wheel") or {}
        found = f"{lib['version']} ({Path(lib.get('path', '')).name}"
        found += f", wheel {wheel['name']} {wheel['version']})" if wheel else ", not from a wheel)"
        ok = version_matches(lib["version"], pin) and (not wheel or wheel.get("version") == pin)
        checks.append(Check(component, pin, found, PASS if ok else FAIL))
    return checks


def framework_checks(labels: dict[str, str], report: dict[str, Any]) -> list[Check]:
    """Framework versions and each framework's own view of CUDA/cuDNN/NCCL."""
    fws = report.get("frameworks", {})
    cuda = labels.get("ai.ngcx.cuda", "")
    checks: list[Check] = []
    python_pin = labels.get("ai.ngcx.pin.python")
    if python_pin:
        found = report.get("python", "?")
        checks.append(Check("python", python_pin, found, PASS if version_matches(found, python_pin) else FAIL))
    for name in ("torch", "tensorflow", "onnxruntime"):
        pin = labels.get(f"ai.ngcx.pin.{name}")
        if pin is None:
            continue
        fw = fws.get(name)
        if not fw or "error" in fw:
            checks.append(Check(name, pin, (fw or {}).get("error", "does not import"), FAIL))
            continue
        checks.append(Check(name, pin, fw.get("version", "?"),
                            PASS if version_matches(fw.get("version", ""), pin) else FAIL))
        checks.extend(_framework_view(name, fw, labels, cuda))
    return checks


def _framework_view(name: str, fw: dict[str, Any], labels: dict[str, str], cuda: str) -> list[Check]:
    """torch.version.cuda / cudnn / nccl; tf build info; ORT's CUDA provider."""
    out = []
    if name in ("torch", "tensorflow"):
        seen_cuda = str(fw.get("cuda") or "")
        out.append(Check(f"{name} CUDA", cuda, seen_cuda or "none (CPU build?)",
                         PASS if seen_cuda and version_matches(seen_cuda, cuda) else FAIL))
        cudnn_pin = labels.get("ai.ngcx.pin.cudnn")
        seen_cudnn = str(fw.get("cudnn") or "")
        if cudnn_pin:
            out.append(Check(f"{name} cuDNN", cudnn_pin, seen_cudnn or "none",
                             PASS if seen_cudnn and version_matches(seen_cudnn, cudnn_pin) else FAIL))
        nccl_pin = labels.get("ai.ngcx.pin.nccl")
        if name == "torch" and nccl_pin:
            seen = str(fw.get("nccl") or "")
            out.append(Check("torch NCCL", nccl_pin, seen or "none",
                             PASS if seen and version_matches(seen, nccl_pin) else FAIL))
    if name == "onnxruntime":
        providers = fw.get("providers", [])
        ok = "CUDAExecutionProvider" in providers
        out.append(Check("onnxruntime CUDA EP", "CUDAExecutionProvider", ", ".join(providers) or "none",
                         PASS if ok else FAIL))
    return out


def gpu_checks(labels: dict[str, str], report: dict[str, Any], gpu_used: bool, why_not: str) -> list[Check]:
    """Driver floor and GPU architecture — only meaningful when the container saw a GPU."""
    if not gpu_used:
        return [Check("GPU driver", f">= {labels.get('ai.ngcx.min-driver', '?')}", "-", SKIP, why_not),
                Check("GPU architecture", labels.get("ai.ngcx.compute-capabilities", "?"), "-", SKIP, why_not)]
    from packaging.version import Version

    checks = []
    driver = (report.get("driver") or {}).get("version")
    floor = labels.get("ai.ngcx.min-driver", "0")
    if driver:
        checks.append(Check("GPU driver", f">= {floor}", driver, PASS if Version(driver) >= Version(floor) else FAIL))
    else:
        checks.append(Check("GPU driver", f">= {floor}", "not visible in the container", FAIL))
    supported = set(labels.get("ai.ngcx.compute-capabilities", "").split(","))
    for gpu in report.get("gpus", []):
        cc = gpu.get("compute_capability", "?")
        checks.append(Check(f"GPU {gpu.get('index')} {gpu.get('name')}", "one of " + ",".join(sorted(supported)), cc,
                            PASS if cc in supported else FAIL))
    return checks


def selftest_checks(results: list[dict[str, Any]]) -> list[Check]:
    status = {"passed": PASS, "failed": FAIL, "skipped": SKIP}
    return [Check(f"image test {r['name']}", "passes", r["status"], status.get(r["status"], FAIL),
                  r.get("reason") or r.get("error", "")) for r in results]


# ----------------------------------------------------------------------------- running


def run_in_image(client, tag: str, args: list[str], gpu: bool) -> tuple[int, str, str]:
    """Run ngcx-runtime ARGS in a throwaway container; (exit code, stdout, stderr)."""
    from docker.types import DeviceRequest

    kwargs: dict[str, Any] = {"device_requests": [DeviceRequest(count=-1, capabilities=[["gpu"]])]} if gpu else {}
    # The entrypoint is named: a project image (recipes/project.Dockerfile.j2) clears the base's.
    container = client.containers.run(tag, args, entrypoint=["ngcx-runtime"], detach=True, network_mode="none",
                                      **kwargs)
    try:
        result = container.wait(timeout=600)
        out = container.logs(stdout=True, stderr=False).decode(errors="replace")
        err = container.logs(stdout=False, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    return int(result.get("StatusCode", 1)), out, err


def test_image(tag: str, gpu_mode: str) -> tuple[list[Check], dict[str, Any]]:
    from ..core.engine import engine_client
    from ..workstation.host import host_has_gpu

    client = engine_client()
    labels = client.images.get(tag).labels or {}
    if "ai.ngcx.release" not in labels:
        raise UserError(f"{tag} carries no ai.ngcx.* labels: not an ngcx image")
    has_gpu, why = host_has_gpu()
    if gpu_mode == "off":
        has_gpu, why = False, "skipped: --gpu off"
    elif gpu_mode == "require" and not has_gpu:
        raise GpuRequired(f"--gpu require: {why}")
    code, out, err = run_in_image(client, tag, ["info", "--json"], has_gpu)
    try:
        report = json.loads(out)
    except json.JSONDecodeError:
        raise UserError(f"{tag}: `ngcx-runtime info --json` failed (exit {code}): "
                        f"{(err.strip().splitlines() or ['no output'])[-1][:200]}") from None
    checks = library_checks(labels, report) + framework_checks(labels, report)
    checks += gpu_checks(labels, report, has_gpu, why)
    code, out, err = run_in_image(client, tag, ["selftest", "--json"], has_gpu)
    try:
        checks += selftest_checks(json.loads(out)["results"])
    except (json.JSONDecodeError, KeyError):
        checks.append(Check("image tests", "run", f"selftest failed (exit {code}): "
                            f"{(err.strip().splitlines() or ['no output'])[-1][:200]}", FAIL))
    return checks, report


class GpuRequired(UserError):
    """--gpu require on a host without a GPU: exit 1 with one line."""

    exit_code = 1
