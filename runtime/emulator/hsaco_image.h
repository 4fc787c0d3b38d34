// What the emulator backend needs of an AMDGPU code object (hsaco) to run one of its kernels
// without a driver: the loaded image, the kernel descriptor's fields and the kernel-argument
// layout of the AMDGPU metadata note; and the dispatch that the packet processor would set up
// (kernarg segment, dispatch packet, user SGPRs). See shared/AMD-EMULATION.md ("Loading a Kiln
// code object"). Built with LLVM only (its ELF and msgpack readers).
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/result.h"

namespace kiln {

/// One kernel argument of the metadata note's `.args`, in the kernel's order.
struct KernargSlot {
  uint32_t offset = 0;     ///< Byte offset in the kernarg segment.
  uint32_t size = 0;       ///< Bytes.
  std::string value_kind;  ///< "global_buffer", "by_value", "hidden_block_count_x", ...
  bool hidden() const { return value_kind.rfind("hidden_", 0) == 0; }
};

/// A kernel of a code object, ready to be copied into (emulated) device memory and launched.
struct HsacoKernel {
  /// Every PT_LOAD segment at its p_vaddr (file bytes, then zeros up to p_memsz), followed by
  /// kImageSlack spare bytes: an instruction decoder reads up to 16 bytes past the last one.
  std::vector<uint8_t> image;
  static constexpr size_t kImageSlack = 64;
  uint64_t descriptor = 0;  ///< Offset of the 64-byte kernel descriptor (`<kernel>.kd`) in `image`.
  uint64_t entry = 0;       ///< Offset of the kernel's first instruction in `image`.
  uint32_t group_segment_bytes = 0;    ///< Static LDS per workgroup.
  uint32_t private_segment_bytes = 0;  ///< Scratch per lane.
  uint32_t rsrc2 = 0;                  ///< compute_pgm_rsrc2 (user SGPR count, workgroup ids, LDS).
  uint16_t code_properties = 0;        ///< kernel_code_properties (which user SGPRs are set up).
  uint32_t kernarg_bytes = 0;          ///< .kernarg_segment_size.
  std::vector<KernargSlot> args;       ///< .args in the kernel's order (explicit, then hidden).
  size_t explicit_args = 0;            ///< Leading entries of `args` that the caller passes.
  std::string target;                  ///< From amdhsa.target: "gfx942", "gfx950".
};

/// Reads kernel `kernel` of the AMDGPU code object `hsaco`. Errors: Errc::corrupt (not an AMDGPU
/// ELF, no metadata or descriptor for the kernel, arguments outside the kernarg segment),
/// unsupported (dynamic relocations, kernarg preloading, wave32).
Result<HsacoKernel> read_hsaco_kernel(std::span<const uint8_t> hsaco, const std::string& kernel);

/// One launch as the packet processor would prepare it.
struct Dispatch {
  std::vector<uint8_t> kernarg;       ///< The kernarg segment (at least 1 byte).
  std::array<uint8_t, 64> packet{};   ///< hsa_kernel_dispatch_packet_t.
  std::vector<uint32_t> user_sgprs;   ///< s0.. in ABI order, padded to rsrc2's USER_SGPR_COUNT.
  uint32_t rsrc2 = 0;                 ///< With the LDS size in GRANULATED_LDS_SIZE (see below).
};

/// Grid in workgroups and block in work-items, as LaunchGeometry has them.
struct DispatchShape {
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t dynamic_lds_bytes = 0;
};

/// Prepares a launch of `k`: the explicit arguments from `args` (pointers to each value, in the
/// kernel's order: the kernel-parameter array of hipModuleLaunchKernel), the hidden ones from the
/// shape; user SGPRs that point at `kernarg_address`, `packet_address` and `queue_address` (the
/// device addresses where the caller puts the kernarg segment, the packet and a zeroed 256-byte
/// queue stand-in). The descriptor's GRANULATED_LDS_SIZE is 0 (the packet processor derives LDS
/// from the group segment size); the result carries ceil(LDS / 512) there. Errors:
/// Errc::invalid_argument (the shape), unsupported (LDS beyond the field, too many user SGPRs).
Result<Dispatch> prepare_dispatch(const HsacoKernel& k, void* const* args, const DispatchShape& shape,
                                  uint64_t kernarg_address, uint64_t packet_address, uint64_t queue_address);

}  // namespace kiln
