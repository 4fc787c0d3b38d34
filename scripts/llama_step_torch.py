#!/usr/bin/env python3
"""The PyTorch side of examples/llama_step (run on the GPU machine).

  check: build the same model with the same weights and batch (from `llama_step --dump DIR`), run
         forward and backward in fp32, and compare the loss (relative error < 1e-3) and every
         gradient (SNR > 30 dB) with Kiln's.
  time:  time one training step (forward + backward) of the same model in bf16 with PyTorch eager
         and torch.compile (SDPA picks its fastest backend), at the same dimensions, and print the
         ratio to Kiln's step time (--kiln-ms, from the same run).

  python3 scripts/llama_step_torch.py check DIR
  python3 scripts/llama_step_torch.py time --model-dims DIR/index.json --seq 8192 --micro-batch 1 --kiln-ms 80.1 \
      [--fp8 block --kiln-fp8-ms 70.2 --fp8-loss-diff 0.0012]

With --kiln-fp8-ms (llama_step --fp8 RECIPE, the same run) the table also has Kiln's step with its
layer GEMMs in fp8, against Kiln bf16 and torch.compile bf16, and the fp8 step's loss difference
from Kiln's bf16 step on the same weights and batch.

The model is the one of examples/llama_step.cpp: embedding -> L x [rmsnorm -> fused qkv linear ->
RoPE (rotate-half, Llama-3.1 frequency scaling, positions restarting per sequence) -> causal GQA
attention -> output linear -> residual -> rmsnorm -> gate_up linear -> SiLU(gate) * up -> down
linear -> residual] -> rmsnorm -> lm_head -> cross-entropy (mean over tokens), bf16 weights.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F


def llama3_inv_freq(head_dim, theta, scaling, factor=8.0, low=1.0, high=4.0, old_ctx=8192):
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    if scaling != "llama3":
        return inv
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    mid = (1 - smooth) * scaled / factor + smooth * scaled
    is_mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
    return torch.where(is_mid, mid, scaled)


def rope(x, cos, sin):  # x [B, S, H, D], rotate-half
    d = x.shape[-1] // 2
    x1, x2 = x[..., :d], x[..., d:]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)


def rmsnorm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def make_step(dims, layers, B, S, eps, theta, scaling, device, dtype):
    H, I, Hq, Hkv, D, V = (dims[k] for k in ("hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab"))
    inv = llama3_inv_freq(D, theta, scaling).to(device)
    ang = torch.arange(S, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)

    def step(p, ids, targets):
        x = F.embedding(ids, p["embed.weight"]).view(B, S, H)
        for l in range(layers):
            g = lambda n: p[f"layers.{l}.{n}"]
            xn = rmsnorm(x, g("attn_norm.weight"), eps)
            qkv = xn @ g("qkv.weight").t()
            q, k, v = qkv.split([Hq * D, Hkv * D, Hkv * D], dim=-1)
            q = rope(q.view(B, S, Hq, D), cos, sin).transpose(1, 2)
            k = rope(k.view(B, S, Hkv, D), cos, sin).transpose(1, 2)
            v = v.view(B, S, Hkv, D).transpose(1, 2)
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            x = x + o.transpose(1, 2).reshape(B, S, Hq * D) @ g("o.weight").t()
            hn = rmsnorm(x, g("mlp_norm.weight"), eps)
            gu = hn @ g("gate_up.weight").t()
            gate, up = gu.split([I, I], dim=-1)
            x = x + (F.silu(gate) * up) @ g("down.weight").t()
        logits = rmsnorm(x, p["final_norm.weight"], eps) @ p["lm_head.weight"].t()
        return F.cross_entropy(logits.view(B * S, V).float(), targets.view(-1))

    return step


def load(dirname):
    with open(os.path.join(dirname, "index.json")) as f:
        index = json.load(f)
    t = {}
    for name, info in index["tensors"].items():
        a = np.fromfile(os.path.join(dirname, info["file"]), dtype=np.float32).reshape(info["shape"])
        t[name] = a
    return index, t


def snr_db(ref, out):
    ref, out = ref.double(), out.double()
    err = (ref - out).pow(2).sum().item()
    return 10 * math.log10(ref.pow(2).sum().item() / max(err, 1e-300))


def check(args):
    index, t = load(args.dir)
    dev = "cuda"
    dims, L, S, B = index["dims"], index["layers"], index["seq"], index["micro_batch"]
    names = [n for n in t if not n.endswith(".grad") and n not in ("ids", "targets")]
    p = {n: torch.tensor(t[n], device=dev).squeeze(0) if t[n].shape[0] == 1 else torch.tensor(t[n], device=dev)
         for n in names}
    for v in p.values():
        v.requires_grad_(True)
    ids = torch.tensor(t["ids"].reshape(-1), device=dev).long().view(B, S)
    targets = torch.tensor(t["targets"].reshape(-1), device=dev).long().view(B, S)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    step = make_step(dims, L, B, S, index["eps"], index["rope_theta"], index["rope_scaling"], dev, torch.float32)
    loss = step(p, ids, targets)
    loss.backward()
    rel = abs(loss.item() - index["loss"]) / abs(loss.item())
    ok = rel < 1e-3
    print(f"check: loss Kiln {index['loss']:.6f} PyTorch fp32 {loss.item():.6f}: relative error {rel:.2e} (gate 1e-3) "
          f"{'PASS' if ok else 'FAIL'}")
    for n in names:
        kiln_grad = torch.tensor(t[n + ".grad"], device=dev).reshape(p[n].shape)
        s = snr_db(p[n].grad, kiln_grad)
        good = s > 30 and torch.isfinite(kiln_grad).all().item()
        ok = ok and good
        print(f"check: {n + '.grad':32s} SNR {s:6.1f} dB (gate 30) {'PASS' if good else 'FAIL'}")
    print(f"check: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def bench(fn, reps):
    import triton.testing

    return triton.testing.do_bench(fn, warmup=3, rep=reps * 100, return_mode="median")


def time_step(args):
    with open(args.model_dims) as f:
        index = json.load(f)
    dims, L = index["dims"], index["layers"]
    B, S = args.micro_batch, args.seq
    dev, dt = "cuda", torch.bfloat16
    H, I, Hq, Hkv, D, V = (dims[k] for k in ("hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab"))
    g = torch.Generator(device=dev).manual_seed(0)

    def w(*shape):
        return (torch.rand(*shape, device=dev, generator=g, dtype=torch.float32) * 2 - 1).mul_(
            math.sqrt(3 / shape[-1])).to(dt).requires_grad_(True)

    p = {"embed.weight": w(V, H), "final_norm.weight": torch.ones(H, device=dev, dtype=dt, requires_grad=True),
         "lm_head.weight": w(V, H)}
    for l in range(L):
        p[f"layers.{l}.attn_norm.weight"] = torch.ones(H, device=dev, dtype=dt, requires_grad=True)
        p[f"layers.{l}.qkv.weight"] = w((Hq + 2 * Hkv) * D, H)
        p[f"layers.{l}.o.weight"] = w(H, Hq * D)
        p[f"layers.{l}.mlp_norm.weight"] = torch.ones(H, device=dev, dtype=dt, requires_grad=True)
        p[f"layers.{l}.gate_up.weight"] = w(2 * I, H)
        p[f"layers.{l}.down.weight"] = w(H, I)
    ids = torch.randint(0, V, (B, S), device=dev)
    targets = torch.randint(0, V, (B, S), device=dev)
    step = make_step(dims, L, B, S, 1e-5, index["rope_theta"], index["rope_scaling"], dev, dt)

    def train(fn):
        def run():
            loss = fn(p, ids, targets)
            loss.backward()
        return run

    eager = bench(train(step), 20)
    compiled_fn = torch.compile(step)
    for _ in range(3):
        train(compiled_fn)()
    compiled = bench(train(compiled_fn), 20)
    print(f"device: {torch.cuda.get_device_name()}  torch {torch.__version__}")
    print(f"step ({index['model']}, {L} layers, seq {S}, micro-batch {B}, bf16):")
    print(f"  PyTorch eager     {eager:9.3f} ms")
    print(f"  torch.compile     {compiled:9.3f} ms")
    if args.kiln_ms:
        print(f"  Kiln bf16         {args.kiln_ms:9.3f} ms   speed-up vs eager {eager / args.kiln_ms:.3f}x, "
              f"vs torch.compile {compiled / args.kiln_ms:.3f}x (target >= 1.1x)")
    if args.kiln_fp8_ms:
        vs_bf16 = f"vs Kiln bf16 {args.kiln_ms / args.kiln_fp8_ms:.3f}x, " if args.kiln_ms else ""
        print(f"  Kiln fp8 {args.fp8 or '?':9s}{args.kiln_fp8_ms:9.3f} ms   speed-up {vs_bf16}"
              f"vs torch.compile bf16 {compiled / args.kiln_fp8_ms:.3f}x; loss difference from Kiln bf16 "
              f"{args.fp8_loss_diff:+.6f}")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("dir")
    t = sub.add_parser("time")
    t.add_argument("--model-dims", required=True, help="an index.json written by llama_step --dump")
    t.add_argument("--seq", type=int, required=True)
    t.add_argument("--micro-batch", type=int, default=1)
    t.add_argument("--kiln-ms", type=float, default=0)
    t.add_argument("--kiln-fp8-ms", type=float, default=0, help="Kiln's fp8 step (llama_step --fp8), same run")
    t.add_argument("--fp8", default="", help="the fp8 recipe of --kiln-fp8-ms")
    t.add_argument("--fp8-loss-diff", type=float, default=float("nan"), help="fp8 loss - bf16 loss (Kiln)")
    args = ap.parse_args()
    return check(args) if args.cmd == "check" else time_step(args)


if __name__ == "__main__":
    sys.exit(main())
