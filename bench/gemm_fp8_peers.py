#!/usr/bin/env python3
"""Peer of bench_gemm_fp8 in the same job: torch._scaled_mm (cuBLASLt; CUTLASS for some rowwise
cases) on the rows of KILN.csv, same M, N, K, formats and granularity, bf16 out; prints the
BENCHMARKS.md report with the ratio Kiln / torch._scaled_mm per row and the geomean per granularity.

    python3 bench/gemm_fp8_peers.py KILN.csv [PEERS.csv]

Operands as torch._scaled_mm takes them: a [M, K] row-major, b = W.t() with W [N, K] row-major
(column-major [K, N]). Scales: tensorwise 0-d; rowwise a [M, 1], b [1, N]; blockwise (1x128
activation blocks, 128x128 weight blocks, as PyTorch's test_scaled_mm_vs_emulated_block_wise)
a [M, K/128] outer-dim-major and b [K/128, N/128]; block1x128 (wgrad) both 1x128, outer-dim-major.
A row torch refuses (a format or granularity cuBLASLt does not serve) is reported, not fatal.
Timing: triton.testing.do_bench (median; it evicts L2 before each repetition). FLOPs 2 M N K.
"""
import csv
import math
import sys

import torch
from triton.testing import do_bench

FMT = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def operand(rows, k, fmt):
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    return x.to(FMT[fmt])


def scales(gran, m, n, k):
    dev = "cuda"
    kb = (k + 127) // 128
    if gran == "tensorwise":
        return torch.tensor(1.0, device=dev), torch.tensor(1.0, device=dev)
    if gran == "rowwise":
        return torch.rand(m, 1, device=dev) + 0.5, torch.rand(1, n, device=dev) + 0.5
    sa = (torch.rand(m, kb, device=dev) + 0.5).t().contiguous().t()  # [M, K/128], outer-dim-major
    if gran == "blockwise":
        sb = (torch.rand((n + 127) // 128, kb, device=dev) + 0.5).t()  # [K/128, N/128]
    else:  # block1x128
        sb = (torch.rand(n, kb, device=dev) + 0.5).t().contiguous().t().t()  # [K/128, N], N-major
    return sa, sb


def time_scaled_mm(m, n, k, gran, a_fmt, b_fmt):
    a = operand(m, k, a_fmt)
    w = operand(n, k, b_fmt)
    sa, sb = scales(gran, m, n, k)
    fn = lambda: torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def main():
    path = sys.argv[1]
    rows = list(csv.DictReader(open(path)))
    out = csv.writer(open(sys.argv[2], "w")) if len(sys.argv) > 2 else None
    if out:
        out.writerow(["label", "granularity", "peer_TFLOPS", "kiln_TFLOPS", "ratio"])
    print(f"device: {torch.cuda.get_device_name()}, PyTorch {torch.__version__}")
    print(f"{'label':32} {'granularity':10} {'formats':10} {'Check':5} | {'Kiln':>7} {'_scaled_mm':>10} {'ratio':>6}  (TFLOP/s)")
    ratios = {}
    for r in rows:
        m, n, k = int(r["M"]), int(r["N"]), int(r["K"])
        gran = r["granularity"]
        a_fmt, b_fmt = r["formats"].split("x")
        flops = 2.0 * m * n * k
        kiln = float(r["TFLOPS"]) if r["Check"] == "PASS" else 0.0
        try:
            ms = time_scaled_mm(m, n, k, gran, a_fmt, b_fmt)
            peer = flops / ms / 1e9
        except Exception as e:  # a peer that fails is reported, not fatal
            msg = str(e).splitlines()[0][:90]
            print(f"{r['label']:32} {gran:10} {r['formats']:10} {r['Check']:5} | {kiln:7.1f} {'refused':>10}  {type(e).__name__}: {msg}")
            continue
        finally:
            torch.cuda.empty_cache()
        ratios.setdefault(gran if gran != "block1x128" else "blockwise", []).append(kiln / peer)
        print(f"{r['label']:32} {gran:10} {r['formats']:10} {r['Check']:5} | {kiln:7.1f} {peer:10.1f} {kiln / peer:6.3f}")
        if out:
            out.writerow([r["label"], gran, f"{peer:.1f}", f"{kiln:.1f}", f"{kiln / peer:.3f}"])
    for gran, rs in ratios.items():
        g = math.exp(sum(math.log(max(x, 1e-9)) for x in rs) / len(rs))
        low = sum(1 for x in rs if x < 0.9)
        print(f"geomean Kiln / torch._scaled_mm, {gran}: {g:.3f} over {len(rs)} rows (target >= 1.0); rows below 0.9x: {low}")


if __name__ == "__main__":
    main()
