"""What is actually loaded: CUDA libraries, frameworks, driver and GPUs, read through ctypes.

Why ctypes and not pip metadata: an image's pins are only true if the dynamic linker resolves
the same libraries the labels claim. Each library is opened by its soname (what the linker
would pick), falling back to the pip wheel layouts (site-packages/nvidia/*/lib, nvidia/cu13/lib,
tensorrt_libs), and asked for its own version. None of these calls needs a GPU, so the probe
runs in CI, in a slim image, and on a plain host alike. NVML (libnvidia-ml.so.1) reports the
driver and GPUs; libcuda.so.1 is the fallback.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import importlib
import importlib.util
import json
import os
import platform
import site
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

PROBE_VERSION = 1
ENV_LIB_PATH = "NGCX_PROBE_LIB_PATH"


def _ver_cudart(lib) -> tuple[int, str]:
    v = ctypes.c_int()
    _check(lib.cudaRuntimeGetVersion(ctypes.byref(v)), "cudaRuntimeGetVersion")
    return v.value, f"{v.value // 1000}.{(v.value % 1000) // 10}"


def _ver_cublas(lib) -> tuple[int, str]:
    parts = []
    for prop in (0, 1, 2):  # libraryPropertyType MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL
        v = ctypes.c_int()
        _check(lib.cublasGetProperty(prop, ctypes.byref(v)), "cublasGetProperty")
        parts.append(v.value)
    return parts[0] * 10000 + parts[1] * 100 + parts[2], ".".join(map(str, parts))


def _ver_cudnn(lib) -> tuple[int, str]:
    lib.cudnnGetVersion.restype = ctypes.c_size_t
    raw = int(lib.cudnnGetVersion())
    if raw >= 90000:  # cuDNN 9: M*10000 + m*100 + p
        return raw, f"{raw // 10000}.{(raw % 10000) // 100}.{raw % 100}"
    return raw, f"{raw // 1000}.{(raw % 1000) // 100}.{raw % 100}"  # cuDNN 8: M*1000 + m*100 + p


def _ver_nccl(lib) -> tuple[int, str]:
    v = ctypes.c_int()
    _check(lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
    raw = v.value
    if raw >= 20900:
        return raw, f"{raw // 10000}.{(raw % 10000) // 100}.{raw % 100}"
    return raw, f"{raw // 1000}.{(raw % 1000) // 100}.{raw % 100}"


def _ver_nvinfer(lib) -> tuple[int, str]:
    lib.getInferLibVersion.restype = ctypes.c_int32
    raw = int(lib.getInferLibVersion())
    if raw >= 100000:  # TensorRT 10+: M*10000 + m*100 + p
        return raw, f"{raw // 10000}.{(raw % 10000) // 100}.{raw % 100}"
    return raw, f"{raw // 1000}.{(raw % 1000) // 100}.{raw % 100}"


def _check(status: int, call: str) -> None:
    if status != 0:
        raise OSError(f"{call} returned status {status}")


# name -> (sonames in preference order, version reader)
LIBRARIES: dict[str, tuple[tuple[str, ...], Callable]] = {
    "cudart": (("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"), _ver_cudart),
    "cublas": (("libcublas.so.13", "libcublas.so.12", "libcublas.so.11"), _ver_cublas),
    "cudnn": (("libcudnn.so.9", "libcudnn.so.8"), _ver_cudnn),
    "nccl": (("libnccl.so.2",), _ver_nccl),
    "tensorrt": (("libnvinfer.so.11", "libnvinfer.so.10", "libnvinfer.so.8"), _ver_nvinfer),
}


def wheel_lib_dirs() -> list[Path]:
    """Library dirs of NVIDIA's pip wheels in every site-packages on sys.path."""
    roots = {Path(p) for p in sys.path if p and Path(p).is_dir()}
    with contextlib.suppress(AttributeError):
        roots.update(Path(p) for p in site.getsitepackages())
    dirs: list[Path] = []
    for root in sorted(roots):
        for pattern in (
            "nvidia/*/lib",
            "nvidia/cu13/lib",
            "nvidia/cu12/lib",
            "tensorrt_libs",
            "tensorrt_libs/lib",
        ):
            dirs.extend(Path(d) for d in sorted(glob.glob(str(root / pattern))))
    return dirs


def _extra_dirs(extra: Iterable[str | Path] | None) -> list[Path]:
    dirs = [Path(d) for d in (extra or [])]
    env = os.environ.get(ENV_LIB_PATH, "")
    dirs += [Path(d) for d in env.split(os.pathsep) if d]
    found: list[Path] = []
    for d in dirs:  # accept a wheel's unpacked root as well as its lib dir
        found.append(d)
        for pattern in ("nvidia/*/lib", "nvidia/cu13/lib", "tensorrt_libs"):
            found.extend(Path(x) for x in sorted(glob.glob(str(d / pattern))))
    return found


def _open(sonames: tuple[str, ...], extra: list[Path]) -> tuple[ctypes.CDLL, str]:
    """Open the first soname found: explicit dirs, then the linker's search, then pip wheels."""
    for d in extra:
        for so in sonames:
            if (d / so).exists():
                return ctypes.CDLL(str(d / so), mode=ctypes.RTLD_GLOBAL), str(d / so)
    errors = []
    for so in sonames:
        try:
            return ctypes.CDLL(so, mode=ctypes.RTLD_GLOBAL), so
        except OSError as exc:
            errors.append(str(exc))
    for d in wheel_lib_dirs():
        for so in sonames:
            if (d / so).exists():
                return ctypes.CDLL(str(d / so), mode=ctypes.RTLD_GLOBAL), str(d / so)
    raise OSError(f"{' / '.join(sonames)} not found by the dynamic linker or in pip wheel dirs")


class _DlInfo(ctypes.Structure):
    _fields_ = [
        ("dli_fname", ctypes.c_char_p),
        ("dli_fbase", ctypes.c_void_p),
        ("dli_sname", ctypes.c_char_p),
        ("dli_saddr", ctypes.c_void_p),
    ]


def _loaded_path(lib: ctypes.CDLL, symbol: str, fallback: str) -> str:
    """The file the linker actually mapped for `lib` (dladdr on one of its symbols)."""
    try:
        libc = ctypes.CDLL(None)
        info = _DlInfo()
        addr = ctypes.cast(getattr(lib, symbol), ctypes.c_void_p)
        if libc.dladdr(addr, ctypes.byref(info)) and info.dli_fname:
            return os.path.realpath(info.dli_fname.decode())
    except (AttributeError, OSError):
        pass
    return os.path.realpath(fallback) if os.path.exists(fallback) else fallback


def owning_wheel(path: str) -> dict[str, str] | None:
    """The pip distribution whose RECORD lists `path` (found from the dir holding its .dist-info)."""
    from importlib.metadata import distributions

    real = Path(os.path.realpath(path))
    for root in real.parents:
        if not any(root.glob("*.dist-info")):
            continue
        for dist in distributions(path=[str(root)]):
            for f in dist.files or []:
                try:
                    if Path(os.path.realpath(root / f)) == real:
                        return {"name": dist.metadata["Name"], "version": dist.version}
                except OSError:
                    continue
        return None
    return None


_SYMBOL = {
    "cudart": "cudaRuntimeGetVersion",
    "cublas": "cublasGetProperty",
    "cudnn": "cudnnGetVersion",
    "nccl": "ncclGetVersion",
    "tensorrt": "getInferLibVersion",
}


def probe_library(name: str, extra_dirs: Iterable[str | Path] | None = None) -> dict[str, Any]:
    sonames, reader = LIBRARIES[name]
    try:
        lib, where = _open(sonames, _extra_dirs(extra_dirs))
        raw, version = reader(lib)
    except (OSError, AttributeError) as exc:
        return {"error": str(exc).splitlines()[0]}
    path = _loaded_path(lib, _SYMBOL[name], where)
    return {"version": version, "raw": raw, "path": path, "wheel": owning_wheel(path)}


def libraries(extra_dirs: Iterable[str | Path] | None = None) -> dict[str, dict[str, Any]]:
    """Probe every library in a child interpreter.

    Why a child: dlopen() of, say, the system libcudnn.so.9 in this process would make a
    framework imported afterwards bind to that copy instead of its bundled one (seen on a GPU
    host: torch then refused to start, "compiled against 9.19 but found 9.14"). The probe must
    not change what it measures.
    """
    extra = [str(d) for d in (extra_dirs or [])]
    try:
        proc = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--libraries-json", *extra],
            capture_output=True,
            text=True,
            timeout=120,
        )
        return json.loads(proc.stdout)
    except (OSError, ValueError, subprocess.SubprocessError) as exc:
        return {name: {"error": f"library probe failed: {exc}".splitlines()[0]} for name in LIBRARIES}


def libraries_here(extra_dirs: Iterable[str | Path] | None = None) -> dict[str, dict[str, Any]]:
    """Probe in this process (what the child runs)."""
    return {name: probe_library(name, extra_dirs) for name in LIBRARIES}


def mapped_copies() -> dict[str, str]:
    """Library files already mapped into this process (e.g. by torch), by library name."""
    found: dict[str, str] = {}
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return found
    stems = {
        name: tuple(so.split(".so")[0] + ".so" for so in sonames) for name, (sonames, _) in LIBRARIES.items()
    }
    for line in maps:
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        base = os.path.basename(path)
        for name, prefixes in stems.items():
            if name not in found and any(base.startswith(p + ".") or base == p for p in prefixes):
                found[name] = os.path.realpath(path)
    return found


def framework_copies(linker_view: dict[str, dict[str, Any]]) -> None:
    """Add "framework_loaded" to a library entry when a framework in this process mapped another file."""
    for name, path in mapped_copies().items():
        entry = linker_view.get(name, {})
        if entry.get("path") == path:
            continue
        try:
            raw, version = LIBRARIES[name][1](ctypes.CDLL(path))  # already mapped: no new load
        except (OSError, AttributeError) as exc:
            entry["framework_loaded"] = {"path": path, "error": str(exc).splitlines()[0]}
            continue
        entry["framework_loaded"] = {
            "path": path,
            "version": version,
            "raw": raw,
            "wheel": owning_wheel(path),
        }


# ---------------------------------------------------------------- frameworks


def _framework(name: str, read: Callable[[Any], dict[str, Any]]) -> dict[str, Any] | None:
    if importlib.util.find_spec(name) is None:
        return None
    try:
        return read(importlib.import_module(name))
    except Exception as exc:  # noqa: BLE001 - a broken install is reported, not fatal
        return {"error": f"{type(exc).__name__}: {exc}".splitlines()[0]}


def _torch(torch) -> dict[str, Any]:
    out: dict[str, Any] = {"version": torch.__version__, "cuda": torch.version.cuda}
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if cudnn:
        out["cudnn"] = (
            f"{cudnn // 10000}.{(cudnn % 10000) // 100}.{cudnn % 100}"
            if cudnn >= 90000
            else f"{cudnn // 1000}.{(cudnn % 1000) // 100}.{cudnn % 100}"
        )
    else:
        out["cudnn"] = None
    try:
        nccl = torch.cuda.nccl.version()
        out["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
    except Exception:  # noqa: BLE001 - CPU builds have no NCCL
        out["nccl"] = None
    return out


def _tensorflow(tf) -> dict[str, Any]:
    info = dict(tf.sysconfig.get_build_info())
    return {"version": tf.__version__, "cuda": info.get("cuda_version"), "cudnn": info.get("cudnn_version")}


def _onnxruntime(ort) -> dict[str, Any]:
    return {"version": ort.__version__, "providers": ort.get_available_providers()}


def _tensorrt(trt) -> dict[str, Any]:
    return {"version": trt.__version__}


def frameworks() -> dict[str, dict[str, Any]]:
    readers = {"torch": _torch, "tensorflow": _tensorflow, "onnxruntime": _onnxruntime, "tensorrt": _tensorrt}
    out = {}
    for name, read in readers.items():
        found = _framework(name, read)
        if found is not None:
            out[name] = found
    return out


# ---------------------------------------------------------------- driver + GPUs


class _NvmlMemory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class _NvmlUtilization(ctypes.Structure):
    _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]


class Nvml:
    """A minimal NVML session through ctypes (also used by bench for power/energy)."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libnvidia-ml.so.1")
        _check(self.lib.nvmlInit_v2(), "nvmlInit_v2")

    def close(self) -> None:
        self.lib.nvmlShutdown()

    def __enter__(self) -> Nvml:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def driver(self) -> dict[str, str]:
        buf = ctypes.create_string_buffer(96)
        _check(self.lib.nvmlSystemGetDriverVersion(buf, 96), "nvmlSystemGetDriverVersion")
        cuda = ctypes.c_int()
        _check(
            self.lib.nvmlSystemGetCudaDriverVersion_v2(ctypes.byref(cuda)), "nvmlSystemGetCudaDriverVersion"
        )
        return {"version": buf.value.decode(), "cuda": f"{cuda.value // 1000}.{(cuda.value % 1000) // 10}"}

    def handle(self, index: int) -> ctypes.c_void_p:
        h = ctypes.c_void_p()
        _check(self.lib.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(h)), "nvmlDeviceGetHandleByIndex")
        return h

    def gpus(self) -> list[dict[str, Any]]:
        count = ctypes.c_uint()
        _check(self.lib.nvmlDeviceGetCount_v2(ctypes.byref(count)), "nvmlDeviceGetCount")
        out = []
        for i in range(count.value):
            h = self.handle(i)
            name, uuid = ctypes.create_string_buffer(96), ctypes.create_string_buffer(96)
            _check(self.lib.nvmlDeviceGetName(h, name, 96), "nvmlDeviceGetName")
            _check(self.lib.nvmlDeviceGetUUID(h, uuid, 96), "nvmlDeviceGetUUID")
            major, minor = ctypes.c_int(), ctypes.c_int()
            _check(
                self.lib.nvmlDeviceGetCudaComputeCapability(h, ctypes.byref(major), ctypes.byref(minor)),
                "nvmlDeviceGetCudaComputeCapability",
            )
            mem = _NvmlMemory()
            _check(self.lib.nvmlDeviceGetMemoryInfo(h, ctypes.byref(mem)), "nvmlDeviceGetMemoryInfo")
            out.append(
                {
                    "index": i,
                    "name": name.value.decode(),
                    "compute_capability": f"{major.value}.{minor.value}",
                    "memory_mib": mem.total // (1 << 20),
                    "uuid": uuid.value.decode(),
                }
            )
        return out

    def count(self) -> int:
        n = ctypes.c_uint()
        _check(self.lib.nvmlDeviceGetCount_v2(ctypes.byref(n)), "nvmlDeviceGetCount")
        return n.value

    def uuid(self, index: int) -> str:
        buf = ctypes.create_string_buffer(96)
        _check(self.lib.nvmlDeviceGetUUID(self.handle(index), buf, 96), "nvmlDeviceGetUUID")
        return buf.value.decode()

    def utilization(self, index: int = 0) -> float:
        """GPU busy fraction (0..1) over NVML's last sample period."""
        rates = _NvmlUtilization()
        _check(self.lib.nvmlDeviceGetUtilizationRates(self.handle(index), ctypes.byref(rates)),
               "nvmlDeviceGetUtilizationRates")
        return rates.gpu / 100.0

    def memory(self, index: int = 0) -> tuple[int, int]:
        """(used, total) bytes of device memory."""
        mem = _NvmlMemory()
        _check(self.lib.nvmlDeviceGetMemoryInfo(self.handle(index), ctypes.byref(mem)), "nvmlDeviceGetMemoryInfo")
        return mem.used, mem.total

    def power_mw(self, index: int = 0) -> int:
        mw = ctypes.c_uint()
        _check(
            self.lib.nvmlDeviceGetPowerUsage(self.handle(index), ctypes.byref(mw)), "nvmlDeviceGetPowerUsage"
        )
        return mw.value

    def energy_mj(self, index: int = 0) -> int:
        mj = ctypes.c_ulonglong()
        _check(
            self.lib.nvmlDeviceGetTotalEnergyConsumption(self.handle(index), ctypes.byref(mj)),
            "nvmlDeviceGetTotalEnergyConsumption",
        )
        return mj.value


def _cuda_driver() -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Fallback through libcuda.so.1 when NVML is absent: CUDA version + device attributes."""
    cuda = ctypes.CDLL("libcuda.so.1")
    _check(cuda.cuInit(0), "cuInit")
    v = ctypes.c_int()
    _check(cuda.cuDriverGetVersion(ctypes.byref(v)), "cuDriverGetVersion")
    n = ctypes.c_int()
    _check(cuda.cuDeviceGetCount(ctypes.byref(n)), "cuDeviceGetCount")
    gpus = []
    for i in range(n.value):
        dev = ctypes.c_int()
        _check(cuda.cuDeviceGet(ctypes.byref(dev), i), "cuDeviceGet")
        name = ctypes.create_string_buffer(96)
        cuda.cuDeviceGetName(name, 96, dev)
        major, minor, mem = ctypes.c_int(), ctypes.c_int(), ctypes.c_size_t()
        cuda.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # COMPUTE_CAPABILITY_MAJOR
        cuda.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # COMPUTE_CAPABILITY_MINOR
        cuda.cuDeviceTotalMem_v2(ctypes.byref(mem), dev)
        raw = (ctypes.c_ubyte * 16)()
        cuda.cuDeviceGetUuid(raw, dev)
        h = bytes(raw).hex()
        uuid = f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
        gpus.append(
            {
                "index": i,
                "name": name.value.decode(),
                "compute_capability": f"{major.value}.{minor.value}",
                "memory_mib": mem.value // (1 << 20),
                "uuid": uuid,
            }
        )
    return {"version": None, "cuda": f"{v.value // 1000}.{(v.value % 1000) // 10}"}, gpus


def driver_and_gpus() -> tuple[dict[str, Any] | None, list[dict[str, Any]], str | None]:
    """(driver, gpus, note): NVML first, libcuda second, (None, [], why) without a driver."""
    try:
        with Nvml() as nvml:
            return nvml.driver(), nvml.gpus(), None
    except (OSError, AttributeError) as nvml_exc:
        try:
            drv, gpus = _cuda_driver()
            return drv, gpus, f"NVML unavailable ({nvml_exc}); read through libcuda"
        except (OSError, AttributeError):
            return None, [], "no NVIDIA driver visible"


def gpus() -> list[dict[str, Any]]:
    return driver_and_gpus()[1]


def probe(extra_dirs: Iterable[str | Path] | None = None) -> dict[str, Any]:
    """The full report behind `ngcx-runtime info --json` (shape documented in info.py)."""
    from . import __version__
    from .backends import availability_report

    driver, gpu_list, note = driver_and_gpus()
    libs = libraries(extra_dirs)
    fws = frameworks()
    framework_copies(libs)
    report: dict[str, Any] = {
        "probe_version": PROBE_VERSION,
        "runtime_version": __version__,
        "python": platform.python_version(),
        "libraries": libs,
        "frameworks": fws,
        "driver": driver,
        "gpus": gpu_list,
        "backends": availability_report(),
    }
    if note:
        report["driver_note"] = note
    return report


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "--libraries-json":
    print(json.dumps(libraries_here(sys.argv[2:])))
