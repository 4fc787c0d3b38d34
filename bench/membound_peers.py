#!/usr/bin/env python3
"""Peers of bench_membound in the same job: PyTorch eager, torch.compile and the device-to-device
copy on the same shapes and byte counts; prints the BENCHMARKS.md memory-bound report with ratios.

    python3 bench/membound_peers.py KILN.csv OUT_DIR

Bytes per case are Kiln's (every input read once, every output written once), so the ratios are
ratios of times. Timing: triton.testing.do_bench (median).

Cases in BACKWARD_ALONE (rmsnorm_bwd_dres) are timed as BENCHMARKS.md asks of a backward op's peer:
the forward is run once (eager, or compiled with torch.compile so that AOTAutograd compiles its
backward graph) and only the backward, torch.autograd.grad(..., retain_graph=True), is timed.
"""
import csv
import math
import os
import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

torch.backends.cuda.matmul.allow_tf32 = False
dev = "cuda"
bf16 = torch.bfloat16


def rms_fwd(x, g):
    return F.rms_norm(x, (x.shape[-1],), g, 1e-5)


def rms_res_fwd(x, r, g):
    h = x + r
    # rstd is what the Kiln op also writes; torch.compile fuses it
    hf = h.float()
    rstd = torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + 1e-5)
    return (hf * rstd).to(bf16) * g, h, rstd


def rms_bwd(x, g, dy):
    x = x.detach().requires_grad_(True)
    g = g.detach().requires_grad_(True)
    y = F.rms_norm(x, (x.shape[-1],), g, 1e-5)
    return torch.autograd.grad(y, (x, g), dy)


def rms_dres_fwd(x, g, c):
    # The residual connection around a pre-norm block, h = x + f(rmsnorm(x)), cut at the norm: y
    # goes on into f (its gradient dy), h = x + c carries the residual stream (its gradient dres).
    # x's gradient is then rmsnorm's dx + dres: eager runs rmsnorm backward and an add;
    # torch.compile's backward graph fuses the add into its rmsnorm backward.
    return F.rms_norm(x, (x.shape[-1],), g, 1e-5), x + c


# label -> forward, its inputs (the first `leaves` are the leaves whose gradients are asked for),
# and the gradients of its outputs.
def backward_alone(label, rows, cols):
    t = lambda *s: torch.randn(*s, device=dev, dtype=bf16)
    if label == "rmsnorm_bwd_dres":
        x, g = t(rows, cols).requires_grad_(True), t(cols).requires_grad_(True)
        return rms_dres_fwd, (x, g, t(rows, cols)), 2, (t(rows, cols), t(rows, cols))
    return None


def time_backward(fwd, args, leaves, grads, compiled):
    if compiled:
        torch._functorch.config.donated_buffer = False  # the backward graph runs repeatedly
        fwd = torch.compile(fwd, dynamic=False)
    outs = fwd(*args)
    run = lambda: torch.autograd.grad(outs, args[:leaves], grads, retain_graph=True)
    run()
    return do_bench(run, warmup=10, rep=100)


def swiglu_fwd(x):
    g, u = x.chunk(2, dim=-1)
    return F.silu(g) * u


def swiglu_bwd(x, dy):
    x = x.detach().requires_grad_(True)
    g, u = x.chunk(2, dim=-1)
    y = F.silu(g) * u
    return torch.autograd.grad(y, (x,), dy)


E4M3_MAX = 448.0


def q_tensorwise(x):
    amax = x.abs().amax().float()
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def q_rowwise(x):
    amax = x.abs().amax(dim=1, keepdim=True).float()
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return (x.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn), scale


def q_block1x128(x):
    r, c = x.shape
    xb = x.view(r, c // 128, 128).float()
    amax = xb.abs().amax(dim=2, keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return (xb / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(r, c), scale


def q_block128x128(x):
    r, c = x.shape
    xb = x.view(r // 128, 128, c // 128, 128).float()
    amax = xb.abs().amax(dim=(1, 3), keepdim=True)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    return (xb / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(r, c), scale


def inputs(label, rows, cols):
    t = lambda *s: torch.randn(*s, device=dev, dtype=bf16)
    if label == "rmsnorm":
        return rms_fwd, (t(rows, cols), t(cols))
    if label == "rmsnorm_residual":
        return rms_res_fwd, (t(rows, cols), t(rows, cols), t(cols))
    if label == "rmsnorm_bwd":
        return rms_bwd, (t(rows, cols), t(cols), t(rows, cols))
    if label == "swiglu":
        return swiglu_fwd, (t(rows, 2 * cols),)
    if label == "swiglu_bwd":
        return swiglu_bwd, (t(rows, 2 * cols), t(rows, cols))
    if label.startswith("quantize_fp8_"):
        fn = {"tensorwise": q_tensorwise, "rowwise": q_rowwise, "block1x128": q_block1x128,
              "block128x128": q_block128x128}[label[len("quantize_fp8_"):]]
        return fn, (t(rows, cols),)
    raise ValueError(label)


def main():
    kiln_csv, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    rows = list(csv.DictReader(open(kiln_csv)))
    # Device-to-device copy bandwidth, bytes read + written.
    src = torch.empty(2 * 1024**3 // 2, device=dev, dtype=bf16)
    dst = torch.empty_like(src)
    copy_ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200)
    copy_gbs = 2 * src.numel() * 2 / (copy_ms * 1e6)
    del src, dst
    out = []
    for r in rows:
        label, n, c, nbytes = r["label"], int(r["rows"]), int(r["cols"]), float(r["bytes"])
        bwd = backward_alone(label, n, c)
        if bwd is not None:
            fwd, args, leaves, grads = bwd
            eager_ms = time_backward(fwd, args, leaves, grads, compiled=False)
            comp_ms = time_backward(fwd, args, leaves, grads, compiled=True)
        else:
            fn, args = inputs(label, n, c)
            eager_ms = do_bench(lambda: fn(*args), warmup=10, rep=100)
            compiled = torch.compile(fn, dynamic=False)
            compiled(*args)
            comp_ms = do_bench(lambda: compiled(*args), warmup=10, rep=100)
        kiln_gbs = float(r["GB/s"])
        eager_gbs, comp_gbs = nbytes / (eager_ms * 1e6), nbytes / (comp_ms * 1e6)
        out.append(dict(label=f"{label} [{n}x{c}]", Check=r["Check"], **{"GB/s": kiln_gbs, "GB/s_stddev": float(r["GB/s_stddev"]),
                        "Time (ms)": float(r["Time (ms)"]), "eager GB/s": eager_gbs, "compile GB/s": comp_gbs,
                        "kiln/eager": kiln_gbs / eager_gbs, "kiln/compile": kiln_gbs / comp_gbs,
                        "kiln/copy": kiln_gbs / copy_gbs}))
        torch.cuda.empty_cache()
    keys = list(out[0].keys())
    with open(os.path.join(out_dir, "membound_report.csv"), "w") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(out)
    print(f"device: {torch.cuda.get_device_name()}, copy {copy_gbs:.0f} GB/s (device-to-device, read + write)")
    print(f"{'label':<32} {'Check':5} {'GB/s':>7} {'sd':>6} {'ms':>8} {'eager':>7} {'compile':>7} {'/eager':>7} {'/compile':>8} {'/copy':>6}")
    for o in out:
        print(f"{o['label']:<32} {o['Check']:5} {o['GB/s']:7.0f} {o['GB/s_stddev']:6.0f} {o['Time (ms)']:8.4f} {o['eager GB/s']:7.0f} "
              f"{o['compile GB/s']:7.0f} {o['kiln/eager']:7.2f} {o['kiln/compile']:8.2f} {o['kiln/copy']:6.2f}")
    geo = lambda k: math.exp(sum(math.log(max(o[k], 1e-9)) for o in out) / len(out))
    print(f"geomean kiln/compile {geo('kiln/compile'):.3f}, kiln/eager {geo('kiln/eager'):.3f}, kiln/copy {geo('kiln/copy'):.3f}; "
          f"lowest kiln/compile {min(o['kiln/compile'] for o in out):.3f}")


if __name__ == "__main__":
    main()
