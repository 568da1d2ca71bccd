import torch, time
print(torch.__version__, torch.cuda.get_device_name(0), flush=True)
a = torch.randn(8192, 768, device="cuda").to(torch.float8_e4m3fn)
w = torch.randn(3072, 768, device="cuda").to(torch.float8_e4m3fn)
for name, sa, sb, out in [("tensorwise fp16", torch.tensor(1.0, device="cuda"), torch.tensor(1.0, device="cuda"), torch.float16),
                          ("rowwise fp16", torch.ones(8192, 1, device="cuda"), torch.ones(1, 3072, device="cuda"), torch.float16),
                          ("rowwise bf16", torch.ones(8192, 1, device="cuda"), torch.ones(1, 3072, device="cuda"), torch.bfloat16)]:
    try:
        y = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=out, use_fast_accum=True)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(100): torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=out, use_fast_accum=True)
        torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 100
        print(name, "ok", f"{2*8192*768*3072/dt/1e12:.0f} TFLOPS", flush=True)
    except Exception as e:
        print(name, "FAILED", str(e)[:300], flush=True)
x = torch.randn(8192, 768, device="cuda", dtype=torch.float16); W = torch.randn(3072, 768, device="cuda", dtype=torch.float16)
for _ in range(3): x @ W.t()
torch.cuda.synchronize(); t = time.perf_counter()
for _ in range(100): x @ W.t()
torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 100
print("fp16 mm", f"{2*8192*768*3072/dt/1e12:.0f} TFLOPS", flush=True)
