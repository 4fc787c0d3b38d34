#include "templates/op_codegen.h"

#include <fmt/format.h>

namespace kiln {

std::vector<uint32_t> OpCodegen::base_alignment(const KernelSpec& spec, const KernelConfig&) const {
  return std::vector<uint32_t>(tensors(spec).size(), 1);
}

std::vector<uint32_t> vector_variant_alignment(const KernelConfig& config, size_t tensors,
                                               std::initializer_list<size_t> scalar_tensors) {
  auto vec = config.find("VEC");
  std::vector<uint32_t> out(tensors, vec != config.end() && vec->second > 1 ? 16 : 1);
  for (size_t i : scalar_tensors)
    if (i < tensors) out[i] = 1;
  return out;
}

Launch OpCodegen::single_launch(const KernelSpec& call, const KernelConfig& config, LaunchGeometry geometry) const {
  Launch l;
  l.kernel = std::string(kernel_name(config));
  l.geometry = geometry;
  const size_t n = tensors(call).size();
  for (size_t i = 0; i < n; ++i) l.args.push_back(KernelArg::tensor(static_cast<uint32_t>(i)));
  for (const ParamInfo& p : params())
    if (!p.baked) l.args.push_back(KernelArg::i32(call.param(std::string(p.name))));
  for (size_t i = 0; i < scalars().size(); ++i) l.args.push_back(KernelArg::scalar(static_cast<uint32_t>(i)));
  return l;
}

std::string config_string(const KernelConfig& config) {
  std::string out;
  for (const auto& [k, v] : config) out += fmt::format("{}{}={}", out.empty() ? "" : " ", k, v);
  return out;
}

}  // namespace kiln
