// libFuzzer target: the manifest parser (JSON document and JSON-lines forms). Properties: no
// crash, no sanitizer report, and a manifest that parses writes back to text that parses to the
// same kernels.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto m = kiln::parse_manifest(text, "fuzz.json");
  if (!m) return 0;
  auto again = kiln::parse_manifest(kiln::write_manifest(*m), "roundtrip.json");
  if (!again || again->kernels.size() != m->kernels.size()) __builtin_trap();
  for (size_t i = 0; i < m->kernels.size(); ++i)
    if (again->kernels[i].spec.params != m->kernels[i].spec.params || again->kernels[i].spec.op != m->kernels[i].spec.op)
      __builtin_trap();
  return 0;
}
