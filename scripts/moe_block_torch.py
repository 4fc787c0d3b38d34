#!/usr/bin/env python3
"""The PyTorch side of examples/moe_block (run on the GPU machine).

  check: rebuild the MoE block from `moe_block --dump DIR` (the same inputs, weights and upstream
         gradient) in PyTorch fp32 and compare y and every gradient with Kiln's (SNR > 30 dB). The
         check routes with Kiln's topk_ids, so that one flipped near-tie cannot hide the rest; it
         also routes by itself from Kiln's bf16 logits and requires the same experts as Kiln for
         every token (the gate of the routing), and from its own fp32 logits, which it reports
         without gating: the logits differ by the bf16 rounding of the router GEMM, and a
         group-limited top-k turns one near-tie between two groups into up to k different experts
         (on the H100, 2026-11-26: 10 of 2048 DeepSeek-V3 tokens beyond the per-expert slack below,
         every one of them identical to Kiln's choice when routed from Kiln's logits).
  time:  time the same block (forward + backward) in bf16 with PyTorch eager and torch.compile,
         grouped GEMMs by torch._grouped_mm, and print the ratio to Kiln's block time (--kiln-ms,
         from the same job).

  python3 scripts/moe_block_torch.py check DIR
  python3 scripts/moe_block_torch.py time --model-dims DIR/index.json --tokens 4096 --kiln-ms 12.3

The block is the one of examples/moe_block.cpp: logits = x W_router^T; routing (softmax, or
sigmoid with a score-correction bias for the selection only; group-limited top-k; renormalized;
scaled); this rank holds experts [0, G) and drops the slots routed to others; per expert
gate_up = x W_gate_up[e]^T, SiLU(gate) * up, down; y[t] = sum over the token's local slots of
weight * expert output. The backward starts from the dumped dy (loss = sum(y * dy)).
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

GATE = 30.0  # dB


def load(dirname):
    with open(os.path.join(dirname, "index.json")) as f:
        index = json.load(f)
    t = {}
    for name, info in index["tensors"].items():
        t[name] = np.fromfile(os.path.join(dirname, info["file"]), dtype=np.float32).reshape(info["shape"])
    return index, t


def snr_db(ref, out):
    ref, out = ref.double(), out.double()
    err = (ref - out).pow(2).sum().item()
    return 10 * math.log10(max(ref.pow(2).sum().item(), 1e-300) / max(err, 1e-300))


def selection_values(logits, routing, bias):
    """Scores (the weights' source) and selection values (scores + bias) from fp32 logits."""
    scores = torch.softmax(logits, dim=-1) if routing["scoring"] == "softmax" else torch.sigmoid(logits)
    v = scores + bias if bias is not None else scores
    return scores, v


def route(v, routing, k):
    """Top-k expert ids per token by selection value, with DeepSeek's group limit."""
    T, E = v.shape
    n_group, topk_group = routing["n_group"], routing["topk_group"] or routing["n_group"]
    if n_group > 1 and topk_group < n_group:
        grouped = v.view(T, n_group, E // n_group)
        if routing["group_score"] == "top2_sum":
            gscore = grouped.topk(2, dim=-1).values.sum(-1)
        else:
            gscore = grouped.max(-1).values
        keep = gscore.topk(topk_group, dim=-1).indices
        mask = torch.zeros(T, n_group, dtype=torch.bool, device=v.device).scatter_(1, keep, True)
        v = v.masked_fill(~mask.repeat_interleave(E // n_group, dim=1), float("-inf"))
    return v.topk(k, dim=-1).indices


def compare_routing(what, v, kiln_ids, torch_ids, slack, gated=True):
    """Tokens whose expert sets differ: a near-tie where the two sets' total selection values (under
    v) differ by at most `slack` per token (what the difference of the logits the two sides saw can
    explain), else a mismatch."""
    ks, ts = kiln_ids.sort(-1).values, torch_ids.sort(-1).values
    differ = (ks != ts).any(-1)
    gap = v.gather(1, torch_ids).sum(-1) - v.gather(1, kiln_ids).sum(-1)
    near = differ & (gap.abs() <= slack)
    bad = differ & ~near
    ok = bad.sum().item() == 0
    verdict = ("PASS" if ok else "FAIL") if gated else "(reported, not gated)"
    print(f"check: routing by PyTorch from {what:18s}: {differ.sum().item()} of {v.shape[0]} tokens choose other "
          f"experts than Kiln, {near.sum().item()} at near-ties, {bad.sum().item()} beyond {verdict}")
    return ok or not gated


def block_fp32(p, ids, routing, G, I):
    """y [T, H] in fp32 with autograd, routed by `ids` [T, k]; loops over the local experts."""
    x, wr = p["x"], p["router.weight"]
    logits = x @ wr.t()
    scores, _ = selection_values(logits, routing, None)
    w = scores.gather(1, ids)
    if routing["renormalize"]:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    w = w * routing["routed_scaling_factor"]
    y = torch.zeros_like(x)
    for e in range(G):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        gu = x[tok] @ p["experts.gate_up.weight"][e].t()
        a = F.silu(gu[:, :I]) * gu[:, I:]
        out = a @ p["experts.down.weight"][e].t()
        y = y.index_add(0, tok, out * w[tok, slot, None])
    return y


def check(args):
    index, t = load(args.dir)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    d, routing = index["dims"], index["routing"]
    k, G, I = d["topk"], d["experts_per_rank"], d["intermediate"]
    tensor = lambda n: torch.tensor(t[n], device=dev)
    params = ["x", "router.weight", "experts.gate_up.weight", "experts.down.weight"]
    p = {n: tensor(n).requires_grad_(True) for n in params}
    bias = tensor("router.bias").view(-1) if "router.bias" in t else None
    kiln_ids = tensor("topk_ids").long()

    # Routing: PyTorch's own choice, from its fp32 logits and from Kiln's bf16 logits.
    ok = True
    with torch.no_grad():
        logits32 = p["x"] @ p["router.weight"].t()
        logits_kiln = tensor("router.logits")
        _, v32 = selection_values(logits32, routing, bias)
        _, vk = selection_values(logits_kiln, routing, bias)
        # A selection value moves by at most (logit change) x (largest slope: 1 for softmax's
        # ordering, which is the logits', 1/4 for sigmoid); two sets of k differ by at most 2k of it.
        delta = (logits32 - logits_kiln).abs().amax(-1)
        slope = 1.0 if routing["scoring"] == "softmax" else 0.25
        if routing["scoring"] == "softmax":  # compare in logit space: the same order as the scores
            v32, vk = logits32 + 0, logits_kiln + 0
            if bias is not None:
                raise SystemExit("softmax routing with a bias is not a configuration of models.json")
        slack32 = 2 * k * slope * delta + 1e-6
        ok &= compare_routing("its fp32 logits", v32, kiln_ids, route(v32, routing, k), slack32, gated=False)
        ok &= compare_routing("Kiln's bf16 logits", vk, kiln_ids, route(vk, routing, k),
                              torch.full_like(delta, 1e-5))

    y = block_fp32(p, kiln_ids, routing, G, I)
    dy = tensor("dy")
    (y * dy).sum().backward()
    local = (kiln_ids < G).sum().item()
    print(f"check: {index['model']}: {d['tokens']} tokens, top-{k} of {d['experts']} experts, {G} on this rank "
          f"({local} of {kiln_ids.numel()} slots), hidden {d['hidden']}, intermediate {I}; PyTorch fp32 on {dev}")
    rows = [("y", y.detach())]
    with torch.no_grad():
        scores, _ = selection_values(p["x"] @ p["router.weight"].t(), routing, None)
        w = scores.gather(1, kiln_ids)
        if routing["renormalize"]:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        rows.append(("topk_weights", w * routing["routed_scaling_factor"]))
    rows += [(n + ".grad", p[n].grad) for n in params]
    for name, ref in rows:
        out = tensor(name).reshape(ref.shape)
        s = snr_db(ref, out)
        good = s > GATE and torch.isfinite(out).all().item()
        ok = ok and good
        print(f"check: {name:32s} SNR {s:6.1f} dB (gate {GATE:.0f}) {'PASS' if good else 'FAIL'}")
    print(f"check: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def make_block(routing, T, H, I, E, G, k):
    """The block in bf16 for timing: PyTorch's router, a stable sort of the slots by expert (other
    ranks' slots last), torch._grouped_mm for both expert GEMMs, the weighted sum back per token."""

    def block(x, wr, bias, wgu, wd):
        logits = x @ wr.t()
        scores, v = selection_values(logits.float(), routing, bias)
        ids = route(v, routing, k)
        w = scores.gather(1, ids)
        if routing["renormalize"]:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        w = w * routing["routed_scaling_factor"]
        flat = ids.view(-1)
        key = torch.where(flat < G, flat, G)
        order = torch.argsort(key, stable=True)
        offs = torch.cumsum(torch.bincount(key, minlength=G + 1)[:G], 0).to(torch.int32)
        local = (key[order] < G)[:, None]
        xs = x[order // k]
        gu = torch._grouped_mm(xs, wgu.transpose(-2, -1), offs=offs)
        a = F.silu(gu[:, :I]) * gu[:, I:]
        ys = torch._grouped_mm(a, wd.transpose(-2, -1), offs=offs)
        ys = torch.where(local, ys * w.view(-1)[order, None].to(ys.dtype), 0)
        y_slots = torch.empty_like(ys).index_copy(0, order, ys)
        return y_slots.view(T, k, H).sum(1)

    return block


def bench(fn, reps):
    import triton.testing

    return triton.testing.do_bench(fn, warmup=3, rep=reps * 50, return_mode="median")


def time_block(args):
    with open(args.model_dims) as f:
        index = json.load(f)
    d, routing = index["dims"], index["routing"]
    T = args.tokens or d["tokens"]
    H, I, E, G, k = d["hidden"], d["intermediate"], d["experts"], d["experts_per_rank"], d["topk"]
    dev, dt = "cuda", torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)

    def rand(*shape, scale=1.0, dtype=dt):
        return ((torch.rand(*shape, device=dev, generator=g) * 2 - 1) * scale).to(dtype).requires_grad_(True)

    x = rand(T, H)
    wr = rand(E, H, scale=math.sqrt(3 / H))
    bias = (rand(E, scale=0.05, dtype=torch.float32).detach() if routing["bias"] else None)
    wgu = rand(G, 2 * I, H, scale=math.sqrt(3 / H))
    wd = rand(G, H, I, scale=math.sqrt(3 / I))
    dy = torch.rand(T, H, device=dev, generator=g).mul_(2).sub_(1).to(dt)
    block = make_block(routing, T, H, I, E, G, k)

    def train(fn):
        def run():
            fn(x, wr, bias, wgu, wd).backward(dy)
        return run

    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"block ({index['model']}: {T} tokens, hidden {H}, top-{k} of {E} experts, {G} on this rank, "
          f"intermediate {I}, bf16), forward + backward:")
    eager = bench(train(block), 20)
    print(f"  PyTorch eager     {eager:9.3f} ms")
    compiled = None
    try:
        compiled_fn = torch.compile(block)
        for _ in range(3):
            train(compiled_fn)()
        compiled = bench(train(compiled_fn), 20)
        print(f"  torch.compile     {compiled:9.3f} ms")
    except Exception as e:  # torch.compile of _grouped_mm's backward is young: report, keep eager
        print(f"  torch.compile     failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    if args.kiln_ms:
        line = f"  Kiln              {args.kiln_ms:9.3f} ms   speed-up vs eager {eager / args.kiln_ms:.3f}x"
        if compiled:
            line += f", vs torch.compile {compiled / args.kiln_ms:.3f}x"
        print(line)
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("dir")
    t = sub.add_parser("time")
    t.add_argument("--model-dims", required=True, help="an index.json written by moe_block --dump")
    t.add_argument("--tokens", type=int, default=0, help="tokens (default: the dump's)")
    t.add_argument("--kiln-ms", type=float, default=0)
    args = ap.parse_args()
    return check(args) if args.cmd == "check" else time_block(args)


if __name__ == "__main__":
    sys.exit(main())
