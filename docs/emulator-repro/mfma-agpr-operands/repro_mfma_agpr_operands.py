# Minimal reproducer: an MFMA whose A or B operand is in AGPRs (the ACC field of a VOP3P-MAI
# instruction, bits 60:59; bit 59 for A, bit 60 for B). Each of 64 lanes loads 4 fp16 of A and 4 of B,
# copies them to a[0:3] with v_accvgpr_write_b32, then runs v_mfma_f32_32x32x8_f16 three times:
# A and B from VGPRs (the reference), A from a[0:1], B from a[2:3]; all three results are stored.
# CDNA3 semantics: the three results are equal (the registers hold the same values).
# Usage: python3 repro_mfma_agpr_operands.py <emulator folder>   (mfma_agpr_operands.bin: the assembled .s)
import ctypes, random, struct, sys
sys.path.insert(0, sys.argv[1])
from test.mockgpu.amd import emu
code = open("mfma_agpr_operands.bin", "rb").read() + b"\0" * 64
code_buf = ctypes.create_string_buffer(code, len(code))
rng = random.Random(1)
halves = [struct.unpack("<H", struct.pack("<e", rng.uniform(-1, 1)))[0] for _ in range(512)]
inp = (ctypes.c_uint32 * 256)(*[halves[2 * i] | (halves[2 * i + 1] << 16) for i in range(256)])
out = (ctypes.c_uint32 * (64 * 48))()
kernarg = (ctypes.c_uint64 * 2)(ctypes.addressof(inp), ctypes.addressof(out))
ka = ctypes.addressof(kernarg)
emu.run_asm(ctypes.addressof(code_buf), 0, 1, 1, 1, 64, 1, 1, ka, rsrc2=(2 << 1) | (1 << 7), arch="cdna",
            user_data=[ka & 0xffffffff, ka >> 32])
nonzero = sum(out[48 * lane + r] != 0 for lane in range(64) for r in range(16))
print(f"reference (VGPR operands): {nonzero} of 1024 results nonzero")
bad = 0 if nonzero > 900 else 1
for name, part in (("A in AGPRs", 1), ("B in AGPRs", 2)):
    diff = [(lane, r) for lane in range(64) for r in range(16) if out[48 * lane + 16 * part + r] != out[48 * lane + r]]
    bad += len(diff)
    print(f"{name}: {len(diff)} of 1024 results differ from the VGPR operands'; first (lane, register): {diff[:4]}")
sys.exit(1 if bad else 0)
