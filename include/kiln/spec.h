// KernelSpec: the full description of one kernel request, the first stage of the pipeline
//   KernelSpec -> KernelSource (codegen) -> CodeObject (compile) -> KernelFunction -> Kernel.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "kiln/dtype.h"

namespace kiln {

/// What to build: an op, its dtypes and its integer parameters. Booleans (trans_a) are 0/1.
/// Which parameters are baked into the code and which stay runtime arguments is the op's
/// decision (see `kiln ops` and docs/ops.md); only baked ones enter the cache key.
struct KernelSpec {
  std::string op;                         ///< "gemm", "rmsnorm", "swiglu".
  DType dtype = DType::bf16;              ///< Input dtype.
  DType out_dtype = DType::bf16;          ///< Output dtype (only gemm lets it differ).
  std::map<std::string, int64_t> params;  ///< e.g. {"M": 8192, "N": 6144, "K": 4096, ...}.

  /// Convenience: the parameter or `fallback` when absent.
  int64_t param(const std::string& name, int64_t fallback = 0) const {
    auto it = params.find(name);
    return it == params.end() ? fallback : it->second;
  }
};

/// "gemm bf16->bf16 M=8192 N=6144 K=4096 trans_a=0 trans_b=1": for logs and messages.
std::string to_string(const KernelSpec& spec);

}  // namespace kiln
