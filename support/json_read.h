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
#include <stdexcept>
#include <string_view>

namespace kiln {

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
