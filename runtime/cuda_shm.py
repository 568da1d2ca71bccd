"""Triton's CUDA shared-memory extension: a client on this host hands the server GPU buffers.

The client allocates device memory, exports it with cudaIpcGetMemHandle and registers the 64-byte
handle (POST /v2/cudasharedmemory/region/NAME/register {"raw_handle": {"b64": ...}, "device_id",
"byte_size"}, or gRPC CudaSharedMemoryRegister); requests then name the region, offset and size
for inputs and outputs, exactly as for system shared memory (shm.py), and
tritonclient.utils.cuda_shared_memory works unchanged.

Why the CUDA driver API through ctypes: libcuda.so.1 is on every GPU host and in every container
the NVIDIA runtime starts, whatever framework (or none) the image has, so the extension needs no
cuda-python or torch. The server uses the device's primary context, the one the CUDA runtime
(PyTorch, ONNX Runtime, TensorRT) shares, so an opened region lives in the same context as the
engines.

Data path: inputs are copied device-to-host into the request's numpy array and outputs
host-to-device (cuMemcpyDtoH / HtoD), because engines take host arrays (engine.py). That keeps
every engine working; what it does not give is zero-copy GPU input, which would need engines that
take device pointers. Where no GPU or no driver is present, registering answers 400 with the
reason and the extension is not advertised.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import ctypes
import os
import threading
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from .protocol import ProtocolError

HANDLE_BYTES = 64                      # CU_IPC_HANDLE_SIZE
LAZY_ENABLE_PEER_ACCESS = 1            # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
PORTABLE = 1                           # CU_MEMHOSTREGISTER_PORTABLE
MAX_REGIONS = 1024


class _IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * HANDLE_BYTES)]


class CudaError(Exception):
    """A CUDA driver call failed (its name and the driver's error string)."""


class Driver:
    """The few driver calls the extension needs, on the primary context of each device."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self._contexts: dict[int, ctypes.c_void_p] = {}
        self._lock = threading.Lock()
        self._call("cuInit", ctypes.c_uint(0))

    @classmethod
    def load(cls) -> Driver:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise CudaError(f"the CUDA driver (libcuda.so.1) is not available: {exc}") from None
        return cls(lib)

    def _fn(self, name: str) -> Any:
        fn = getattr(self.lib, f"{name}_v2", None) if name in ("cuIpcOpenMemHandle", "cuMemcpyDtoH",
                                                                 "cuMemcpyHtoD", "cuMemHostRegister") else None
        return fn or getattr(self.lib, name)

    def _call(self, name: str, *args: Any) -> None:
        rc = self._fn(name)(*args)
        if rc != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(text))
            raise CudaError(f"{name} failed: {(text.value or b'error').decode(errors='replace')} ({rc})")

    def device_count(self) -> int:
        n = ctypes.c_int(0)
        self._call("cuDeviceGetCount", ctypes.byref(n))
        return n.value

    def use(self, device_id: int) -> None:
        """Make the device's primary context current on this thread (retained once per device). Once retained
        no lock is taken, so pin_host's finalizer may unpin from any thread at any time."""
        ctx = self._contexts.get(device_id)
        if ctx is None:
            with self._lock:
                ctx = self._contexts.get(device_id)
                if ctx is None:
                    dev = ctypes.c_int(0)
                    self._call("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(device_id))
                    ctx = ctypes.c_void_p()
                    self._call("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
                    self._contexts[device_id] = ctx
        self._call("cuCtxSetCurrent", ctx)

    def context_active(self, device_id: int) -> bool:
        """Whether an engine already made the device's primary context (no context is created here)."""
        dev, flags, active = ctypes.c_int(0), ctypes.c_uint(0), ctypes.c_int(0)
        self._call("cuDeviceGet", ctypes.byref(dev), ctypes.c_int(device_id))
        self._call("cuDevicePrimaryCtxGetState", dev, ctypes.byref(flags), ctypes.byref(active))
        return bool(active.value)

    def pin(self, ptr: int, size: int) -> None:
        """Page-lock host memory for every context (CU_MEMHOSTREGISTER_PORTABLE), as cudaHostRegister does."""
        self.use(0)
        self._call("cuMemHostRegister", ctypes.c_void_p(ptr), ctypes.c_size_t(size), ctypes.c_uint(PORTABLE))

    def unpin(self, ptr: int) -> None:
        self.use(0)
        self._call("cuMemHostUnregister", ctypes.c_void_p(ptr))

    def open(self, handle: bytes, device_id: int) -> int:
        self.use(device_id)
        ptr = ctypes.c_uint64(0)
        fn = self._fn("cuIpcOpenMemHandle")
        fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), _IpcHandle, ctypes.c_uint]
        raw = _IpcHandle()
        ctypes.memmove(ctypes.byref(raw), handle, HANDLE_BYTES)
        rc = fn(ctypes.byref(ptr), raw, LAZY_ENABLE_PEER_ACCESS)
        if rc != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(text))
            raise CudaError(f"cuIpcOpenMemHandle failed: {(text.value or b'error').decode(errors='replace')} "
                            f"({rc})")
        return ptr.value

    def close(self, ptr: int, device_id: int) -> None:
        self.use(device_id)
        self._call("cuIpcCloseMemHandle", ctypes.c_uint64(ptr))

    def to_host(self, dst: np.ndarray, src: int, device_id: int) -> None:
        self.use(device_id)
        self._call("cuMemcpyDtoH", ctypes.c_void_p(dst.ctypes.data), ctypes.c_uint64(src), ctypes.c_size_t(dst.nbytes))

    def to_device(self, dst: int, src: np.ndarray, device_id: int) -> None:
        self.use(device_id)
        self._call("cuMemcpyHtoD", ctypes.c_uint64(dst), ctypes.c_void_p(src.ctypes.data), ctypes.c_size_t(src.nbytes))


@dataclass
class Region:
    name: str
    device_id: int
    byte_size: int
    ptr: int
    users: int = 0
    closed: bool = False

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size}


def _brief(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def decode_handle(raw: Any) -> bytes:
    """The HTTP form {"b64": "..."} (tritonclient's get_raw_handle) as the handle's 64 bytes."""
    if not isinstance(raw, dict) or set(raw) != {"b64"} or not isinstance(raw["b64"], str):
        raise ProtocolError("'raw_handle' must be {\"b64\": \"<base64 of the cudaIpcMemHandle_t>\"}")
    try:
        return base64.b64decode(raw["b64"], validate=True)
    except (binascii.Error, ValueError):
        raise ProtocolError("'raw_handle.b64' is not valid base64") from None


def _pin_budget() -> int:
    """Bytes of read buffers that may be page-locked at once: a quarter of this host's memory, at most 8 GiB.
    Page-locked memory cannot be swapped out; many connections with large inputs fall back to pageable
    buffers beyond this instead of starving the host."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        total = 0
    return min(8 << 30, total // 4)


class CudaSharedMemory:
    """The registered CUDA regions of one server (opened lazily: no driver is touched until used)."""

    def __init__(self, enabled: bool = True, max_regions: int = MAX_REGIONS):
        self.enabled = enabled
        self.max_regions = max_regions
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()
        self._driver: Driver | None = None
        self._why: str | None = None if enabled else "shared memory is disabled on this server (--shared-memory off)"
        self._probed = not enabled
        self.pin_budget = _pin_budget()
        self._pinned = 0                               # bytes page-locked by pin_host now
        self._pin_lock = threading.RLock()             # re-entrant: a finalizer may run in a thread holding it

    def driver(self) -> Driver:
        """The driver, or a 400 naming why CUDA shared memory is not available here."""
        self.available()
        if self._driver is None:
            raise ProtocolError(f"CUDA shared memory is not available on this server: {self._why}; use system "
                                "shared memory (/v2/systemsharedmemory) or send tensors in the request")
        return self._driver

    def available(self) -> bool:
        """True when a driver and at least one GPU are present (probed once)."""
        with self._lock:
            if not self._probed:
                self._probed = True
                try:
                    driver = Driver.load()
                    if driver.device_count() < 1:
                        raise CudaError("the CUDA driver sees no GPU")
                    self._driver = driver
                except (CudaError, AttributeError) as exc:
                    self._why = str(exc)
        return self._driver is not None

    def pin_host(self, view: np.ndarray, owner: np.ndarray) -> bool:
        """Page-lock `view`'s memory until `owner` (the array that owns it) is freed; False where no engine
        has a context on GPU 0 (a CPU-only server creates none) or the driver refuses.

        Why: the system shared-memory path reads each input into a reused buffer (shm.py) that an engine
        then copies into its own page-locked staging buffer before the transfer to the GPU, one more pass
        over 77 MB at bs 256 than the in-process path makes (bench/results/gpu/targets/README.md). A
        buffer that is already page-locked lets the PyTorch engine transfer from it directly
        (backends/pytorch.py, _stage_slot)."""
        if not self.available() or self._driver is None:
            return False
        driver, ptr, size = self._driver, view.ctypes.data, view.nbytes
        with self._pin_lock:
            if self._pinned + size > self.pin_budget:
                return False
            self._pinned += size
        try:
            if not driver.context_active(0):
                raise CudaError("no engine has a context on GPU 0")
            driver.pin(ptr, size)
        except CudaError:
            with self._pin_lock:
                self._pinned -= size
            return False
        weakref.finalize(owner, self._unpin, driver, ptr, size).atexit = False   # runs before numpy frees it
        return True

    def _unpin(self, driver: Driver, ptr: int, size: int) -> None:
        with contextlib.suppress(CudaError):
            driver.unpin(ptr)
        with self._pin_lock:
            self._pinned -= size

    # -- the extension's endpoints --
    def register_json(self, name: str, doc: dict[str, Any]) -> None:
        """The HTTP register body {"raw_handle": {"b64": ...}, "device_id": N, "byte_size": N}."""
        self.driver()                                 # without a GPU, say so before judging the body
        unknown = sorted(str(k) for k in doc if k not in ("raw_handle", "device_id", "byte_size"))
        if unknown:
            raise ProtocolError(f"unknown register field(s) {', '.join(unknown)[:80]}; known: raw_handle, device_id, "
                                "byte_size")
        self.register(name, decode_handle(doc.get("raw_handle")), doc.get("device_id", 0), doc.get("byte_size"))

    def register(self, name: str, handle: bytes, device_id: int, byte_size: int) -> None:
        driver = self.driver()                        # without a GPU, say so before judging the request
        if not isinstance(name, str) or not 0 < len(name) <= 255 or not name.isprintable():
            raise ProtocolError(f"region name {_brief(name)} must be a plain printable name")
        if not isinstance(handle, bytes | bytearray) or len(handle) != HANDLE_BYTES:
            raise ProtocolError(f"raw_handle must be the {HANDLE_BYTES} bytes of a cudaIpcMemHandle_t "
                                f"(tritonclient.utils.cuda_shared_memory.get_raw_handle), got "
                                f"{len(handle) if isinstance(handle, bytes | bytearray) else _brief(handle)} bytes")
        for value, what, minimum in ((device_id, "device_id", 0), (byte_size, "byte_size", 1)):
            if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= 2**62:
                raise ProtocolError(f"'{what}' must be an integer of at least {minimum}, got {_brief(value)}")
        count = driver.device_count()
        if device_id >= count:
            raise ProtocolError(f"device_id {device_id}: this host has {count} GPU(s) (0..{count - 1})")
        with self._lock:
            if name in self._regions:
                raise ProtocolError(f"CUDA shared memory region '{name}' is already registered; unregister it first")
            if len(self._regions) >= self.max_regions:
                raise ProtocolError(f"{self.max_regions} CUDA shared memory regions are registered; unregister some")
            try:
                ptr = driver.open(bytes(handle), device_id)
            except CudaError as exc:
                raise ProtocolError(f"cannot open the CUDA IPC handle of region '{name}': {exc}; the handle must "
                                    "come from a live allocation of another process on this host") from None
            self._regions[name] = Region(name, device_id, byte_size, ptr)

    def unregister(self, name: str | None = None) -> None:
        with self._lock:
            if name is None:
                gone = list(self._regions.values())
                self._regions.clear()
            else:
                region = self._regions.pop(name, None)
                if region is None:
                    raise ProtocolError(f"no CUDA shared memory region '{_brief(name)[1:-1]}' is registered")
                gone = [region]
            for region in gone:
                region.closed = True
                if region.users == 0:
                    self._close(region)

    def _close(self, region: Region) -> None:
        if self._driver is not None:
            with contextlib.suppress(CudaError):     # the exporting process may be gone; nothing else to free
                self._driver.close(region.ptr, region.device_id)

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            if name is None:
                return [r.status() for r in self._regions.values()]
            region = self._regions.get(name)
        if region is None:
            raise ProtocolError(f"no CUDA shared memory region '{_brief(name)[1:-1]}' is registered", 404)
        return [region.status()]

    def has(self, name: Any) -> bool:
        return isinstance(name, str) and name in self._regions

    def close(self) -> None:
        if self._regions:
            self.unregister(None)

    # -- tensors --
    def _acquire(self, name: str, where: str) -> Region:
        with self._lock:
            region = self._regions.get(name)
            if region is None or region.closed:
                raise ProtocolError(f"{where}: no CUDA shared memory region '{_brief(name)[1:-1]}' is registered")
            region.users += 1
            return region

    def _release(self, region: Region) -> None:
        with self._lock:
            region.users -= 1
            last = region.closed and region.users == 0
        if last:
            self._close(region)

    @staticmethod
    def _span(region: Region, offset: int, size: int, where: str) -> int:
        if offset + size > region.byte_size:
            raise ProtocolError(f"{where}: bytes {offset}..{offset + size} of CUDA shared memory region "
                                f"'{region.name}' lie past its end ({region.byte_size} bytes registered)")
        return region.ptr + offset

    def read(self, name: str, offset: int, size: int, where: str) -> np.ndarray:
        region = self._acquire(name, where)
        try:
            src = self._span(region, offset, size, where)
            buf = np.empty(size, np.uint8)
            if size:
                self.driver().to_host(buf, src, region.device_id)
            return buf
        except CudaError as exc:
            raise ProtocolError(f"{where}: reading CUDA shared memory region '{region.name}' failed: {exc}") from None
        finally:
            self._release(region)

    def write(self, name: str, offset: int, byte_size: int, data: memoryview, where: str) -> None:
        if data.nbytes > byte_size:
            raise ProtocolError(f"{where} needs {data.nbytes} bytes but shared_memory_byte_size is {byte_size}")
        region = self._acquire(name, where)
        try:
            dst = self._span(region, offset, data.nbytes, where)
            if data.nbytes:
                self.driver().to_device(dst, np.frombuffer(data, np.uint8), region.device_id)
        except CudaError as exc:
            raise ProtocolError(f"{where}: writing CUDA shared memory region '{region.name}' failed: {exc}") from None
        finally:
            self._release(region)
