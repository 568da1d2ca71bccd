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


def _gemm_on_gpu(a_bits, b_bits, dtype_code: int):
    """C(fp32) = A @ B on the GPU with cublasGemmEx, inputs as raw 16-bit words (fp16 or bf16).

    Row-major numpy vs column-major cuBLAS: computing B^T A^T in column-major is A @ B row-major.
    """
    import numpy as np

    major = os.environ.get("NGCX_CUDA", "12").split(".")[0]
    cudart = ctypes.CDLL(f"libcudart.so.{major}")
    cublas = ctypes.CDLL(f"libcublas.so.{major}")
    n = a_bits.shape[0]
    out = np.empty((n, n), np.float32)
    ptrs = [ctypes.c_void_p() for _ in range(3)]
    for p, size in zip(ptrs, (a_bits.nbytes, b_bits.nbytes, out.nbytes), strict=True):
        assert cudart.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(size)) == 0, "cudaMalloc failed"
    handle = ctypes.c_void_p()
    try:
        for p, host in zip(ptrs[:2], (a_bits, b_bits), strict=True):
            assert cudart.cudaMemcpy(p, host.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(host.nbytes), 1) == 0
        assert cublas.cublasCreate_v2(ctypes.byref(handle)) == 0, "cublasCreate failed"
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        status = cublas.cublasGemmEx(
            handle, 0, 0, n, n, n, ctypes.byref(alpha),
            ptrs[1], dtype_code, n, ptrs[0], dtype_code, n, ctypes.byref(beta),
            ptrs[2], 0, n,  # CUDA_R_32F output
            68, -1)  # CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT (tensor cores where the types allow)
        assert status == 0, f"cublasGemmEx failed with status {status}"
        assert cudart.cudaDeviceSynchronize() == 0
        assert cudart.cudaMemcpy(out.ctypes.data_as(ctypes.c_void_p), ptrs[2], ctypes.c_size_t(out.nbytes), 2) == 0
    finally:
        if handle.value:
            cublas.cublasDestroy_v2(handle)
        for p in ptrs:
            if p.value:
                cudart.cudaFree(p)
    return out


def test_fp16_and_bf16_gemm_on_gpu():
    """With a GPU: half and bfloat16 GEMMs through cuBLAS (tensor-core types) match numpy."""
    require_gpu()
    import numpy as np

    rng = np.random.default_rng(0)
    a32, b32 = (rng.normal(size=(256, 256)).astype(np.float32) for _ in range(2))
    a16, b16 = a32.astype(np.float16), b32.astype(np.float16)
    got = _gemm_on_gpu(a16.view(np.uint16), b16.view(np.uint16), 2)  # CUDA_R_16F
    ref = a16.astype(np.float32) @ b16.astype(np.float32)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-3, "fp16 GEMM result is wrong"
    abf, bbf = ((x.view(np.uint32) >> 16).astype(np.uint16) for x in (a32, b32))  # truncate to bf16
    got = _gemm_on_gpu(abf, bbf, 14)  # CUDA_R_16BF
    ref = ((abf.astype(np.uint32) << 16).view(np.float32)) @ ((bbf.astype(np.uint32) << 16).view(np.float32))
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-3, "bf16 GEMM result is wrong"
