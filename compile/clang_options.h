// The clang compiler's identity (version, options) without LLVM: builds without LLVM use it to
// compute the cache keys of clang-built kernels, so they can load a cache prewarmed on a machine
// that has LLVM (the GPU nodes of a cluster usually do not).
#pragma once

#include <string>
#include <vector>

#include "kiln/target.h"

namespace kiln {

enum class ClangAction { object, assembly, llvm_ir };

/// cc1 arguments for the device compile of a target.
std::vector<std::string> clang_cc1_args(const TargetInfo& target, ClangAction action);
/// The key's "flags" for clang: the cc1 arguments and the link step.
std::string clang_flags(const TargetInfo& target);
/// The clang version the build uses (LLVM builds) or expects in caches (builds without LLVM;
/// CMake's KILN_CLANG_VERSION).
std::string clang_version();

}  // namespace kiln
