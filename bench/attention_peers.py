#!/usr/bin/env python3
"""Peers of bench_attention in the same job: PyTorch's scaled_dot_product_attention with the cuDNN
backend and with the flash backend (FlashAttention-2), bf16, on every case of Kiln's CSV; prints one
table with Kiln, cuDNN, FA2 and the ratio of Kiln to the faster peer per row, the geomean per
direction, and the varlen line.

    python3 bench/attention_peers.py KILN.csv OUT_DIR      # writes OUT_DIR/attention_report.csv

Layout [B, H, S, D] contiguous; GQA through enable_gqa=True. Forward: the training forward (inputs
with requires_grad, so the backend also saves its log-sum-exp, as Kiln's forward writes lse).
Backward: timed alone, the gradient of a saved graph: torch.autograd.grad(out, (q, k, v), dout,
retain_graph=True). triton.testing.do_bench medians (it evicts L2 before each repetition), with
rep=500 ms so that the largest cases (~100 ms a call) still get several repetitions.
FLOPs as BENCHMARKS.md and bench_attention count them: forward 4 B Hq S^2 D, halved when causal
(varlen: summed over the sequences), backward 2.5x the forward.

A backend that cannot run a case (no kernel for the shape, out of memory, ...) is reported as n/a
with its reason, and the ratio of that row uses the other peer. A Kiln FAIL row counts as zero in
the geomeans (BENCHMARKS.md); rows whose Check is "-" were not checked by bench_attention (the
same kernel as the checked first case of their shape). The geomeans and the 0.9x floor cover the
models.json rows; the varlen rows are compared with the dense rate of the longest sequence's shape
(Kiln's own, from the CSV: target >= 0.9x) and, where this PyTorch has it, with
torch.nn.attention.varlen.varlen_attn (FlashAttention-2, varlen).
"""
import csv
import datetime
import inspect
import json
import math
import os
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

dev = "cuda"
bf16 = torch.bfloat16
PEERS = [("cuDNN", SDPBackend.CUDNN_ATTENTION), ("FA2", SDPBackend.FLASH_ATTENTION)]


def forward_flops(batch, seq, hq, d, causal, lens=None):
    lens = lens if lens is not None else [seq] * batch
    f = sum(4.0 * hq * L * L * d for L in lens)
    return f / 2 if causal else f


def short_reason(exc, caught):
    """The error's first line, and the backend's own reason from the warnings SDPA emits."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    why = [str(w.message).strip().splitlines()[0] for w in caught if "not" in str(w.message)]
    return (msg + (": " + why[0] if why else ""))[:200]


def bench_pair(fwd, make_bwd):
    fwd_ms = do_bench(fwd, warmup=25, rep=500, return_mode="median")
    bwd = make_bwd()
    bwd_ms = do_bench(bwd, warmup=25, rep=500, return_mode="median")
    return fwd_ms, bwd_ms


def time_dense(backend, batch, seq, hq, hkv, d, causal):
    """(forward ms, backward ms) of F.scaled_dot_product_attention restricted to `backend`."""
    q = torch.randn(batch, hq, seq, d, device=dev, dtype=bf16, requires_grad=True)
    k = torch.randn(batch, hkv, seq, d, device=dev, dtype=bf16, requires_grad=True)
    v = torch.randn(batch, hkv, seq, d, device=dev, dtype=bf16, requires_grad=True)
    kw = dict(is_causal=causal, enable_gqa=hq != hkv)
    with sdpa_kernel([backend]):
        f = lambda: F.scaled_dot_product_attention(q, k, v, **kw)

        def make_bwd():
            out = f()
            dout = torch.randn_like(out)
            return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

        return bench_pair(f, make_bwd)


def time_varlen(lens, hq, hkv, d, causal):
    """(forward ms, backward ms, note) of torch.nn.attention.varlen.varlen_attn on the packed batch."""
    from torch.nn.attention.varlen import varlen_attn  # PyTorch 2.10+

    params = inspect.signature(varlen_attn).parameters
    total, longest = sum(lens), max(lens)
    cu = [0]
    for L in lens:
        cu.append(cu[-1] + L)
    cu = torch.tensor(cu, device=dev, dtype=torch.int32)
    kw, note = {}, ""
    if "is_causal" in params:
        kw["is_causal"] = causal
    elif "window_size" in params:
        kw["window_size"] = (-1, 0) if causal else (-1, -1)
    elif causal:
        raise RuntimeError("this varlen_attn has no causal option")
    q = torch.randn(total, hq, d, device=dev, dtype=bf16)
    k = torch.randn(total, hkv, d, device=dev, dtype=bf16)
    v = torch.randn(total, hkv, d, device=dev, dtype=bf16)
    if hq != hkv:
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        else:  # same FLOPs; more key/value memory traffic than GQA proper
            k, v = k.repeat_interleave(hq // hkv, dim=1), v.repeat_interleave(hq // hkv, dim=1)
            note = "k/v heads repeated (no enable_gqa in this PyTorch)"
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    f = lambda: varlen_attn(q, k, v, cu, cu, longest, longest, **kw)

    def make_bwd():
        out = f()
        dout = torch.randn_like(out)
        return lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    fwd_ms, bwd_ms = bench_pair(f, make_bwd)
    return fwd_ms, bwd_ms, note


def attempt(fn, *args):
    """fn(*args), or (None, reason) when the peer cannot run the case."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn(*args), None
        except Exception as e:  # a backend without a kernel for the case, OOM, an old PyTorch, ...
            return None, short_reason(e, caught)
        finally:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def geomean(values):
    if not values:
        return float("nan")
    if any(x <= 0 for x in values):
        return 0.0
    return math.exp(sum(math.log(x) for x in values) / len(values))


def fmt(x, spec=".1f"):
    return "n/a" if x is None else format(x, spec)


def main():
    if len(sys.argv) != 3:
        print(__doc__)
        return 2
    kiln_csv, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    if not os.path.exists(kiln_csv):
        print(f"attention_peers.py: no {kiln_csv}: bench_attention wrote no rows (no GPU, or the attention ops are "
              "not built in: see its log); nothing to compare")
        return 1
    rows = list(csv.DictReader(open(kiln_csv)))
    if not rows:
        print(f"attention_peers.py: {kiln_csv} has no rows; nothing to compare")
        return 1
    varlen = None
    if os.path.exists(kiln_csv + ".varlen.json"):
        varlen = json.load(open(kiln_csv + ".varlen.json"))
    print(f"device: {torch.cuda.get_device_name()}, PyTorch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%MZ}")
    report, reasons = [], []
    for r in rows:
        label = r["label"]
        batch, seq, d, causal = int(r["B"]), int(r["S"]), int(r["D"]), r["causal"] == "1"
        hq, hkv = (int(x) for x in r["Hq/Hkv"].split("/"))
        is_varlen = label.startswith("varlen_thd")
        lens = varlen["lengths"] if is_varlen and varlen else None
        flops = forward_flops(batch, seq, hq, d, causal, lens)
        kiln_pass = r["Check"] != "FAIL"
        kf, kb = float(r["Forward TFLOPS"]), float(r["Backward TFLOPS"])
        o = dict(label=label, Check=r["Check"], kiln_fwd=kf, kiln_bwd=kb)
        for name, backend in PEERS:
            if "_softcap" in label:  # bench_attention --softcap: SDPA has no logit softcap
                o[f"{name}_fwd"] = o[f"{name}_bwd"] = None
                reasons.append(f"{label}: {name}: SDPA has no logit softcap")
                continue
            if is_varlen:
                if name != "FA2" or lens is None:
                    o[f"{name}_fwd"] = o[f"{name}_bwd"] = None
                    reasons.append(f"{label}: {name}: " + ("no varlen API in SDPA" if lens is not None else
                                                          "no lengths file " + kiln_csv + ".varlen.json"))
                    continue
                res, why = attempt(time_varlen, lens, hq, hkv, d, causal)
                if res and res[2]:
                    reasons.append(f"{label}: {name} (varlen_attn): {res[2]}")
                res = res[:2] if res else None
            else:
                res, why = attempt(time_dense, backend, batch, seq, hq, hkv, d, causal)
            if res is None:
                o[f"{name}_fwd"] = o[f"{name}_bwd"] = None
                reasons.append(f"{label}: {name}: {why}")
                continue
            o[f"{name}_fwd"] = flops / (res[0] * 1e9)
            o[f"{name}_bwd"] = 2.5 * flops / (res[1] * 1e9)
        for direction in ("fwd", "bwd"):
            peers = [o[f"{n}_{direction}"] for n, _ in PEERS if o[f"{n}_{direction}"]]
            best = max(peers) if peers else None
            o[f"best_{direction}"] = best
            o[f"ratio_{direction}"] = None if best is None else (o[f"kiln_{direction}"] / best if kiln_pass else 0.0)
        report.append(o)
        print(f"  {label}: Kiln {kf:.1f}/{kb:.1f}, cuDNN {fmt(o['cuDNN_fwd'])}/{fmt(o['cuDNN_bwd'])}, "
              f"FA2 {fmt(o['FA2_fwd'])}/{fmt(o['FA2_bwd'])} TFLOP/s (forward/backward)", flush=True)

    keys = ["label", "Check", "kiln_fwd", "cuDNN_fwd", "FA2_fwd", "ratio_fwd", "kiln_bwd", "cuDNN_bwd", "FA2_bwd",
            "ratio_bwd"]
    with open(os.path.join(out_dir, "attention_report.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(keys)
        for o in report:
            w.writerow(["" if o[k] is None else (f"{o[k]:.4f}" if isinstance(o[k], float) else o[k]) for k in keys])

    width = max([len(o["label"]) for o in report] + [5])
    print(f"\n{'label':<{width}} {'Check':5} | {'Kiln':>7} {'cuDNN':>7} {'FA2':>7} {'ratio':>6} | "
          f"{'Kiln':>7} {'cuDNN':>7} {'FA2':>7} {'ratio':>6}")
    print(f"{'':<{width}} {'':5} | {'forward TFLOP/s, Kiln / faster peer':^30} | {'backward TFLOP/s, Kiln / faster peer':^30}")
    for o in report:
        print(f"{o['label']:<{width}} {o['Check']:5} | {o['kiln_fwd']:7.1f} {fmt(o['cuDNN_fwd']):>7} "
              f"{fmt(o['FA2_fwd']):>7} {fmt(o['ratio_fwd'], '.3f'):>6} | {o['kiln_bwd']:7.1f} "
              f"{fmt(o['cuDNN_bwd']):>7} {fmt(o['FA2_bwd']):>7} {fmt(o['ratio_bwd'], '.3f'):>6}")

    model_rows = [o for o in report if not o["label"].startswith("varlen_")]
    for direction, name in (("fwd", "forward"), ("bwd", "backward")):
        ratios = [o[f"ratio_{direction}"] for o in model_rows if o[f"ratio_{direction}"] is not None]
        passing = [x for x in ratios if x > 0]
        low = [o["label"] for o in model_rows if o[f"ratio_{direction}"] is not None and o[f"ratio_{direction}"] < 0.9]
        line = f"geomean {name} Kiln / faster SDPA backend over {len(ratios)} rows: {geomean(ratios):.3f} (target >= 1.0)"
        if len(passing) < len(ratios):
            line += f"; {len(ratios) - len(passing)} FAIL rows count as zero; over the passing: {geomean(passing):.3f}"
        line += f"; rows below 0.9x: {len(low)}" + (f" ({', '.join(low)})" if low else "")
        print(line)
    if len(model_rows) and any(o["ratio_fwd"] is None for o in model_rows):
        print("rows without any peer are left out of the geomeans")

    for o in report:
        if not o["label"].startswith("varlen_thd"):
            continue
        mask = "causal" if o["label"].endswith("causal") else "full"
        dense = [x for x in report if x["label"].startswith("varlen_dense_") and x["label"].endswith("_" + mask)]
        line = f"varlen {mask}" + (f" ({len(varlen['lengths'])} sequences {varlen['lengths']})" if varlen else "")
        if dense:
            dn = dense[0]
            rf = o["kiln_fwd"] / dn["kiln_fwd"] if dn["kiln_fwd"] > 0 else 0.0
            rb = o["kiln_bwd"] / dn["kiln_bwd"] if dn["kiln_bwd"] > 0 else 0.0
            line += (f": Kiln {o['kiln_fwd']:.1f} / {o['kiln_bwd']:.1f} TFLOP/s vs Kiln dense at the longest sequence "
                     f"{dn['kiln_fwd']:.1f} / {dn['kiln_bwd']:.1f} = {rf:.3f}x / {rb:.3f}x (target >= 0.9x)")
        line += (f"; FA2 varlen_attn {fmt(o['FA2_fwd'])} / {fmt(o['FA2_bwd'])} TFLOP/s, Kiln / FA2 "
                 f"{fmt(o['ratio_fwd'], '.3f')} / {fmt(o['ratio_bwd'], '.3f')}")
        print(line)
    if reasons:
        print("\npeers not available:")
        for r in reasons:
            print("  " + r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
