# torch.bmm / matmul at nanoGPT's attention shapes (48 heads, T 64, D 32), best of 200, per thread count.
import time, torch
shapes = [("scores q k^T", (48, 64, 32), (48, 32, 64)), ("y = att v", (48, 64, 64), (48, 64, 32))]
for threads in (1, 2):
    torch.set_num_threads(threads)
    for name, sa, sb in shapes:
        a, b = torch.randn(*sa), torch.randn(*sb)
        if name.startswith("scores"):
            a, b = torch.randn(48, 64, 32), torch.randn(48, 64, 32).transpose(1, 2)
        out = torch.empty(48, 64, sb[-1] if not name.startswith("scores") else 64)
        for _ in range(20): torch.bmm(a, b, out=out)
        best = 1e9
        for _ in range(200):
            t0 = time.perf_counter(); torch.bmm(a, b, out=out); best = min(best, time.perf_counter() - t0)
        print(f"threads {threads} {name:14s} {best*1e3:.4f} ms  {2*48*64*64*32/best/1e9:.1f} GFLOP/s")
