// Typed entry points for Kiln's ops: build the spec, find (or compile) the kernel, launch it.
// Shapes are row-major; pointers are device pointers; `stream` is a CUstream / hipStream_t.
#pragma once

#include "kiln/runtime.h"

namespace kiln::ops {

/// C[M,N] = op(A) @ op(B) with fp32 accumulation. A is [M,K] ([K,M] if trans_a), B is [K,N]
/// ([N,K] if trans_b), C is [M,N]; A and B in `dtype`, C in `out_dtype`.
/// Forward y = x @ W^T: trans_b; dgrad dx = dy @ W: neither; wgrad dW = dy^T @ x: trans_a.
Result<void> gemm(Runtime& rt, int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, DType dtype,
                  DType out_dtype, const void* A, const void* B, void* C, Stream stream = nullptr);

/// y[rows, hidden] = x / sqrt(mean(x^2) + eps) * gamma[hidden]; x, gamma, y in `dtype`.
Result<void> rmsnorm(Runtime& rt, int64_t rows, int64_t hidden, DType dtype, const void* x, const void* gamma,
                     void* y, float eps = 1e-5f, Stream stream = nullptr);

/// y[rows, I] = silu(x[:, :I]) * x[:, I:]; x is [rows, 2*I] (gate | up); x, y in `dtype`.
Result<void> swiglu(Runtime& rt, int64_t rows, int64_t intermediate, DType dtype, const void* x, void* y,
                    Stream stream = nullptr);

}  // namespace kiln::ops
