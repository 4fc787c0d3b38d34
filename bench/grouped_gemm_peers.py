#!/usr/bin/env python3
"""Peer of bench_grouped_gemm in the same job: torch._grouped_mm (bf16, offsets on the device) on the
same cases and the same group sizes (KILN.csv.groups.json); prints the BENCHMARKS.md grouped-GEMM
report with the ratio Kiln / torch._grouped_mm per row and the geomean.

    python3 bench/grouped_gemm_peers.py KILN.csv

Rows LABEL_wgrad (bench_grouped_gemm --wgrad) are timed against torch._grouped_mm's k-grouped form,
torch._grouped_mm(dy.t(), x, offs) with dy [tokens, N] and x [tokens, K].

Timing: triton.testing.do_bench (median; it evicts L2 before each repetition). FLOPs 2 tokens N K.
"""
import csv
import json
import math
import sys

import torch
from triton.testing import do_bench


def time_grouped_mm(sizes, n, k):
    tokens = sum(sizes)
    a = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(len(sizes), n, k, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
    # y_g = x_g W_g^T: mat_b [G, K, N] as the transposed view of W [G, N, K] (K-major, as
    # _grouped_mm wants its second operand).
    fn = lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=300, return_mode="median")


def time_grouped_mm_wgrad(sizes, n, k):
    """dW[g] = dy_g^T x_g into [G, N, K]: the k-grouped form (offsets along the reduction) on dy and x
    as a training step holds them, [tokens, N] and [tokens, K] row-major."""
    tokens = sum(sizes)
    dy = torch.randn(tokens, n, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor(sizes, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
    fn = lambda: torch._grouped_mm(dy.t(), x, offs=offs)
    fn()
    torch.cuda.synchronize()
    return do_bench(fn, warmup=25, rep=300, return_mode="median")


def main():
    path = sys.argv[1]
    groups = json.load(open(path + ".groups.json"))
    rows = list(csv.DictReader(open(path)))
    print(f"device: {torch.cuda.get_device_name()}, PyTorch {torch.__version__}")
    print(f"{'label':42} {'Check':5} | {'Kiln':>7} {'_grouped_mm':>11} {'ratio':>6}  (TFLOP/s)")
    ratios = []
    for r in rows:
        n, k, tokens = int(r["N"]), int(r["K"]), int(r["tokens"])
        flops = 2.0 * tokens * n * k
        try:
            label = r["label"]
            if label.endswith("_wgrad"):  # bench_grouped_gemm --wgrad: the case's tn row
                ms = time_grouped_mm_wgrad(groups[label[: -len("_wgrad")]], n, k)
            else:
                ms = time_grouped_mm(groups[label], n, k)
            peer = flops / ms / 1e9
        except Exception as e:  # a peer that fails is reported, not fatal
            print(f"{r['label']:42} {r['Check']:5} | {float(r['TFLOPS']):7.1f} {'failed':>11}  {type(e).__name__}: {e}")
            continue
        kiln = float(r["TFLOPS"])
        ratios.append(kiln / peer)
        print(f"{r['label']:42} {r['Check']:5} | {kiln:7.1f} {peer:11.1f} {kiln / peer:6.3f}")
    if ratios:
        g = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        low = sum(1 for x in ratios if x < 0.9)
        print(f"geomean Kiln / torch._grouped_mm over {len(ratios)} rows: {g:.3f} (target >= 1.0); rows below 0.9x: {low}")


if __name__ == "__main__":
    main()
