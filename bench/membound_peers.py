#!/usr/bin/env python3
"""Peers of bench_membound in the same job: PyTorch eager, torch.compile and the device-to-device
copy on the same shapes and byte counts; prints the BENCHMARKS.md memory-bound report with ratios.

    python3 bench/membound_peers.py KILN.csv OUT_DIR

Bytes per case are Kiln's (every input read once, every output written once), so the ratios are
ratios of times. Timing: triton.testing.do_bench (median).

Every backward row (rmsnorm_bwd, rmsnorm_bwd_dres, swiglu_bwd, rope_bwd, embedding_bwd, the MoE
backward ops) is timed as BENCHMARKS.md asks of a backward op's peer: the forward is run once
(eager, or compiled with torch.compile so that AOTAutograd compiles its backward graph, as in a
training step) and only the backward, torch.autograd.grad(outputs, inputs, dy, retain_graph=True),
is timed, with torch._functorch.config.donated_buffer = False so that the backward graph may run
repeatedly. The cross-entropy backward rows are timed the same way (ce_bwd_peers). The report marks
these rows "bwd graph" in its peer column.
"""
import csv
import math
import os
import sys

import torch
import torch._functorch.config
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


def time_backward_alone(fwd, args, leaves, grads, compiled):
    if compiled:
        torch._functorch.config.donated_buffer = False  # the backward graph runs repeatedly
        fwd = torch.compile(fwd, dynamic=False)
    outs = fwd(*args)
    run = lambda: torch.autograd.grad(outs, args[:leaves], grads, retain_graph=True)
    run()
    return do_bench(run, warmup=10, rep=100, return_mode="median")


def swiglu_fwd(x):
    g, u = x.chunk(2, dim=-1)
    return F.silu(g) * u


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


def ce_fwd(x, t):
    # fp32 math, per-token loss (Kiln's cross_entropy writes loss and lse per token)
    return F.cross_entropy(x.float(), t, ignore_index=-100, reduction="none")


def ce_targets(rows, vocab):
    t = torch.randint(0, vocab, (rows,), device=dev)
    t[torch.rand(rows, device=dev) < 1 / 128] = -100  # as Kiln's inputs: about 1 in 128 ignored
    return t


def ce_bwd_peers(x, t, dloss):
    """The fair backward peers (BENCHMARKS.md): eager autograd, and torch.compile of the forward
    with its AOTAutograd backward graph timed alone."""
    import torch._functorch.config as fc
    fc.donated_buffer = False
    xe = x.detach().requires_grad_(True)
    le = ce_fwd(xe, t)
    eager = lambda: torch.autograd.grad(le, (xe,), dloss, retain_graph=True)
    xc = x.detach().requires_grad_(True)
    lc = torch.compile(ce_fwd, dynamic=False)(xc, t)
    compiled = lambda: torch.autograd.grad(lc, (xc,), dloss, retain_graph=True)
    return eager, compiled


def ce_step(x, t, compiled=True):
    """The mean loss's forward then its backward (AOTAutograd's under torch.compile): one call."""
    x = x.detach().requires_grad_(True)
    loss_fn = lambda x, t: F.cross_entropy(x.float(), t, ignore_index=-100)
    if compiled:
        loss_fn = torch.compile(loss_fn, dynamic=False)

    def step():
        x.grad = None
        loss_fn(x, t).backward()
    step()
    return step


def ce_step_ms(x, t):
    """torch.compile of the mean loss, forward then its AOTAutograd backward (issue 16's 4.93 ms
    peer): the time of one forward + backward."""
    return do_bench(ce_step(x, t), warmup=10, rep=100, return_mode="median")
# RoPE as transformers' Llama applies it (modeling_llama.apply_rotary_pos_emb, rotate-half) on
# q [tokens, 32, 128] and k [tokens, 8, 128], with cos/sin [tokens, 128] precomputed in bf16 by
# LlamaRotaryEmbedding (theta 500000, Llama-3.1 scaling), as the model does once per step.
ROPE_HEADS, ROPE_KV_HEADS, ROPE_DIM = 32, 8, 128


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


def rope_cos_sin(tokens, dim=ROPE_DIM, theta=500000.0):
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    factor, low, high, old = 8.0, 1.0, 4.0, 8192  # _compute_llama3_parameters
    wavelen = 2 * math.pi / inv_freq
    llama = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * llama / factor + smooth * llama
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    inv_freq = torch.where(medium, smoothed, llama).to(dev)
    freqs = torch.arange(tokens, device=dev).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(bf16), emb.sin().to(bf16)


# Embedding of Llama-3.1-8B: W [128256, 4096] bf16, int64 ids; the backward is autograd's
# (embedding_dense_backward, deterministic; dW in W's dtype, bf16, where Kiln writes fp32).
EMB_VOCAB = 128256


def emb_fwd(ids, w):
    return F.embedding(ids, w)


def emb_fwd_of_w(w, ids):
    return F.embedding(ids, w)


# The backward peers of rope_bwd and embedding_bwd as BENCHMARKS.md asks: the forward run once
# (eager, or compiled with its AOTAutograd backward), then only the backward timed,
# autograd.grad(..., retain_graph=True) on the saved graph.
torch._functorch.config.donated_buffer = False


# MoE of DeepSeek-V3 (issue 18): 256 experts, top-8, 8 groups of 32 (top-2 sums), 4 kept, scaling 2.5.
MOE_EXPERTS, MOE_K = 256, 8


def moe_router(logits, bias):
    n = logits.shape[0]
    scores = logits.sigmoid()
    choice = scores + bias
    groups = choice.view(n, 8, MOE_EXPERTS // 8).topk(2, dim=-1)[0].sum(-1)
    kept = groups.topk(4, dim=-1, sorted=False)[1]
    mask = torch.zeros_like(groups).scatter_(1, kept, 1.0).unsqueeze(-1).expand(n, 8, MOE_EXPERTS // 8)
    choice = choice.masked_fill(mask.reshape(n, MOE_EXPERTS) == 0, float("-inf"))
    ids = choice.topk(MOE_K, dim=-1)[1]
    w = scores.gather(1, ids)
    w = w / (w.sum(-1, keepdim=True) + 1e-20) * 2.5
    return ids, w, torch.bincount(ids.flatten(), minlength=MOE_EXPERTS)


def moe_routing(rows):
    """Random distinct top-8 ids per token; the stable expert order of the slots; its inverse."""
    ids = torch.rand(rows, MOE_EXPERTS, device=dev).topk(MOE_K, dim=-1)[1]
    order = torch.sort(ids.flatten(), stable=True)[1]  # sorted row -> slot
    row_map = torch.empty_like(order)
    row_map[order] = torch.arange(order.numel(), device=dev)
    return order // MOE_K, row_map.view(rows, MOE_K)


def moe_permute(x, token_of_row):
    return x.index_select(0, token_of_row)


def moe_unpermute(y_sorted, w, row_map):
    n, k = row_map.shape
    return (y_sorted.index_select(0, row_map.flatten()).view(n, k, -1).float() * w.unsqueeze(-1)).sum(1).to(bf16)


def backward_inputs(label, rows, cols):
    """(forward, leaves, other inputs, output gradients), or None for a forward-timed label."""
    t = lambda *s: torch.randn(*s, device=dev, dtype=bf16)
    if label == "rmsnorm_bwd":  # dx and dgamma of F.rms_norm; the forward's rstd is saved, as in training
        return rms_fwd, (t(rows, cols), t(cols)), (), (t(rows, cols),)
    if label == "swiglu_bwd":  # dx [rows, 2I] of silu(gate) * up
        return swiglu_fwd, (t(rows, 2 * cols),), (), (t(rows, cols),)
    if label == "rope_bwd":
        cos, sin = rope_cos_sin(rows)
        return (apply_rotary_pos_emb, (t(rows, ROPE_HEADS, ROPE_DIM), t(rows, ROPE_KV_HEADS, ROPE_DIM)), (cos, sin),
                (t(rows, ROPE_HEADS, ROPE_DIM), t(rows, ROPE_KV_HEADS, ROPE_DIM)))
    if label == "moe_permute_bwd":
        token_of_row, _ = moe_routing(rows)
        return moe_permute, (t(rows, cols),), (token_of_row,), (t(rows * MOE_K, cols),)
    if label == "moe_unpermute_bwd":
        _, row_map = moe_routing(rows)
        w = torch.rand(rows, MOE_K, device=dev)
        return moe_unpermute, (t(rows * MOE_K, cols), w), (row_map,), (t(rows, cols),)
    if label in ("embedding_bwd", "embedding_bwd_dy"):  # PyTorch's dW is bf16 (W's dtype)
        ids = torch.randint(0, EMB_VOCAB, (rows,), device=dev, dtype=torch.int64)
        return emb_fwd_of_w, (t(EMB_VOCAB, cols),), (ids,), (t(rows, cols),)
    return None


def time_backward(fwd, leaves, rest, grads):
    leaves = tuple(x.detach().requires_grad_(True) for x in leaves)
    outs = fwd(*leaves, *rest)
    outs = outs if isinstance(outs, tuple) else (outs,)
    return do_bench(lambda: torch.autograd.grad(outs, leaves, grads, retain_graph=True), warmup=10, rep=100, return_mode="median")


def inputs(label, rows, cols):
    t = lambda *s: torch.randn(*s, device=dev, dtype=bf16)
    if label == "cross_entropy":
        return ce_fwd, (t(rows, cols), ce_targets(rows, cols))
    if label == "cross_entropy_grad":  # Kiln's fused loss + gradient against the loss's fwd + bwd
        x, tg = t(rows, cols), ce_targets(rows, cols)
        return ce_step(x, tg, compiled=False), ce_step(x, tg)
    if label.startswith("cross_entropy_bwd"):
        dloss = torch.rand(rows, device=dev) + 0.5
        return ce_bwd_peers(t(rows, cols), ce_targets(rows, cols), dloss)
    if label == "rmsnorm":
        return rms_fwd, (t(rows, cols), t(cols))
    if label == "rmsnorm_residual":
        return rms_res_fwd, (t(rows, cols), t(rows, cols), t(cols))
    if label == "swiglu":
        return swiglu_fwd, (t(rows, 2 * cols),)
    if label.startswith("quantize_fp8_"):
        fn = {"tensorwise": q_tensorwise, "rowwise": q_rowwise, "block1x128": q_block1x128,
              "block128x128": q_block128x128}[label[len("quantize_fp8_"):]]
        return fn, (t(rows, cols),)
    if label in ("rope", "rope_cache"):
        q, k = t(rows, ROPE_HEADS, ROPE_DIM), t(rows, ROPE_KV_HEADS, ROPE_DIM)
        cos, sin = rope_cos_sin(rows)
        return apply_rotary_pos_emb, (q, k, cos, sin)
    if label == "embedding":
        ids = torch.randint(0, EMB_VOCAB, (rows,), device=dev, dtype=torch.int64)
        return emb_fwd, (ids, t(EMB_VOCAB, cols))
    if label == "moe_router":
        return moe_router, (torch.randn(rows, cols, device=dev), 0.1 * torch.randn(cols, device=dev))
    if label == "moe_permute":
        token_of_row, _ = moe_routing(rows)
        return moe_permute, (t(rows, cols), token_of_row)
    if label == "moe_unpermute":
        _, row_map = moe_routing(rows)
        return moe_unpermute, (t(rows * MOE_K, cols), torch.rand(rows, MOE_K, device=dev), row_map)
    raise ValueError(label)


def main():
    kiln_csv, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    rows = list(csv.DictReader(open(kiln_csv)))
    # Device-to-device copy bandwidth, bytes read + written.
    src = torch.empty(2 * 1024**3 // 2, device=dev, dtype=bf16)
    dst = torch.empty_like(src)
    copy_ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    copy_gbs = 2 * src.numel() * 2 / (copy_ms * 1e6)
    del src, dst

    def copy_same_gbs(nbytes):
        # A device-to-device copy moving the row's bytes (half read, half written), timed as every
        # row is (do_bench: L2 cleared before each launch): the ceiling at this size, where launch
        # and ramp-up weigh more than in the 2 GiB copy above.
        half = max(int(nbytes) // 4, 1)  # bf16 elements of the source
        a = torch.empty(half, device=dev, dtype=bf16)
        b = torch.empty_like(a)
        ms = do_bench(lambda: b.copy_(a), warmup=10, rep=100, return_mode="median")
        del a, b
        return 4 * half / (ms * 1e6)

    out = []
    for r in rows:
        label, n, c, nbytes = r["label"], int(r["rows"]), int(r["cols"]), float(r["bytes"])
        bwd = backward_inputs(label, n, c)
        alone = backward_alone(label, n, c)
        if bwd:
            fwd, leaves, rest, grads = bwd
            eager_ms = time_backward(fwd, leaves, rest, grads)
            comp_ms = time_backward(torch.compile(fwd, dynamic=False), leaves, rest, grads)
        elif alone is not None:
            fwd, args, leaves, grads = alone
            eager_ms = time_backward_alone(fwd, args, leaves, grads, compiled=False)
            comp_ms = time_backward_alone(fwd, args, leaves, grads, compiled=True)
        else:
            fn, args = inputs(label, n, c)
            if callable(args):  # a backward: (eager, compiled) callables, timed as they are
                eager, compiled = fn, args
            else:
                eager = lambda: fn(*args)
                compiled_fn = torch.compile(fn, dynamic=False)
                compiled = lambda: compiled_fn(*args)
            compiled()
            eager_ms = do_bench(eager, warmup=10, rep=100, return_mode="median")
            comp_ms = do_bench(compiled, warmup=10, rep=100, return_mode="median")
        # The peer's form: the backward graph alone (BENCHMARKS.md's fair backward peer) or the op's forward.
        peer = "bwd graph" if bwd or alone is not None or label.startswith("cross_entropy_bwd") else "forward"
        if label == "cross_entropy_grad":
            peer = "fwd+bwd"
        kiln_gbs = float(r["GB/s"])
        eager_gbs, comp_gbs = nbytes / (eager_ms * 1e6), nbytes / (comp_ms * 1e6)
        same_gbs = copy_same_gbs(nbytes)
        out.append(dict(label=f"{label} [{n}x{c}]", Check=r["Check"], peer=peer, **{"GB/s": kiln_gbs, "GB/s_stddev": float(r["GB/s_stddev"]),
                        "Time (ms)": float(r["Time (ms)"]), "eager GB/s": eager_gbs, "compile GB/s": comp_gbs,
                        "kiln/eager": kiln_gbs / eager_gbs, "kiln/compile": kiln_gbs / comp_gbs,
                        "kiln/copy": kiln_gbs / copy_gbs, "copy same bytes GB/s": same_gbs,
                        "kiln/copy same bytes": kiln_gbs / same_gbs}))
        torch.cuda.empty_cache()
    keys = list(out[0].keys())
    with open(os.path.join(out_dir, "membound_report.csv"), "w") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(out)
    print(f"device: {torch.cuda.get_device_name()}, copy {copy_gbs:.0f} GB/s (device-to-device, read + write)")
    print("(/copy: against that 2 GiB copy; /same: against a copy of the row's own byte count, timed like the row)")
    print(f"{'label':<32} {'Check':5} {'peer':9} {'GB/s':>7} {'sd':>6} {'ms':>8} {'eager':>7} {'compile':>7} {'/eager':>7} {'/compile':>8} {'/copy':>6} {'/same':>6}")
    for o in out:
        print(f"{o['label']:<32} {o['Check']:5} {o['peer']:9} {o['GB/s']:7.0f} {o['GB/s_stddev']:6.0f} {o['Time (ms)']:8.4f} {o['eager GB/s']:7.0f} "
              f"{o['compile GB/s']:7.0f} {o['kiln/eager']:7.2f} {o['kiln/compile']:8.2f} {o['kiln/copy']:6.2f} {o['kiln/copy same bytes']:6.2f}")
    # Cross-entropy forward + backward: Kiln's two kernels (forward, backward in place) against
    # torch.compile of the mean loss's forward and backward together, on the same shapes.
    ce = {}
    for r in rows:
        if r["label"] in ("cross_entropy", "cross_entropy_bwd_inplace"):
            ce.setdefault((int(r["rows"]), int(r["cols"])), {})[r["label"]] = (float(r["Time (ms)"]), r["Check"])
    for (n, c), k in ce.items():
        if len(k) != 2:
            continue
        x = torch.randn(n, c, device=dev, dtype=bf16)
        step_ms = ce_step_ms(x, ce_targets(n, c))
        kiln_ms = k["cross_entropy"][0] + k["cross_entropy_bwd_inplace"][0]
        check = "PASS" if all(v[1] == "PASS" for v in k.values()) else "FAIL"
        ideal_ms = 2 * n * c * 2 / (copy_gbs * 1e6)
        print(f"cross-entropy forward + backward [{n}x{c}] bf16: Kiln {kiln_ms:.3f} ms ({check}), torch.compile "
              f"{step_ms:.3f} ms, kiln/compile speed-up {step_ms / kiln_ms:.2f}x; one read + one write at copy "
              f"bandwidth {ideal_ms:.3f} ms ({ideal_ms / kiln_ms:.0%} of it)")
        del x
        torch.cuda.empty_cache()
    geo = lambda k: math.exp(sum(math.log(max(o[k], 1e-9)) for o in out) / len(out))
    print(f"geomean kiln/compile {geo('kiln/compile'):.3f}, kiln/eager {geo('kiln/eager'):.3f}, kiln/copy {geo('kiln/copy'):.3f}, "
          f"kiln/copy of the same bytes {geo('kiln/copy same bytes'):.3f}; "
          f"lowest kiln/compile {min(o['kiln/compile'] for o in out):.3f}")
    for form in ("forward", "bwd graph"):
        rows_of = [o for o in out if o["peer"] == form]
        if rows_of:
            low = min(rows_of, key=lambda o: o["kiln/compile"])
            print(f"{form} rows: {len(rows_of)}, lowest kiln/compile {low['kiln/compile']:.3f} ({low['label']})")


if __name__ == "__main__":
    main()
