#include "kiln/ops.h"

namespace kiln::ops {

Result<void> gemm(Runtime& rt, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, DType dtype,
                  DType out_dtype, const void* A, const void* B, void* C, Stream stream) {
  const KernelSpec spec{"gemm", dtype, out_dtype, {{"M", M}, {"N", N}, {"K", K}, {"trans_a", trans_a}, {"trans_b", trans_b}}};
  void* buffers[] = {const_cast<void*>(A), const_cast<void*>(B), C};
  return rt.launch(spec, buffers, {}, stream);
}

Result<void> rmsnorm(Runtime& rt, int64_t rows, int64_t hidden, DType dtype, const void* x, const void* gamma, void* y,
                     float eps, Stream stream) {
  const KernelSpec spec{"rmsnorm", dtype, dtype, {{"rows", rows}, {"hidden", hidden}}};
  void* buffers[] = {const_cast<void*>(x), const_cast<void*>(gamma), y};
  return rt.launch(spec, buffers, {{"eps", eps}}, stream);
}

Result<void> swiglu(Runtime& rt, int64_t rows, int64_t intermediate, DType dtype, const void* x, void* y, Stream stream) {
  const KernelSpec spec{"swiglu", dtype, dtype, {{"rows", rows}, {"intermediate", intermediate}}};
  void* buffers[] = {const_cast<void*>(x), y};
  return rt.launch(spec, buffers, {}, stream);
}

}  // namespace kiln::ops
