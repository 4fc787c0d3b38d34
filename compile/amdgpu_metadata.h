// Reads an AMDGPU code object's metadata note (NT_AMDGPU_METADATA, msgpack) with LLVM's ELF and
// msgpack readers: kernel name, registers, LDS, scratch, spills, wavefront size.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "kiln/result.h"
#include "compile/compiler.h"

namespace kiln {
/// Checks that `hsaco` is an EM_AMDGPU shared object and returns the metadata of `kernel`.
Result<CodeObjectInfo> read_amdgpu_metadata(std::span<const uint8_t> hsaco, const std::string& kernel);
}  // namespace kiln
