#include "cache/cache_key.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>

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
// A string as nlohmann's dump() writes it: printable ASCII other than '"' and '\\' as it is,
// between quotes; anything else (escapes, UTF-8 checks) through nlohmann itself.
void append_string(std::string& out, std::string_view s) {
  const bool plain = std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x20 && c <= 0x7e && c != '"' && c != '\\'; });
  if (!plain) {
    out += nlohmann::json(s).dump();
    return;
  }
  out += '"';
  out += s;
  out += '"';
}

void append_int(std::string& out, int64_t v) { fmt::format_to(std::back_inserter(out), "{}", v); }

// A map of names to integers (parameters, a tile configuration) as nlohmann dumps one: sorted
// by name, as std::map holds them.
void append_map(std::string& out, const std::map<std::string, int64_t>& m) {
  out += '{';
  bool first = true;
  for (const auto& [name, value] : m) {
    if (!first) out += ',';
    first = false;
    append_string(out, name);
    out += ':';
    append_int(out, value);
  }
  out += '}';
}
}  // namespace

std::string CacheKey::canonical() const {
  // to_json().dump(), byte for byte, written field by field without building the object (13
  // members and two nested maps allocated, filled, walked and freed: most of the key's 10 us on
  // a disk hit). nlohmann's objects are std::maps, so dump() writes the members in this sorted
  // order; spec_to_json contributes op, dtype, out_dtype and params. tests/cache/test_cache.cpp
  // (CacheKey.CanonicalTextIsTheDump) checks the two agree for every op's specs on every target
  // and for text that needs escaping. A change here that is not a change of to_json() renames
  // every entry: keep them in step (and bump kCacheFormatVersion if the key's fields change).
  std::string out;
  out.reserve(640 + flags.size());
  out += "{\"codegen_version\":";
  append_int(out, codegen_version);
  out += ",\"compiler\":";
  append_string(out, compiler);
  out += ",\"compiler_version\":";
  append_string(out, compiler_version);
  out += ",\"config\":";
  append_map(out, config);
  out += ",\"dtype\":";
  append_string(out, dtype_name(spec.dtype));
  out += ",\"flags\":";
  append_string(out, flags);
  out += ",\"format_version\":";
  append_int(out, format_version);
  out += ",\"op\":";
  append_string(out, spec.op);
  out += ",\"out_dtype\":";
  append_string(out, dtype_name(spec.out_dtype));
  out += ",\"params\":";
  append_map(out, spec.params);
  out += ",\"source_sha256\":";
  append_string(out, source_sha256);
  out += ",\"target\":";
  append_string(out, target);
  out += ",\"template_sha256\":";
  append_string(out, template_sha256);
  out += '}';
  return out;
}

std::string CacheKey::digest() const { return sha256_hex(canonical()); }

}  // namespace kiln
