# Minimal reproducer: ds_write_b128 with its data in AGPRs (a[0:3], the DS encoding's ACC bit).
# Each of 64 lanes loads 16 bytes of `in` into v[20:23], copies them to a[0:3] with
# v_accvgpr_write_b32, writes a[0:3] to LDS, reads the LDS back into v[4:7] and stores it to `out`.
# CDNA3 semantics: out == in. The same with the data in v[20:23] (ds_write_b128 v1, v[20:23]), or
# with global_load_dwordx4 a[0:3] followed by v_accvgpr_read_b32, passes here.
# Usage: python3 repro_ds_write_agpr.py <emulator folder>   (ds_write_agpr.bin: the assembled .s)
import ctypes, sys
sys.path.insert(0, sys.argv[1])
from test.mockgpu.amd import emu
code = open("ds_write_agpr.bin", "rb").read() + b"\0" * 64
code_buf = ctypes.create_string_buffer(code, len(code))
inp = (ctypes.c_uint32 * 256)(*[0x1000 + i for i in range(256)])
out = (ctypes.c_uint32 * 256)()
kernarg = (ctypes.c_uint64 * 2)(ctypes.addressof(inp), ctypes.addressof(out))
ka = ctypes.addressof(kernarg)
emu.run_asm(ctypes.addressof(code_buf), 0, 1, 1, 1, 64, 1, 1, ka, rsrc2=(2 << 1) | (1 << 7), arch="cdna",
            user_data=[ka & 0xffffffff, ka >> 32])
bad = [(i, hex(out[i]), hex(inp[i])) for i in range(256) if out[i] != inp[i]]
print(f"{len(bad)} of 256 words differ; first (index, out, in): {bad[:4]}")
sys.exit(1 if bad else 0)
