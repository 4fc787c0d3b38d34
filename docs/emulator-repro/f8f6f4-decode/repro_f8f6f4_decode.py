# Minimal reproducer: the CDNA emulator decodes an unscaled v_mfma_f32_32x32x64_f8f6f4 as the
# 16-byte scaled form (v_mfma_scale_f32_32x32x64_f8f6f4) starting 8 bytes before it, when an
# instruction starts there: the instructions in those 8 bytes are not run, and the MFMA is run with
# e8m0 "scales" decoded from their bits.
# f8f6f4_decode.s: two MFMAs of A = B = e4m3 1.0 (32x64 and 64x32), C = 0, so D = 64 everywhere;
# before each, two adds (1 and 2) to a counter, so each counter ends at 3. Before MFMA 1 an 8-byte
# and a 4-byte instruction (none starts 8 bytes before it), before MFMA 2 two 4-byte ones.
# Usage: python3 repro_f8f6f4_decode.py <emulator folder>   (f8f6f4_decode.bin: the assembled .s)
import ctypes, sys
sys.path.insert(0, sys.argv[1])
from test.mockgpu.amd import emu
code = open("f8f6f4_decode.bin", "rb").read() + b"\0" * 64
code_buf = ctypes.create_string_buffer(code, len(code))
out = (ctypes.c_float * (2048 + 128))(*([float("nan")] * (2048 + 128)))
kernarg = (ctypes.c_uint64 * 1)(ctypes.addressof(out))
ka = ctypes.addressof(kernarg)
emu.run_asm(ctypes.addressof(code_buf), 0, 1, 1, 1, 64, 1, 1, ka, rsrc2=(2 << 1) | (1 << 7), arch="cdna",
            user_data=[ka & 0xffffffff, ka >> 32])
counters = ctypes.cast(ctypes.addressof(out) + 8192, ctypes.POINTER(ctypes.c_uint32))
bad = 0
for i, name in enumerate(("MFMA 1 (no instruction starts 8 bytes before it)", "MFMA 2 (one does)")):
  d = [out[1024 * i + j] for j in range(1024)]
  wrong = sum(v != 64.0 for v in d)
  counter = counters[64 * i]  # lane 0; all lanes are alike
  print(f"{name}: {wrong} of 1024 outputs differ from 64 (D[0][0] = {d[0]}); counter = {counter} (want 3)")
  bad += wrong + (counter != 3)
sys.exit(1 if bad else 0)
