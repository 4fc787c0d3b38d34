// Typed reads of parsed JSON for files Kiln did not necessarily write itself (cache metadata,
// tuning records): they refuse what nlohmann's get<> would convert with undefined behaviour (a
// float outside the range of an int, found by fuzz_metadata: fuzz/regressions/metadata/).
// Like nlohmann's own accessors they throw (std::invalid_argument, or nlohmann's out_of_range for
// a missing key); the parsers catch it and report the file as corrupt.
#pragma once

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <climits>
#include <cstdint>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/result.h"

namespace kiln {

/// Bounds for JSON from outside. nlohmann's parser is iterative, but dump(), comparisons and the
/// readers of the parsed value recurse: a bounded depth keeps every one of them safe.
struct JsonLimits {
  int max_depth = 64;                 ///< Deepest nesting of arrays and objects.
  bool reject_duplicate_keys = true;  ///< {"a": 1, "a": 2} is an error, not "the last one wins".
};

/// What parse_json_limited throws when the text breaks a limit (besides nlohmann's parse_error).
class JsonLimitError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Parses `text` (nlohmann, with a parser callback counting depth and keys): throws
/// nlohmann::json::parse_error for invalid JSON and JsonLimitError for a limit.
inline nlohmann::json parse_json_limited(std::string_view text, const JsonLimits& limits = {}) {
  std::vector<std::set<std::string>> keys;  // of each object being parsed
  auto callback = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if ((event == E::object_start || event == E::array_start) && depth >= limits.max_depth)
      throw JsonLimitError(fmt::format("nested deeper than {} levels", limits.max_depth));
    if (event == E::object_start) keys.emplace_back();
    if (event == E::object_end && !keys.empty()) keys.pop_back();
    if (event == E::key && limits.reject_duplicate_keys && !keys.empty() && parsed.is_string() &&
        !keys.back().insert(parsed.get<std::string>()).second) {
      std::string name;
      for (char c : parsed.get<std::string>().substr(0, 60))
        name += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
      throw JsonLimitError(fmt::format("duplicate key \"{}\"", name));
    }
    return true;
  };
  return nlohmann::json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true);
}

/// parse_json_limited as a Result: Errc::corrupt with "'<what>': <why>".
inline Result<nlohmann::json> parse_json(std::string_view text, std::string_view what, const JsonLimits& limits = {}) {
  try {
    return parse_json_limited(text, limits);
  } catch (const nlohmann::json::exception& e) {
    return make_error(Errc::corrupt, fmt::format("'{}' is not valid JSON ({})", what, e.what()));
  } catch (const std::exception& e) {
    return make_error(Errc::corrupt, fmt::format("'{}' is not valid JSON ({})", what, e.what()));
  }
}

/// An integer in the range of int64_t; `what` names it in the error.
inline int64_t json_int64(const nlohmann::json& v, std::string_view what) {
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)))
    throw std::invalid_argument(fmt::format("'{}' is not an integer", what));
  return v.get<int64_t>();
}

/// j[key], an integer in the range of int.
inline int json_int(const nlohmann::json& j, const char* key) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_integer()) throw std::invalid_argument(fmt::format("'{}' is not an integer", key));
  const int64_t x = v.get<int64_t>();
  if (x < INT32_MIN || x > INT32_MAX || (v.is_number_unsigned() && v.get<uint64_t>() > INT32_MAX))
    throw std::invalid_argument(fmt::format("'{}' is out of range", key));
  return static_cast<int>(x);
}

/// j[key], a non-negative integer.
inline uint64_t json_size(const nlohmann::json& j, const char* key) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number_unsigned()) throw std::invalid_argument(fmt::format("'{}' is not a size", key));
  return v.get<uint64_t>();
}

/// j[key], any number.
inline double json_number(const nlohmann::json& j, const char* key) {
  const nlohmann::json& v = j.at(key);
  if (!v.is_number()) throw std::invalid_argument(fmt::format("'{}' is not a number", key));
  return v.get<double>();
}

}  // namespace kiln
