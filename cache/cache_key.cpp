#include "cache/cache_key.h"

#include "support/sha256.h"
#include "support/spec_json.h"

namespace kiln {

CacheKey CacheKey::make(const KernelSource& src, const Compiler& compiler) {
  CacheKey k;
  k.spec = src.spec;
  k.config = src.config;
  k.target = std::string(src.target->name);
  k.compiler = std::string(compiler.name());
  k.compiler_version = compiler.version();
  k.flags = compiler.flags(*src.target);
  k.template_sha256 = src.template_sha256;
  k.source_sha256 = src.source_sha256;
  return k;
}

nlohmann::json CacheKey::to_json() const {
  nlohmann::json j = spec_to_json(spec);
  j.update(nlohmann::json{{"config", config},
                          {"target", target},
                          {"compiler", compiler},
                          {"compiler_version", compiler_version},
                          {"flags", flags},
                          {"template_sha256", template_sha256},
                          {"source_sha256", source_sha256},
                          {"codegen_version", codegen_version},
                          {"format_version", format_version}});
  return j;
}

std::string CacheKey::digest() const { return sha256_hex(to_json().dump()); }

}  // namespace kiln
