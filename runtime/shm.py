"""Triton's system shared-memory extension: clients on this host pass tensors through /dev/shm.

Why: a batch of 256 FP16 images is 77 MB; through an HTTP body it is sent, received, framed and
parsed, which costs more than computing it (issue 12, item 4). With shared memory the client
writes the tensor into a POSIX shared-memory object, registers it once (POST
/v2/systemsharedmemory/region/NAME/register {"key", "offset", "byte_size"}), and each request
names the region, offset and size instead of carrying bytes; outputs can be written back the
same way. tritonclient.utils.shared_memory works unchanged.

Why pread/pwrite on a kept file descriptor, not mmap: the object belongs to the client, who can
shrink it (ftruncate) at any time; touching an mmap past the new end kills the whole server with
SIGBUS, which Python cannot catch. pread returns short instead, and that becomes a 400 for that
request. The cost is one copy from the page cache per input, the copy an HTTP body needs anyway.

Who may use it (--shared-memory): `local` (default) accepts registration and shared-memory
tensors only from loopback peers, since a region is any object in /dev/shm the server can open;
`any` trusts every peer (a container reached through a bridge, with /dev/shm shared on purpose);
`off` disables the extension. The rule itself is access.py's (check_shared_memory), asked by
every transport for these routes and by PeerView for every region a tensor names.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .access import SHARED_MEMORY_POLICIES as POLICIES
from .protocol import ProtocolError

SHM_DIR = Path("/dev/shm")
MAX_REGIONS = 1024
PIN_MIN_BYTES = 8 << 20    # where the PyTorch engine starts pipelining (backends/pytorch.py PIPELINE_MIN_BYTES)
PAGE = os.sysconf("SC_PAGE_SIZE")


def _int(value: Any, what: str, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum or value > 2**62:
        raise ProtocolError(f"{what} must be an integer of at least {minimum}, got {_brief(value)}")
    return value


def _brief(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _plain(name: str) -> bool:
    return (0 < len(name) <= 255 and name not in (".", "..") and name.isprintable()
            and not any(c in name for c in "/\\\0"))


@dataclass
class Region:
    """One registered region: bytes offset..offset+byte_size of a shared-memory object.

    The descriptor is closed only when no request uses it any more (refcount), so an unregister
    racing a request can never let the number be reused for another file under that request.
    """

    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    users: int = 0
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}

    def acquire(self) -> None:
        with self.lock:
            if self.closed:
                raise ProtocolError(f"shared memory region '{self.name}' was unregistered")
            self.users += 1

    def release(self) -> None:
        with self.lock:
            self.users -= 1
            last = self.closed and self.users == 0
        if last:
            os.close(self.fd)

    def close(self) -> None:
        with self.lock:
            if self.closed:
                return
            self.closed = True
            idle = self.users == 0
        if idle:
            os.close(self.fd)

    def span(self, offset: int, size: int, where: str) -> int:
        """The object offset of bytes offset..offset+size of this region (checked against its size)."""
        if offset + size > self.byte_size:
            raise ProtocolError(f"{where}: bytes {offset}..{offset + size} of shared memory region '{self.name}' "
                                f"lie past its end ({self.byte_size} bytes registered)")
        return self.offset + offset


class SharedMemory:
    """The registered regions of one server."""

    def __init__(self, policy: str = "local", root: Path = SHM_DIR, max_regions: int = MAX_REGIONS):
        if policy not in POLICIES:
            raise ValueError(f"shared memory policy {policy!r}: choose one of {', '.join(POLICIES)}")
        self.policy = policy
        self.root = Path(root)
        self.max_regions = max_regions
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.policy != "off"

    # -- the extension's endpoints --
    def register(self, name: str, doc: dict[str, Any]) -> None:
        if not _plain(name):
            raise ProtocolError(f"region name {_brief(name)} must be a plain name (no '/')")
        unknown = sorted(str(k) for k in doc if k not in ("key", "offset", "byte_size"))
        if unknown:
            raise ProtocolError(f"unknown register field(s) {', '.join(unknown)[:80]}; known: key, offset, byte_size")
        key = doc.get("key")
        if not isinstance(key, str) or not _plain(key[1:] if key.startswith("/") else key):
            raise ProtocolError(f"'key' must name a shared-memory object such as \"/input0\" (one name, as given "
                                f"to shm_open), got {_brief(key)}")
        offset = _int(doc.get("offset", 0), "'offset'")
        byte_size = _int(doc.get("byte_size"), "'byte_size'", minimum=1)
        with self._lock:
            if name in self._regions:
                raise ProtocolError(f"shared memory region '{name}' is already registered; unregister it first")
            if len(self._regions) >= self.max_regions:
                raise ProtocolError(f"{self.max_regions} shared memory regions are registered; unregister some")
            fd = self._open(key, offset, byte_size)
            self._regions[name] = Region(name, key, offset, byte_size, fd)

    def _open(self, key: str, offset: int, byte_size: int) -> int:
        path = self.root / key.lstrip("/")
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ProtocolError(f"no shared memory object {_brief(key)} on this host; create it first "
                                "(tritonclient.utils.shared_memory.create_shared_memory_region)") from None
        except OSError as exc:
            raise ProtocolError(f"cannot open shared memory object {_brief(key)}: {exc.strerror or exc}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ProtocolError(f"{_brief(key)} is not a shared memory object")
            if offset + byte_size > st.st_size:
                raise ProtocolError(f"the region needs bytes {offset}..{offset + byte_size} of {_brief(key)}, "
                                    f"which has only {st.st_size} bytes")
        except BaseException:
            os.close(fd)
            raise
        return fd

    def unregister(self, name: str | None = None) -> None:
        """One region, or every region (name None). An unknown name is a 400."""
        with self._lock:
            if name is None:
                gone = list(self._regions.values())
                self._regions.clear()
            else:
                region = self._regions.pop(name, None)
                if region is None:
                    raise ProtocolError(f"no shared memory region '{_brief(name)[1:-1]}' is registered")
                gone = [region]
        for region in gone:
            region.close()

    def status(self, name: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            if name is None:
                return [r.status() for r in self._regions.values()]
            region = self._regions.get(name)
        if region is None:
            raise ProtocolError(f"no shared memory region '{_brief(name)[1:-1]}' is registered", 404)
        return [region.status()]

    def close(self) -> None:
        self.unregister(None)

    def has(self, name: Any) -> bool:
        return isinstance(name, str) and name in self._regions

    # -- tensors --
    def _region(self, name: Any, where: str) -> Region:
        if not isinstance(name, str):
            raise ProtocolError(f"{where}: shared_memory_region must be a string")
        with self._lock:
            region = self._regions.get(name)
        if region is None:
            raise ProtocolError(f"{where}: no shared memory region '{_brief(name)[1:-1]}' is registered; "
                                "register it with POST /v2/systemsharedmemory/region/NAME/register")
        return region

    def read(self, name: Any, offset: int, size: int, where: str, out: np.ndarray | None = None) -> np.ndarray:
        """size bytes of a region, copied out with pread (a shrunken object is a 400, never SIGBUS), into
        `out` (a reused uint8 buffer of at least size bytes) when given."""
        region = self._region(name, where)
        at = region.span(offset, size, where)
        buf = np.empty(size, np.uint8) if out is None else out[:size]
        region.acquire()
        try:
            got = os.preadv(region.fd, [buf], at) if size else 0
        except OSError as exc:
            raise ProtocolError(f"{where}: reading shared memory region '{region.name}' failed: "
                                f"{exc.strerror or exc}") from None
        finally:
            region.release()
        if got != size:
            raise ProtocolError(f"{where}: shared memory object {_brief(region.key)} ends before bytes "
                                f"{offset}..{offset + size} of region '{region.name}' (it shrank after registering)")
        return buf

    def write(self, name: Any, offset: int, byte_size: int, data: memoryview, where: str) -> None:
        """An output into a region: it must fit the size the request gave and the registered region."""
        region = self._region(name, where)
        if data.nbytes > byte_size:
            raise ProtocolError(f"{where} needs {data.nbytes} bytes but shared_memory_byte_size is {byte_size}")
        at = region.span(offset, data.nbytes, where)
        region.acquire()
        try:
            done = 0
            while done < data.nbytes:
                done += os.pwrite(region.fd, data[done:], at + done)
        except OSError as exc:
            raise ProtocolError(f"{where}: writing shared memory region '{region.name}' failed: "
                                f"{exc.strerror or exc}") from None
        finally:
            region.release()


_BUFFERS = threading.local()      # per serving thread: the input buffers of its current request


def _buffer(slot: int, size: int, pin: Callable[[np.ndarray, np.ndarray], bool] | None = None) -> np.ndarray:
    """The thread's reusable read buffer number `slot`, at least size bytes.

    Why: a fresh 77 MB array page-faults on every request (measured: pread into a fresh array 40 ms,
    into a reused one 22 ms). A thread serves one request at a time and the batcher is done with
    the inputs (merged or staged into the engine) before the request's answer is sent, so the
    thread's next request may reuse them. Like the HTTP body buffer, it lives as long as the
    connection's thread and holds the largest input seen. A buffer of PIN_MIN_BYTES or more is
    handed to `pin` (CudaSharedMemory.pin_host: page-locked where an engine uses the GPU), page-aligned
    as the driver wants it."""
    pool = getattr(_BUFFERS, "pool", None)
    if pool is None:
        pool = _BUFFERS.pool = []
    while len(pool) <= slot:
        pool.append(np.empty(0, np.uint8))
    if pool[slot].nbytes < size:
        pool[slot] = _page_aligned(size, pin) if pin is not None and size >= PIN_MIN_BYTES else np.empty(size, np.uint8)
    return pool[slot]


def _page_aligned(size: int, pin: Callable[[np.ndarray, np.ndarray], bool]) -> np.ndarray:
    """size bytes starting on a page boundary, handed to `pin` with the array that owns them."""
    owner = np.empty(size + PAGE, np.uint8)
    start = -owner.ctypes.data % PAGE
    view = owner[start:start + size]
    pin(view, owner)
    return view


class PeerView:
    """The registries as one request's peer may use them: every access asks the policy first (allow,
    access.Policy.check for a shared-memory call from this request's peer).

    A region name is looked up among the system regions, then the CUDA ones (cuda_shm.py): Triton
    uses the same shared_memory_region parameter for both kinds. One view per request: its system
    shared-memory inputs are read into the serving thread's reused buffers (_buffer).
    """

    def __init__(self, shm: SharedMemory, allow: Callable[[], None], cuda: Any = None):
        self.shm = shm
        self.allow = allow
        self.cuda = cuda
        self._slot = 0

    def _kind(self, name: Any) -> Any:
        if self.cuda is not None and not self.shm.has(name) and self.cuda.has(name):
            return self.cuda
        return self.shm

    def read(self, name: Any, offset: int, size: int, where: str) -> np.ndarray:
        self.allow()
        kind = self._kind(name)
        if kind is not self.shm:
            return kind.read(name, offset, size, where)
        self._slot += 1
        pin = self.cuda.pin_host if self.cuda is not None else None
        return self.shm.read(name, offset, size, where, out=_buffer(self._slot - 1, size, pin))

    def write(self, name: Any, offset: int, byte_size: int, data: memoryview, where: str) -> None:
        self.allow()
        self._kind(name).write(name, offset, byte_size, data, where)
