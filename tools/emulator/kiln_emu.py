# The child process of Kiln's `emulator` device backend (runtime/emulator/emulator_device.cpp).
#
# It owns the emulated device's memory and runs kernels in tinygrad's AMD CDNA emulator
# (test/mockgpu/amd/emu.py, found in the folder given as argv[2]). Kiln embeds this file and starts
#   python3 -c "<bootstrap>" <this file's length> <emulator folder>
# writing this file to the child's stdin first; the rest of stdin carries requests.
#
# Protocol: little-endian binary frames on stdin/stdout, one request then one response.
#   request  = u32 op, u32 0, u64 n, n payload bytes
#   response = u32 status (0 ok, 1 error), u32 0, u64 n, n payload bytes (on error: UTF-8 text)
# The first response is sent unasked, once the emulator is imported: ok with a JSON payload
# ({"tinygrad": version, "python": version}), or an error saying what failed to import.
#   op 1 MALLOC  u64 bytes                        -> u64 address (page-aligned, zero-filled)
#   op 2 FREE    u64 address                      -> empty
#   op 3 WRITE   u64 address, data                -> empty
#   op 4 READ    u64 address, u64 bytes           -> data
#   op 5 MEMSET  u64 address, u64 bytes, u8 value -> empty
#   op 6 RUN     u64 entry, u64 kernarg, u32 grid[3] (workgroups), u32 block[3] (threads),
#                u32 rsrc2, u32 scratch bytes per lane, u32 n, u32 user_sgpr[n] -> empty
# The C++ side checks every address range against its allocations before sending it: the
# emulator has no bounds checks and this process trusts its requests.
import ctypes, json, mmap, os, struct, sys, traceback

OP_MALLOC, OP_FREE, OP_WRITE, OP_READ, OP_MEMSET, OP_RUN = 1, 2, 3, 4, 5, 6


def main() -> int:
  stdin = sys.stdin.buffer
  # The protocol owns the original stdout; anything else printed (tinygrad's debug output) goes
  # to stderr, which Kiln keeps for its error messages.
  out = os.fdopen(os.dup(1), "wb", buffering=0)
  os.dup2(2, 1)
  sys.stdout = sys.stderr

  def reply(status: int, payload: bytes = b"") -> None:
    out.write(struct.pack("<IIQ", status, 0, len(payload)) + payload)

  def read_exact(n: int) -> bytes | None:
    data = stdin.read(n)
    return data if data is not None and len(data) == n else None

  emulator_dir = sys.argv[2] if len(sys.argv) > 2 else ""
  sys.path.insert(0, emulator_dir)
  try:
    import importlib.metadata
    from test.mockgpu.amd import emu
    versions = {"tinygrad": importlib.metadata.version("tinygrad"), "python": sys.version.split()[0]}
  except Exception as e:  # noqa: BLE001 - reported to Kiln, which names the fix
    reply(1, f"cannot import the emulator (test.mockgpu.amd.emu) from '{emulator_dir}' with {sys.executable}: "
             f"{type(e).__name__}: {e}".encode())
    return 1
  reply(0, json.dumps(versions).encode())

  allocations: dict[int, tuple[mmap.mmap, ctypes.Array]] = {}
  while True:
    header = read_exact(16)
    if header is None: return 0  # Kiln closed the pipe: the device is gone
    op, _, n = struct.unpack("<IIQ", header)
    payload = read_exact(n)
    if payload is None: return 0
    try:
      if op == OP_MALLOC:
        (size,) = struct.unpack_from("<Q", payload)
        region = mmap.mmap(-1, max(size, 1))
        view = (ctypes.c_char * len(region)).from_buffer(region)
        address = ctypes.addressof(view)
        allocations[address] = (region, view)
        reply(0, struct.pack("<Q", address))
      elif op == OP_FREE:
        (address,) = struct.unpack_from("<Q", payload)
        region, view = allocations.pop(address)
        del view
        region.close()
        reply(0)
      elif op == OP_WRITE:
        (address,) = struct.unpack_from("<Q", payload)
        ctypes.memmove(address, payload[8:], len(payload) - 8)
        reply(0)
      elif op == OP_READ:
        address, size = struct.unpack_from("<QQ", payload)
        reply(0, ctypes.string_at(address, size))
      elif op == OP_MEMSET:
        address, size, value = struct.unpack_from("<QQB", payload)
        ctypes.memset(address, value, size)
        reply(0)
      elif op == OP_RUN:
        entry, kernarg, gx, gy, gz, lx, ly, lz, rsrc2, scratch, count = struct.unpack_from("<QQ9I", payload)
        user_sgprs = list(struct.unpack_from(f"<{count}I", payload, 52))
        emu.run_asm(entry, 0, gx, gy, gz, lx, ly, lz, kernarg, rsrc2=rsrc2, scratch_size=scratch, arch="cdna",
                    user_data=user_sgprs)
        reply(0)
      else:
        reply(1, f"unknown request {op}".encode())
    except Exception as e:  # noqa: BLE001 - the request fails, the process lives on
      tb = traceback.format_exc(limit=-4)
      reply(1, f"{type(e).__name__}: {e}\n{tb}".encode())


sys.exit(main())
