# Minimal reproducer: v_mfma_scale_f32_32x32x64_f8f6f4 with one non-unit scale.
# A = B = e4m3 1.0 everywhere (32x64 and 64x32), C = 0. Lane l passes the e8m0 scale of the A data
# it holds (row l % 32, k-group l / 32: k 32(l/32) .. +31); lane 0 passes 128 (2^1), all others 127.
# B's scales are all 127. CDNA4 semantics: D[m][n] = sum_g 2^(sa(m,g)-127) 2^(sb(n,g)-127) * 32, so
# D[0][n] = 2*32 + 32 = 96 for every n and D[m][n] = 64 for m > 0.
# Usage: python3 repro_scaled_mfma.py <emulator folder>   (scaled.bin: the assembled scaled.s)
import ctypes, sys
sys.path.insert(0, sys.argv[1])
from test.mockgpu.amd import emu
code = open("scaled.bin", "rb").read() + b"\0" * 64
code_buf = ctypes.create_string_buffer(code, len(code))
out = (ctypes.c_float * (64 * 16))()
kernarg = (ctypes.c_uint64 * 1)(ctypes.addressof(out))
ka = ctypes.addressof(kernarg)
emu.run_asm(ctypes.addressof(code_buf), 0, 1, 1, 1, 64, 1, 1, ka, rsrc2=(2 << 1) | (1 << 7), arch="cdna",
            user_data=[ka & 0xffffffff, ka >> 32])
# Register r of lane l holds D[8 (r / 4) + 4 (l / 32) + r % 4][l % 32].
D = [[0.0] * 32 for _ in range(32)]
for l in range(64):
  for r in range(16): D[8 * (r // 4) + 4 * (l // 32) + r % 4][l % 32] = out[l * 16 + r]
want = [[96.0 if m == 0 else 64.0 for n in range(32)] for m in range(32)]
bad = [(m, n, D[m][n], want[m][n]) for m in range(32) for n in range(32) if D[m][n] != want[m][n]]
print(f"{len(bad)} of 1024 outputs differ from the CDNA4 scaled-MFMA semantics; first: {bad[:4]}")
print("D[0][0..3] =", D[0][:4], " D[1][0..3] =", D[1][:4], " D[4][0] =", D[4][0])
sys.exit(1 if bad else 0)
