#!/usr/bin/env python3
"""The PyTorch side of examples/moe_block (run on the GPU machine).

  check: rebuild the MoE block from `moe_block --dump DIR` (the same inputs, weights and upstream
         gradient) in PyTorch fp32 and compare y and every gradient with Kiln's (SNR > 30 dB). The
         check routes with Kiln's topk_ids, so that one flipped near-tie cannot hide the rest. The
         routing itself is gated twice, by Kiln's near-tie rule (near_tie_order, the rule of
         templates/lib/moe.cpp that `kiln run --check` applies): PyTorch routes from Kiln's bf16
         logits (slack: a few fp32 ulps) and from its own fp32 logits (slack: what the bf16
         rounding of the router GEMM moves each value, plus the ulps); a token whose experts or
         order differ from Kiln's passes only at a near-tie of single experts or, where the top-k
         is group-limited, of the group scores (one near-tie between two groups turns into up to
         k different experts).
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
import itertools
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


NEAR_TIE_ULPS = 16  # templates/lib/moe.h kNearTieUlps
FLT_EPSILON = 2.0 ** -23


def near_tie_order(v, slack, ids, routing, k):
    """Kiln's near-tie rule (templates/lib/moe.cpp near_tie_order) for one token: `ids` (k experts,
    in Kiln's slot order) pass when they are distinct, every one in a group that the group scores
    allow within their slacks (a swapped group's score within the slacks of the reference's last
    kept group), and, over the experts so allowed, the value v of Kiln's j-th expert lies within the
    two experts' slacks of the reference's j-th, for every slot j. v, slack: [E] float64 numpy."""
    E = v.shape[0]
    ids = [int(i) for i in ids]
    if len(set(ids)) != len(ids) or any(i < 0 or i >= E for i in ids):
        return False

    def matches(kept, gs):
        if kept is not None and any(not kept[i // gs] for i in ids):
            return False
        allowed = [e for e in range(E) if kept is None or kept[e // gs]]
        order = sorted(allowed, key=lambda e: (-v[e], e))
        return all(abs(v[a] - v[b]) <= slack[a] + slack[b] for a, b in zip(ids, order[:k]))

    n_group, topk_group = routing["n_group"], routing["topk_group"] or routing["n_group"]
    if n_group <= 1 or topk_group >= n_group:
        return matches(None, E)
    gs = E // n_group
    g, gslack = [], []
    for i in range(n_group):
        top = sorted(range(i * gs, (i + 1) * gs), key=lambda e: (-v[e], e))
        if routing["group_score"] == "top2_sum":
            g.append(v[top[0]] + v[top[1]])
            gslack.append(slack[top[0]] + slack[top[1]])
        else:
            g.append(v[top[0]])
            gslack.append(slack[top[0]])
    edge = sorted(range(n_group), key=lambda i: (-g[i], i))[topk_group - 1]
    band = [i for i in range(n_group) if abs(g[i] - g[edge]) <= gslack[i] + gslack[edge]]
    certain = [i for i in range(n_group) if i not in band and g[i] > g[edge]]
    need = topk_group - len(certain)
    if need < 0 or need > len(band):
        return False
    for tries, chosen in enumerate(itertools.combinations(band, need)):
        if tries >= 4096:
            break
        kept = [False] * n_group
        for i in certain + list(chosen):
            kept[i] = True
        if matches(kept, gs):
            return True
    return False


def compare_routing(what, v, slack, kiln_ids, torch_ids, routing, k):
    """Tokens whose top-k (in order) differ from Kiln's: accepted at a near-tie by Kiln's rule
    (near_tie_order) with the slack of each selection value, else a mismatch; gated."""
    differ = (kiln_ids != torch_ids).any(-1)
    tokens = differ.nonzero().flatten().tolist()
    vd, sd, kd = v.double().cpu().numpy(), slack.double().cpu().numpy(), kiln_ids.cpu().numpy()
    near = sum(1 for t in tokens if near_tie_order(vd[t], sd[t], kd[t], routing, k))
    bad = len(tokens) - near
    print(f"check: routing by PyTorch from {what:18s}: {len(tokens)} of {v.shape[0]} tokens choose other "
          f"experts or orders than Kiln, {near} at near-ties, {bad} beyond {'PASS' if bad == 0 else 'FAIL'}")
    return bad == 0


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
        # Each selection value's slack: what the difference of the logits the two sides saw can
        # move it (slope 1 in logit space for softmax, whose order is the logits'; at most 1/4 for
        # sigmoid), plus NEAR_TIE_ULPS fp32 ulps of the magnitude Kiln rounds (|score| + |bias|).
        s32, _ = selection_values(logits32, routing, None)
        sk, _ = selection_values(logits_kiln, routing, None)
        ulps = NEAR_TIE_ULPS * FLT_EPSILON
        if routing["scoring"] == "softmax":  # compare in logit space: the same order as the scores
            if bias is not None:
                raise SystemExit("softmax routing with a bias is not a configuration of models.json")
            v32, vk = logits32 + 0, logits_kiln + 0
            slack32 = (logits32 - logits_kiln).abs()
            slackk = torch.zeros_like(vk)  # Kiln compares its logits themselves: exact
        else:
            mag = (lambda sc: sc.abs() + (bias.abs() if bias is not None else 0))
            slack32 = 0.25 * (logits32 - logits_kiln).abs() + ulps * (mag(s32) + mag(sk))
            slackk = ulps * mag(sk)
        ok &= compare_routing("its fp32 logits", v32, slack32, kiln_ids, route(v32, routing, k), routing, k)
        ok &= compare_routing("Kiln's bf16 logits", vk, slackk, kiln_ids, route(vk, routing, k), routing, k)

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
