# Write-only and copy rates on this GPU at embedding_bwd's dW sizes (bf16 and fp32 dW of 128256 x 4096).
import torch
from triton.testing import do_bench
for nbytes in (128256 * 4096 * 2, 128256 * 4096 * 4):
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    ms = do_bench(lambda: x.zero_(), warmup=10, rep=100, return_mode="median")
    y = torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda")
    z = torch.empty(nbytes // 4, dtype=torch.bfloat16, device="cuda")
    ms_c = do_bench(lambda: z.copy_(y), warmup=10, rep=100, return_mode="median")
    print(f"{nbytes/1e9:.3f} GB: zero_ {ms:.4f} ms ({nbytes/ms/1e6:.0f} GB/s); copy of the same bytes (half read, half written) {ms_c:.4f} ms ({nbytes/ms_c/1e6:.0f} GB/s)")
