#include "templates/op_testing.h"

#include <fmt/format.h>

namespace kiln {

double OpTestHooks::bytes(const KernelSpec& spec) const {
  double b = 0;
  for (const TensorInfo& t : tensors(spec)) b += static_cast<double>(t.bytes());
  return b;
}

int64_t OpTestHooks::sample_dimension(const KernelSpec& spec) const {
  for (const TensorInfo& t : tensors(spec))
    if (t.output && !t.shape.empty()) return t.shape.front();
  return 0;
}

void OpTestHooks::init_inputs(const KernelSpec& /*spec*/, std::span<const TensorInfo> inputs,
                             std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  values.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const DType t = inputs[i].dtype;
    fill_random(values[i], static_cast<size_t>(inputs[i].elements()), rng, [t](std::mt19937_64& g) {
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      float v;
      do v = round_to_dtype(dist(g), t);
      while (v == 0.0f);
      return v;
    });
  }
}

std::string Gate::describe() const {
  switch (kind) {
    case Kind::tolerance:
      return max_rel_fro >= 0 ? fmt::format("|err| <= {:g} + {:g}|ref| and rel. Frobenius < {:g}", atol, rtol, max_rel_fro)
                              : fmt::format("|err| <= {:g} + {:g}|ref|", atol, rtol);
    case Kind::snr: return fmt::format("SNR > {:g} dB", min_snr_db);
    case Kind::exact:
      return max_code_diff ? fmt::format("codes equal within {} step(s)", max_code_diff) : "bitwise equal codes";
  }
  return "";
}

Gate Gate::for_dtype(DType t) {
  Gate g;
  if (t == DType::f32) {
    g.atol = g.rtol = 1e-4;
    g.max_rel_fro = -1;
  } else if (t == DType::f16 || t == DType::bf16) {
    g.atol = g.rtol = 1e-2;
    g.max_rel_fro = 1e-2;
  } else {
    g.kind = Kind::exact;
  }
  return g;
}

}  // namespace kiln
