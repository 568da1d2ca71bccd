"""The PyTorch engine's pipelined path on a GPU: infer_async with batches in flight gives the
same outputs as the serial infer(), for full and padded buckets, and hands its slots back.

Runs where torch sees a GPU (the lent H100/H200 in this project); skipped with the reason elsewhere.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytestmark = pytest.mark.gpu


def _gpu() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def _conv_plan(tmp_path, side: int, buckets: list[int]):
    """A small conv net exported with a dynamic batch (up to 64), optimized to an FP16 plan with these buckets and
    loaded: (the engine, its input's name)."""
    import torch

    from ngcx_runtime import plan
    from ngcx_runtime.optimize import OptimizeOptions, optimize

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 5)).eval()
    ep = torch.export.export(net, (torch.randn(2, 3, side, side),),
                             dynamic_shapes=({0: torch.export.Dim("b", min=1, max=64)},))
    torch.export.save(ep, str(tmp_path / "m.pt2"))
    res = optimize(tmp_path / "m.pt2", tmp_path / "p", OptimizeOptions(precision="fp16", batch_profile=buckets))
    engine = plan.load(res.plan_dir)
    return engine, engine.inputs[0].name


@pytest.mark.skipif(not _gpu(), reason="needs torch with a CUDA GPU (no GPU here; runs on the lent GPU)")
def test_infer_async_matches_infer_with_two_batches_in_flight(tmp_path, monkeypatch):
    from ngcx_runtime.backends import pytorch as backend

    engine, name = _conv_plan(tmp_path, 16, [4, 16])
    monkeypatch.setattr(backend, "PIPELINE_MIN_BYTES", 0)  # pipeline even these small batches

    rng = np.random.default_rng(1)
    batches = [rng.standard_normal((n, 3, 16, 16)).astype(np.float16) for n in (16, 3, 16, 9, 4, 16)]
    want = [next(iter(engine.infer({name: x}).values())) for x in batches]
    pending, got = [], []
    for x in batches:
        pending.append(engine.infer_async({name: x}))
        if len(pending) == 2:  # two in flight, like the server's batcher
            got.append(next(iter(pending.pop(0)().values())))
    got += [next(iter(p().values())) for p in pending]
    for w, g, x in zip(want, got, batches, strict=True):
        assert g.shape[0] == x.shape[0]
        np.testing.assert_allclose(g.astype(np.float32), w.astype(np.float32), rtol=2e-2, atol=2e-2)
    assert engine._free_slots.qsize() == 2  # every slot handed back


@pytest.mark.skipif(not _gpu(), reason="needs torch with a CUDA GPU (no GPU here; runs on the lent GPU)")
def test_a_page_locked_full_bucket_goes_to_the_gpu_without_staging_and_gives_the_same_outputs(tmp_path):
    """What the system shared-memory path hands the engine at bs 256 (shm.py's read buffer, page-locked by
    CudaSharedMemory.pin_host once the engine has a context): the engine transfers it directly, and the
    outputs equal those of the same input from pageable memory (which goes through the staging buffer)."""
    import torch

    from ngcx_runtime import shm as server_shm
    from ngcx_runtime.backends import pytorch as backend
    from ngcx_runtime.cuda_shm import CudaSharedMemory

    engine, name = _conv_plan(tmp_path, 160, [4, 64])
    x = np.random.default_rng(2).standard_normal((64, 3, 160, 160)).astype(np.float16)   # 9.8 MB: pipelined
    assert x.nbytes >= backend.PIPELINE_MIN_BYTES and CudaSharedMemory().available()

    pinned = server_shm._buffer(0, max(x.nbytes, server_shm.PIN_MIN_BYTES), CudaSharedMemory().pin_host)
    assert torch.from_numpy(pinned).is_pinned(), "the read buffer was page-locked"
    view = pinned[:x.nbytes].view(np.float16).reshape(x.shape)
    view[...] = x

    def staged() -> set:                    # the pipelined slots' input staging buffers (plan.load's warm-up
        return {k for k in engine._staging if k[0] == "in" and k[1] != "sync"}   # uses the serial "sync" one)

    got = next(iter(engine.infer_async({name: view})().values()))
    assert not staged(), "the page-locked input went to the GPU without a staging buffer"
    want = next(iter(engine.infer_async({name: x.copy()})().values()))             # pageable: staged
    assert [k[3] for k in staged()] == [64], "the pageable input was staged"
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32), rtol=1e-3, atol=1e-3)
    assert engine._free_slots.qsize() == 2


@pytest.mark.skipif(not _gpu(), reason="needs torch with a CUDA GPU (no GPU here; runs on the lent GPU)")
def test_page_locking_stops_at_its_budget_and_gives_the_bytes_back_when_a_buffer_is_freed():
    """Page-locked memory cannot be swapped out: beyond the budget a read buffer stays pageable (and still
    works); freeing a pinned buffer unpins it and returns its bytes to the budget."""
    import gc

    import torch

    from ngcx_runtime.cuda_shm import CudaSharedMemory

    torch.zeros(1, device="cuda")                       # an engine's context on GPU 0, as serve has
    cuda = CudaSharedMemory()
    cuda.pin_budget = 3 << 20
    first, second = np.empty(2 << 20, np.uint8), np.empty(2 << 20, np.uint8)
    assert cuda.pin_host(first, first) and torch.from_numpy(first).is_pinned()
    assert not cuda.pin_host(second, second) and not torch.from_numpy(second).is_pinned()
    del first
    gc.collect()
    assert cuda._pinned == 0
    assert cuda.pin_host(second, second) and torch.from_numpy(second).is_pinned()
