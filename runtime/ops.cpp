#include "kiln/ops.h"

namespace kiln::ops {
namespace {

// A typed call's spec (and scalars), kept per thread and updated in place: after a thread's first
// call of an op, building its spec allocates nothing (the op name and the parameter map's nodes
// are reused), so a call costs a memo lookup and the launch (bench/bench_launch: TypedOp).
KernelSpec& spec_of(KernelSpec& spec, DType dtype, DType out_dtype) {
  spec.dtype = dtype;
  spec.out_dtype = out_dtype;
  return spec;
}

}  // namespace

Result<void> gemm(Runtime& rt, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, DType dtype,
                  DType out_dtype, const void* A, const void* B, void* C, Stream stream) {
  thread_local KernelSpec spec{"gemm", {}, {}, {{"M", 0}, {"N", 0}, {"K", 0}, {"trans_a", 0}, {"trans_b", 0}}};
  spec.params["M"] = M;
  spec.params["N"] = N;
  spec.params["K"] = K;
  spec.params["trans_a"] = trans_a;
  spec.params["trans_b"] = trans_b;
  void* buffers[] = {const_cast<void*>(A), const_cast<void*>(B), C};
  return rt.launch(spec_of(spec, dtype, out_dtype), buffers, {}, stream);
}

Result<void> rmsnorm(Runtime& rt, int64_t rows, int64_t hidden, DType dtype, const void* x, const void* gamma, void* y,
                     float eps, Stream stream) {
  thread_local KernelSpec spec{"rmsnorm", {}, {}, {{"rows", 0}, {"hidden", 0}}};
  thread_local std::map<std::string, float> scalars{{"eps", 0.0f}};
  spec.params["rows"] = rows;
  spec.params["hidden"] = hidden;
  scalars["eps"] = eps;
  void* buffers[] = {const_cast<void*>(x), const_cast<void*>(gamma), y};
  return rt.launch(spec_of(spec, dtype, dtype), buffers, scalars, stream);
}

Result<void> swiglu(Runtime& rt, int64_t rows, int64_t intermediate, DType dtype, const void* x, void* y, Stream stream) {
  thread_local KernelSpec spec{"swiglu", {}, {}, {{"rows", 0}, {"intermediate", 0}}};
  spec.params["rows"] = rows;
  spec.params["intermediate"] = intermediate;
  void* buffers[] = {const_cast<void*>(x), y};
  return rt.launch(spec_of(spec, dtype, dtype), buffers, {}, stream);
}

}  // namespace kiln::ops
