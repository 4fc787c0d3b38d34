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

namespace {
// A value as nlohmann's dump() writes it (a string quoted and escaped, a number in decimal, an
// object of sorted keys), for the fields that the canonical text below spells out one by one.
template <class T>
void append_dump(std::string& out, const T& value) {
  out += nlohmann::json(value).dump();
}
}  // namespace

std::string CacheKey::canonical() const {
  // to_json().dump(), byte for byte, without building the object (13 members and two nested maps
  // allocated, filled and walked: most of the key's 10 us on a disk hit). nlohmann's objects are
  // std::maps, so dump() writes the members in this sorted order; spec_to_json contributes op,
  // dtype, out_dtype and params. tests/cache/test_cache.cpp (CacheKey.CanonicalTextIsTheDump)
  // checks the two agree for every op's specs on every target. A change here that is not a change
  // of to_json() renames every entry: keep them in step (and bump kCacheFormatVersion if the
  // key's fields change).
  const nlohmann::json spec_fields = spec_to_json(spec);
  std::string out;
  out.reserve(512 + flags.size());
  out += "{\"codegen_version\":";
  append_dump(out, codegen_version);
  out += ",\"compiler\":";
  append_dump(out, compiler);
  out += ",\"compiler_version\":";
  append_dump(out, compiler_version);
  out += ",\"config\":";
  append_dump(out, config);
  out += ",\"dtype\":";
  out += spec_fields.at("dtype").dump();
  out += ",\"flags\":";
  append_dump(out, flags);
  out += ",\"format_version\":";
  append_dump(out, format_version);
  out += ",\"op\":";
  out += spec_fields.at("op").dump();
  out += ",\"out_dtype\":";
  out += spec_fields.at("out_dtype").dump();
  out += ",\"params\":";
  out += spec_fields.at("params").dump();
  out += ",\"source_sha256\":";
  append_dump(out, source_sha256);
  out += ",\"target\":";
  append_dump(out, target);
  out += ",\"template_sha256\":";
  append_dump(out, template_sha256);
  out += "}";
  return out;
}

std::string CacheKey::digest() const { return sha256_hex(canonical()); }

}  // namespace kiln
