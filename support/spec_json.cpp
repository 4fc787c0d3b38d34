#include "support/spec_json.h"

#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace kiln {

nlohmann::json spec_to_json(const KernelSpec& spec) {
  return nlohmann::json{{"op", spec.op},
                        {"dtype", std::string(dtype_name(spec.dtype))},
                        {"out_dtype", std::string(dtype_name(spec.out_dtype))},
                        {"params", nlohmann::json(spec.params)}};
}

Result<KernelSpec> spec_from_json(const nlohmann::json& j, std::string_view what) {
  auto string_field = [&](const char* name) -> const nlohmann::json* {
    if (!j.is_object()) return nullptr;
    auto it = j.find(name);
    return it != j.end() && it->is_string() ? &*it : nullptr;
  };
  const nlohmann::json* op = string_field("op");
  const nlohmann::json* dtype = string_field("dtype");
  if (!op || op->get_ref<const std::string&>().empty())
    return make_error(Errc::corrupt, fmt::format("{}: \"op\" is missing or not a non-empty string", what));
  if (!dtype) return make_error(Errc::corrupt, fmt::format("{}: \"dtype\" is missing or not a string", what));
  KernelSpec spec;
  spec.op = op->get<std::string>();
  KILN_ASSIGN_OR_RETURN(spec.dtype, parse_dtype(dtype->get<std::string>()));
  spec.out_dtype = spec.dtype;
  if (j.contains("out_dtype")) {
    const nlohmann::json* out = string_field("out_dtype");
    if (!out) return make_error(Errc::corrupt, fmt::format("{}: \"out_dtype\" is not a string", what));
    KILN_ASSIGN_OR_RETURN(spec.out_dtype, parse_dtype(out->get<std::string>()));
  }
  auto params = j.find("params");
  if (params == j.end() || !params->is_object())
    return make_error(Errc::corrupt, fmt::format("{}: \"params\" is missing or not an object", what));
  for (const auto& [k, v] : params->items()) {
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}))
      return make_error(Errc::corrupt, fmt::format("{}: params.{} is not a 64-bit integer", what, k));
    spec.params[k] = v.get<int64_t>();
  }
  return spec;
}

}  // namespace kiln
