# torch.compile's F.rms_norm (the bench_membound peer) at [8192, H] bf16: its kernel source and time.
import torch, torch.nn.functional as F
from triton.testing import do_bench
def rms(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, 1e-5)
for h in (4096, 16384):
    torch._dynamo.reset()
    f = torch.compile(rms, dynamic=False)
    x = torch.randn(8192, h, device="cuda", dtype=torch.bfloat16); w = torch.randn(h, device="cuda", dtype=torch.bfloat16)
    f(x, w); torch.cuda.synchronize()
    ms = do_bench(lambda: f(x, w), warmup=25, rep=200, return_mode="median")
    print(f"PEER hidden {h}: torch.compile F.rms_norm {ms:.4f} ms, {2*x.numel()*2/ms/1e6:.0f} GB/s", flush=True)
