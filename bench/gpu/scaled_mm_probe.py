"""What FP8 buys a ViT-B/16-sized GEMM on this GPU: torch._scaled_mm (e4m3, tensorwise and rowwise scales) against
FP16 mm, 8192x768 @ 768x3072, wall-clock mean of 100 calls after one. Its output on one H200:
bench/results/gpu/optimizer/scaled_mm_probe_h200.txt.

Usage: python3 bench/gpu/scaled_mm_probe.py   (needs torch and a GPU of sm >= 8.9; imports nothing from this repo)

(Reformatted for ruff after the run: the same calls, warm-ups and timing.)
"""

import time

import torch

M, K, N = 8192, 768, 3072
FLOP = 2 * M * K * N


def tflops(fn) -> float:
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    return FLOP / ((time.perf_counter() - t) / 100) / 1e12


def main() -> None:
    print(torch.__version__, torch.cuda.get_device_name(0), flush=True)
    a = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
    one = torch.tensor(1.0, device="cuda")
    rows, cols = torch.ones(M, 1, device="cuda"), torch.ones(1, N, device="cuda")
    for name, sa, sb, out in [("tensorwise fp16", one, one, torch.float16),
                              ("rowwise fp16", rows, cols, torch.float16),
                              ("rowwise bf16", rows, cols, torch.bfloat16)]:
        try:
            rate = tflops(lambda sa=sa, sb=sb, out=out: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb,
                                                                        out_dtype=out, use_fast_accum=True))
            print(name, "ok", f"{rate:.0f} TFLOPS", flush=True)
        except Exception as e:  # noqa: BLE001 - a mode this torch refuses is the answer, not a failure
            print(name, "FAILED", str(e)[:300], flush=True)
    x = torch.randn(M, K, device="cuda", dtype=torch.float16)
    wh = torch.randn(N, K, device="cuda", dtype=torch.float16)
    for _ in range(2):
        x @ wh.t()
    print("fp16 mm", f"{tflops(lambda: x @ wh.t()):.0f} TFLOPS", flush=True)


if __name__ == "__main__":
    main()
