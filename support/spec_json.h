// The JSON form of a KernelSpec, one codec for every place that writes or reads it: KILN_RECORD's
// lines (runtime/recorder.cpp), the key fields of a cache entry (cache/cache_key.h, meta.json) and of a
// tuning record (cache/tuning.h), `kiln prewarm --json`'s rows, and `kiln cache verify --fix`, which
// rebuilds an entry's spec from its meta.json. Manifests (kiln/manifest.h) read the same four fields
// with their own parser, which validates them against the op and names choices.
//   {"op": "gemm", "dtype": "bf16", "out_dtype": "bf16", "params": {"K": 4096, "M": 8192, ...}}
// Cache keys hash this form: changing it changes every key (bump kCacheFormatVersion with it).
#pragma once

#include <nlohmann/json.hpp>

#include <string_view>

#include "kiln/result.h"
#include "kiln/spec.h"

namespace kiln {

/// The spec as the object above (params in name order, dtypes by dtype_name).
nlohmann::json spec_to_json(const KernelSpec& spec);

/// The spec of such an object: "op" and "dtype" strings, "out_dtype" (optional: dtype), "params"
/// an object of integers; other fields are ignored. Neither the op nor its parameters are checked
/// against the registry. Errors: Errc::corrupt naming `what` ("meta.json's key fields") and the
/// field that is missing or malformed; Errc::invalid_argument for an unknown dtype name.
Result<KernelSpec> spec_from_json(const nlohmann::json& j, std::string_view what);

}  // namespace kiln
