#include "kiln/ops.h"

namespace kiln::ops {
namespace {

// A typed call's spec (and scalars), kept per thread and updated in place: after a thread's first
// call of an op, building its spec allocates nothing (the op name and the parameter map's nodes
// are reused), so a call costs a memo lookup and the launch (bench/bench_launch: TypedOp). The
// values are written through references to the map's nodes, which never move: no lookup by name
// on each call (two of them were most of ops::swiglu's time over Runtime::launch).
KernelSpec& spec_of(KernelSpec& spec, DType dtype, DType out_dtype) {
  spec.dtype = dtype;
  spec.out_dtype = out_dtype;
  return spec;
}

}  // namespace

Result<void> gemm(Runtime& rt, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, DType dtype,
                  DType out_dtype, const void* A, const void* B, void* C, Stream stream) {
  thread_local KernelSpec spec{"gemm", {}, {}, {{"M", 0}, {"N", 0}, {"K", 0}, {"trans_a", 0}, {"trans_b", 0}}};
  thread_local int64_t *m = &spec.params.at("M"), *n = &spec.params.at("N"), *k = &spec.params.at("K"),
                       *ta = &spec.params.at("trans_a"), *tb = &spec.params.at("trans_b");
  *m = M;
  *n = N;
  *k = K;
  *ta = trans_a;
  *tb = trans_b;
  void* buffers[] = {const_cast<void*>(A), const_cast<void*>(B), C};
  return rt.launch(spec_of(spec, dtype, out_dtype), buffers, {}, stream);
}

Result<void> rmsnorm(Runtime& rt, int64_t rows, int64_t hidden, DType dtype, const void* x, const void* gamma, void* y,
                     float eps, Stream stream) {
  thread_local KernelSpec spec{"rmsnorm", {}, {}, {{"rows", 0}, {"hidden", 0}}};
  thread_local std::map<std::string, float> scalars{{"eps", 0.0f}};
  thread_local int64_t *rows_value = &spec.params.at("rows"), *hidden_value = &spec.params.at("hidden");
  thread_local float* eps_value = &scalars.at("eps");
  *rows_value = rows;
  *hidden_value = hidden;
  *eps_value = eps;
  void* buffers[] = {const_cast<void*>(x), const_cast<void*>(gamma), y};
  return rt.launch(spec_of(spec, dtype, dtype), buffers, scalars, stream);
}

Result<void> swiglu(Runtime& rt, int64_t rows, int64_t intermediate, DType dtype, const void* x, void* y, Stream stream) {
  thread_local KernelSpec spec{"swiglu", {}, {}, {{"rows", 0}, {"intermediate", 0}}};
  thread_local int64_t *rows_value = &spec.params.at("rows"), *intermediate_value = &spec.params.at("intermediate");
  *rows_value = rows;
  *intermediate_value = intermediate;
  void* buffers[] = {const_cast<void*>(x), y};
  return rt.launch(spec_of(spec, dtype, dtype), buffers, {}, stream);
}

}  // namespace kiln::ops
