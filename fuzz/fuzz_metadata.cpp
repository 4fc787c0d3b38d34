// libFuzzer target: the cache entry metadata parser (meta.json), which reads files that another
// process, a crash or an attacker may have written. Property: no crash, no sanitizer report.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "cache/disk_cache.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto m = kiln::parse_entry_metadata(text, "8f3c1f0b1c2e4f7a9d6b5c4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a");
  if (m) {
    for (const auto& [name, file] : m->files)
      if (name.find('/') != std::string::npos) __builtin_trap();  // never a path outside the entry
  }
  return 0;
}
