#!/usr/bin/env python3
"""scripts/moe_block_torch.py's near-tie rule (near_tie_order, pure Python over numpy arrays; the
script itself needs PyTorch, so only the function is loaded) on constructed DeepSeek-V3 routings,
the cases of tests/templates/test_moe.cpp: the reference's own ids pass; an expert chosen far
from a tie and two slots swapped far from a tie fail; two experts one fp32 ulp apart swapped, and
two groups of equal score swapped at the group limit, pass; the same group swap without the tie
fails.  Usage: test_moe_near_tie.py scripts/moe_block_torch.py"""
import ast
import itertools
import sys

try:
    import numpy as np
except ImportError:
    print("SKIP: numpy is unavailable")
    sys.exit(0)
src = open(sys.argv[1]).read()
tree = ast.parse(src)
ns = {"itertools": itertools, "np": np}
for node in tree.body:
    if isinstance(node, ast.FunctionDef) and node.name in ("near_tie_order",):
        exec(compile(ast.Module([node], []), "x", "exec"), ns)
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in ("NEAR_TIE_ULPS", "FLT_EPSILON"):
        exec(compile(ast.Module([node], []), "x", "exec"), ns)
near = ns["near_tie_order"]
R = {"n_group": 8, "topk_group": 4, "group_score": "top2_sum"}
E, k, gs = 256, 8, 32
def values(x, b):
    s = 1 / (1 + np.exp(-x.astype(np.float64)))
    v = s + b
    slack = ns["NEAR_TIE_ULPS"] * ns["FLT_EPSILON"] * (np.abs(s) + np.abs(b))
    return v, slack
def route(v):
    g = [sorted(v[i*gs:(i+1)*gs], reverse=True) for i in range(8)]
    g = [a[0] + a[1] for a in g]
    kept = sorted(range(8), key=lambda i: (-g[i], i))[:4]
    allowed = [e for e in range(E) if e // gs in kept]
    return sorted(allowed, key=lambda e: (-v[e], e))[:k]
rng = np.random.default_rng(1)
x = (rng.uniform(-1, 1, E) * 3).astype(np.float32); b = (rng.uniform(-1, 1, E) * 0.1).astype(np.float32)
v, sl = values(x, b); ids = route(v)
assert near(v, sl, ids, R, k)
bad = list(ids); other = [e for e in range((ids[0]//gs)*gs, (ids[0]//gs+1)*gs) if e not in ids][0]; bad[0] = other
assert not near(v, sl, bad, R, k)
sw = list(ids); sw[0], sw[4] = sw[4], sw[0]
assert not near(v, sl, sw, R, k)
# within-top-k near tie
a_, b_ = ids[2], ids[3]
x[b_] = x[a_]; b[b_] = np.nextafter(b[a_], np.float32(1))
v, sl = values(x, b); ids = route(v); assert ids[2] == b_ and ids[3] == a_
sw = list(ids); sw[2], sw[3] = sw[3], sw[2]
assert near(v, sl, sw, R, k)
# group swap at the limit
for seed in range(10, 60):
    rng = np.random.default_rng(seed)
    x = (rng.uniform(-1, 1, E) * 3).astype(np.float32); b = (rng.uniform(-1, 1, E) * 0.1).astype(np.float32)
    v, sl = values(x, b)
    g = [sorted(v[i*gs:(i+1)*gs], reverse=True) for i in range(8)]; g = [q[0] + q[1] for q in g]
    order = sorted(range(8), key=lambda i: (-g[i], i)); src_, cp = order[3], order[4]
    x[cp*gs:(cp+1)*gs] = x[src_*gs:(src_+1)*gs]; b[cp*gs:(cp+1)*gs] = b[src_*gs:(src_+1)*gs]
    v, sl = values(x, b); ids = route(v)
    lo, hi = min(src_, cp), max(src_, cp)
    if not any(e // gs == lo for e in ids): continue
    kern = [e + (hi - lo) * gs if e // gs == lo else e for e in ids]
    assert near(v, sl, kern, R, k), seed
    b[hi*gs:(hi+1)*gs] -= np.float32(1e-3)
    v, sl = values(x, b)
    assert not near(v, sl, kern, R, k)
    print("group swap checked with seed", seed)
    break
else:
    raise SystemExit("no seed")
print("python near_tie_order: all cases as expected")
