# torch.compile's rmsnorm at [8192, 16384] bf16: its generated kernel (the launch configuration) and time.
import os, glob, torch
from triton.testing import do_bench
def rms(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * w.float()).to(x.dtype)
f = torch.compile(rms)
for h in (8192, 16384):
    x = torch.randn(8192, h, device="cuda", dtype=torch.bfloat16); w = torch.randn(h, device="cuda", dtype=torch.bfloat16)
    f(x, w); torch.cuda.synchronize()
    ms = do_bench(lambda: f(x, w), warmup=25, rep=200, return_mode="median")
    print(f"hidden {h}: torch.compile {ms:.4f} ms, {2*x.numel()*2/ms/1e6:.0f} GB/s")
