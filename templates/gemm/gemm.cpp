#include "templates/gemm/gemm.h"

#include <fmt/format.h>

#include "support/embedded.h"

namespace kiln {
namespace {
constexpr int64_t kMaxDim = int64_t{1} << 24;
// The grid is (ceil(N / BN), ceil(M / BM)); grid.y is limited to 65535 blocks on both vendors.
constexpr int64_t kMaxGridY = 65535;

const ParamInfo kParams[] = {
    {"M", "rows of C and of op(A)", true, false, 1, kMaxDim},
    {"N", "columns of C and of op(B)", true, false, 1, kMaxDim},
    {"K", "reduction dimension", true, false, 1, kMaxDim},
    {"trans_a", "A is stored [K,M] (wgrad: TN)", true, true, 0, 1},
    {"trans_b", "B is stored [N,K] (forward: NT)", true, true, 0, 1},
};
const DType kDTypes[] = {DType::bf16, DType::f16, DType::f32};
}  // namespace

std::span<const ParamInfo> GemmOp::params() const { return kParams; }
std::span<const DType> GemmOp::dtypes() const { return kDTypes; }
std::string_view GemmOp::device_template() const { return embedded_file("templates/gemm/gemm.kernel"); }

Result<void> GemmOp::check(const KernelSpec& spec, const TargetInfo&) const {
  const int64_t M = spec.param("M");
  if (ceil_div(M, 64) > kMaxGridY)
    return make_error(Errc::invalid_argument,
                      fmt::format("gemm: M = {} needs more than {} row blocks; split M into GEMMs "
                                  "of at most {} rows",
                                  M, kMaxGridY, kMaxGridY * 64));
  return ok();
}

TileConfig GemmOp::choose_config(const KernelSpec& spec, const TargetInfo& target) const {
  const int64_t M = spec.param("M"), N = spec.param("N");
  // Large tiles (128x128, an 8x8 register tile per thread) reuse each staged element 128 times;
  // use them when they still give every compute unit a block, else 64x64 with 4x4 per thread.
  const int64_t big_tiles = ceil_div(M, 128) * ceil_div(N, 128);
  const bool big = big_tiles >= target.compute_units && ceil_div(M, 128) <= kMaxGridY;
  const int64_t bm = big ? 128 : 64, bn = bm, tm = big ? 8 : 4, tn = tm;
  return {{"BM", bm}, {"BN", bn}, {"BK", 16}, {"TM", tm}, {"TN", tn},
          {"THREADS", (bm / tm) * (bn / tn)}};
}

std::string GemmOp::specialize(const KernelSpec& spec, const TileConfig& c) const {
  return fmt::format(
      "constexpr long long M = {}, N = {}, K = {};\n"
      "constexpr bool TRANS_A = {}, TRANS_B = {};\n"
      "constexpr int BM = {}, BN = {}, BK = {}, TM = {}, TN = {}, THREADS = {};\n"
      "typedef {} in_t;\ntypedef {} out_t;\n",
      spec.param("M"), spec.param("N"), spec.param("K"), spec.param("trans_a") ? "true" : "false",
      spec.param("trans_b") ? "true" : "false", c.at("BM"), c.at("BN"), c.at("BK"), c.at("TM"),
      c.at("TN"), c.at("THREADS"), device_type_name(spec.dtype), device_type_name(spec.out_dtype));
}

LaunchGeometry GemmOp::geometry(const KernelSpec& spec, const TileConfig& c) const {
  LaunchGeometry g;
  g.grid.x = static_cast<uint32_t>(ceil_div(spec.param("N"), c.at("BN")));
  g.grid.y = static_cast<uint32_t>(ceil_div(spec.param("M"), c.at("BM")));
  g.block.x = static_cast<uint32_t>(c.at("THREADS"));
  return g;
}

std::vector<TensorInfo> GemmOp::tensors(const KernelSpec& spec) const {
  const int64_t M = spec.param("M"), N = spec.param("N"), K = spec.param("K");
  return {
      {"A", spec.dtype, spec.param("trans_a") ? std::vector<int64_t>{K, M} : std::vector<int64_t>{M, K}, false},
      {"B", spec.dtype, spec.param("trans_b") ? std::vector<int64_t>{N, K} : std::vector<int64_t>{K, N}, false},
      {"C", spec.out_dtype, {M, N}, true},
  };
}

void GemmOp::reference(const KernelSpec& spec, const Scalars&,
                       std::span<const std::vector<float>> inputs, std::span<const int64_t> rows,
                       std::vector<double>& out) const {
  const int64_t M = spec.param("M"), N = spec.param("N"), K = spec.param("K");
  const bool ta = spec.param("trans_a") != 0, tb = spec.param("trans_b") != 0;
  const std::vector<float>& A = inputs[0];
  const std::vector<float>& B = inputs[1];
  const int64_t count = rows.empty() ? M : static_cast<int64_t>(rows.size());
  out.assign(static_cast<size_t>(count * N), 0.0);
  std::vector<double> a(static_cast<size_t>(K));
  for (int64_t r = 0; r < count; ++r) {
    const int64_t m = rows.empty() ? r : rows[r];
    for (int64_t k = 0; k < K; ++k) a[k] = ta ? A[k * M + m] : A[m * K + k];
    double* c = &out[static_cast<size_t>(r * N)];
    if (tb) {
      for (int64_t n = 0; n < N; ++n) {
        const float* b = &B[static_cast<size_t>(n * K)];
        double s = 0.0;
        for (int64_t k = 0; k < K; ++k) s += a[k] * b[k];
        c[n] = s;
      }
    } else {
      for (int64_t k = 0; k < K; ++k) {
        const float* b = &B[static_cast<size_t>(k * N)];
        for (int64_t n = 0; n < N; ++n) c[n] += a[k] * b[n];
      }
    }
  }
}

}  // namespace kiln
