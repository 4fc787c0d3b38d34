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

/// Builds the value of a JSON text from nlohmann's SAX events (nlohmann lexes and parses; this
/// only assembles the result), refusing what breaks `limits`: a container opened at depth
/// `max_depth` and a key already present in its object, found by the insertion itself. It
/// replaces a parser callback (json::parse with a std::function and a set of keys per object),
/// which took 20 us of a 1.8 KB meta.json against 12 us here (bench_disk_hit's MetaJson).
class LimitedJsonBuilder {
 public:
  using json = nlohmann::json;
  LimitedJsonBuilder(json& root, const JsonLimits& limits) : root_(root), limits_(limits) {}

  bool null() { return put(nullptr); }
  bool boolean(bool v) { return put(v); }
  bool number_integer(json::number_integer_t v) { return put(v); }
  bool number_unsigned(json::number_unsigned_t v) { return put(v); }
  bool number_float(json::number_float_t v, const json::string_t&) { return put(v); }
  bool string(json::string_t& v) { return put(std::move(v)); }
  bool binary(json::binary_t& v) { return put(json::binary(std::move(v))); }
  bool start_object(std::size_t) { return open(json::value_t::object); }
  bool start_array(std::size_t) { return open(json::value_t::array); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(json::string_t& k) {
    auto& object = stack_.back()->get_ref<json::object_t&>();
    auto [it, inserted] = object.try_emplace(std::move(k));  // `k` is left alone when present
    if (!inserted && limits_.reject_duplicate_keys) {
      std::string name;
      for (char c : k.substr(0, 60)) name += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
      throw JsonLimitError(fmt::format("duplicate key \"{}\"", name));
    }
    slot_ = &it->second;  // where duplicates are allowed, the last value wins, as in json::parse
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& ex) {
    throw ex;  // nlohmann's parse_error (or out_of_range), as json::parse throws it
  }

 private:
  json* place() {
    if (stack_.empty()) return &root_;
    json& top = *stack_.back();
    if (top.is_array()) {
      top.get_ref<json::array_t&>().emplace_back();
      return &top.get_ref<json::array_t&>().back();
    }
    return slot_;
  }
  template <class V>
  bool put(V&& v) {
    *place() = json(std::forward<V>(v));
    return true;
  }
  bool open(json::value_t type) {
    if (static_cast<int>(stack_.size()) >= limits_.max_depth)
      throw JsonLimitError(fmt::format("nested deeper than {} levels", limits_.max_depth));
    json* at = place();
    *at = json(type);
    stack_.push_back(at);
    return true;
  }
  bool close() {
    stack_.pop_back();
    return true;
  }

  json& root_;
  const JsonLimits& limits_;
  std::vector<json*> stack_;  ///< The open containers, innermost last.
  json* slot_ = nullptr;      ///< The member named by the last key.
};

/// Parses `text` (nlohmann's SAX parser into LimitedJsonBuilder): throws
/// nlohmann::json::parse_error for invalid JSON and JsonLimitError for a limit.
inline nlohmann::json parse_json_limited(std::string_view text, const JsonLimits& limits = {}) {
  nlohmann::json root;
  LimitedJsonBuilder builder(root, limits);
  nlohmann::json::sax_parse(text.begin(), text.end(), &builder);
  return root;
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
