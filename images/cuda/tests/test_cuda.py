"""Runs inside the cuda image (ngcx test -> ngcx-runtime selftest). Plain functions, no pytest."""

import ctypes
import os

from ngcx_runtime.selftest import require_gpu


def test_libraries_resolve_by_soname():
    """Any process (not just python in the venv) finds the wheel-installed CUDA libs via ld.so.conf."""
    major = os.environ.get("NGCX_CUDA", "12").split(".")[0]
    for soname in (f"libcudart.so.{major}", f"libcublas.so.{major}", "libcudnn.so.9", "libnccl.so.2"):
        ctypes.CDLL(soname)


def test_cublas_handle_on_gpu():
    """With a GPU: create and destroy a cuBLAS handle (needs the driver and a device)."""
    require_gpu()
    major = os.environ.get("NGCX_CUDA", "12").split(".")[0]
    cublas = ctypes.CDLL(f"libcublas.so.{major}")
    handle = ctypes.c_void_p()
    assert cublas.cublasCreate_v2(ctypes.byref(handle)) == 0, "cublasCreate failed"
    assert cublas.cublasDestroy_v2(handle) == 0


def test_nccl_single_rank_communicator_on_gpu():
    """With a GPU: ncclCommInitAll over the visible devices (an all-reduce needs a communicator)."""
    n = require_gpu()
    nccl = ctypes.CDLL("libnccl.so.2")
    comms = (ctypes.c_void_p * n)()
    devs = (ctypes.c_int * n)(*range(n))
    assert nccl.ncclCommInitAll(comms, n, devs) == 0, "ncclCommInitAll failed"
    for c in comms:
        nccl.ncclCommDestroy(ctypes.c_void_p(c))
