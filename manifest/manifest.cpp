// Kernel manifests: parse (nlohmann::json), validate against targets, write.
#include "kiln/manifest.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "support/fs.h"
#include "templates/lib/fp8_scaling.h"
#include "templates/registry.h"
#include "support/json_read.h"

namespace kiln {
namespace {

using json = nlohmann::json;

/// The largest manifest read: 64 MiB (a recording of every spec of a long job is a few MiB).
constexpr uint64_t kMaxManifestBytes = uint64_t{64} << 20;

/// A manifest nests 4 levels ({"kernels": [{"params": {...}}]}); 32 leaves room and bounds every
/// recursion over the parsed value (dump() in messages, comparisons).
constexpr JsonLimits kLimits{32, true};
constexpr std::string_view kKernelFields[] = {"op", "dtype", "out_dtype", "label", "params"};
constexpr std::string_view kTopFields[] = {"model", "kernels"};

template <class Range>
std::string join(const Range& items, std::string_view sep = ", ") {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += sep;
    out += item;
  }
  return out;
}

std::string op_names() {
  std::vector<std::string> names;
  for (const OpTemplate* op : all_ops()) names.emplace_back(op->name());
  return join(names);
}

/// A JSON value as the user wrote it, shortened and with control characters escaped, for
/// "got ..." in messages.
std::string shown(const json& v) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return printable(s);
}

bool is_comment(const std::string& key) { return !key.empty() && key[0] == '_'; }

/// The position in nlohmann's parse_error text ("line 4, column 7: syntax error ..."): line in
/// [1], column in [2], the message in the match's suffix. The pattern ends at the position:
/// libstdc++'s regex matches a trailing (.*) by one recursion per character, and the message
/// quotes the last token read (a long one of a hostile manifest overflowed the stack:
/// fuzz/regressions/manifest/).
const std::regex& error_position() {
  static const std::regex at(R"(line (\d+), column (\d+): )");
  return at;
}

/// "line 4, column 7: invalid JSON (...)" out of a parse_error.
std::string parse_error_text(const json::parse_error& e) {
  const std::string what = e.what();
  std::smatch m;
  if (std::regex_search(what, m, error_position()))
    return fmt::format("line {}, column {}: invalid JSON ({})", m[1].str(), m[2].str(), m.suffix().str());
  // No position in the message: fall back to the byte offset.
  const std::string detail = what.substr(std::min(what.size(), what.find("] ") + 2));
  return fmt::format("byte {}: invalid JSON ({})", e.byte, detail);
}

/// `where` is "kernel 3" (document form) or "line 4" (JSON lines).
Error kernel_error(Errc code, std::string_view source, std::string_view where, std::string_view message) {
  return make_error(code, fmt::format("'{}': {}: {}", source, where, message));
}

Result<int64_t> param_value(const json& v, const ParamInfo& p, std::string_view source, std::string_view where) {
  if (v.is_boolean()) return v.get<bool>() ? int64_t{1} : int64_t{0};
  if (v.is_string() && !p.choices.empty()) {  // an enumerated parameter by name ("block1x128")
    const std::string name = v.get<std::string>();
    for (size_t i = 0; i < p.choices.size(); ++i)
      if (p.choices[i] == name) return static_cast<int64_t>(i);
    return kernel_error(Errc::invalid_argument, source, where,
                        fmt::format("params.{} = {} is not one of: {}", p.name, shown(v), join(p.choices)));
  }
  if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<int64_t>();
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return kernel_error(Errc::invalid_argument, source, where,
                          fmt::format("params.{} = {} is too large; it must be in [{}, {}]", p.name, u,
                                      p.min_value, p.max_value));
    return static_cast<int64_t>(u);
  }
  return kernel_error(Errc::corrupt, source, where,
                      p.is_bool             ? fmt::format("params.{} must be true or false (got {})", p.name, shown(v))
                      : !p.choices.empty() ? fmt::format("params.{} must be one of: {}, or an integer (got {})", p.name,
                                                         join(p.choices), shown(v))
                                           : fmt::format("params.{} must be an integer (got {})", p.name, shown(v)));
}

Result<ManifestEntry> parse_kernel(const json& k, std::string_view source, std::string_view where) {
  if (!k.is_object())
    return kernel_error(Errc::corrupt, source, where,
                        fmt::format("must be an object like {{\"op\": \"gemm\", \"dtype\": \"bf16\", "
                                    "\"params\": {{...}}}} (got {})",
                                    shown(k)));
  for (const auto& [key, value] : k.items()) {
    if (is_comment(key)) continue;
    if (std::find(std::begin(kKernelFields), std::end(kKernelFields), key) == std::end(kKernelFields))
      return kernel_error(Errc::corrupt, source, where,
                          fmt::format("unknown field '{}' (fields: {})", printable(key, 60), join(kKernelFields)));
  }
  ManifestEntry entry;
  // op
  auto op_it = k.find("op");
  if (op_it == k.end())
    return kernel_error(Errc::corrupt, source, where, fmt::format("missing field \"op\" (one of: {})", op_names()));
  if (!op_it->is_string())
    return kernel_error(Errc::corrupt, source, where,
                        fmt::format("op must be a string, one of: {} (got {})", op_names(), shown(*op_it)));
  entry.spec.op = op_it->get<std::string>();
  auto op = find_op(entry.spec.op);
  if (!op) return kernel_error(Errc::not_found, source, where, op.error().message);
  // dtype, out_dtype
  auto dt_it = k.find("dtype");
  if (dt_it == k.end())
    return kernel_error(Errc::corrupt, source, where, "missing field \"dtype\" (one of: bf16, fp16, fp32)");
  if (!dt_it->is_string())
    return kernel_error(Errc::corrupt, source, where,
                        fmt::format("dtype must be a string, one of: bf16, fp16, fp32 (got {})", shown(*dt_it)));
  auto dtype = parse_dtype(dt_it->get<std::string>());
  if (!dtype) return kernel_error(Errc::not_found, source, where, dtype.error().message);
  entry.spec.dtype = entry.spec.out_dtype = *dtype;
  if (auto it = k.find("out_dtype"); it != k.end()) {
    if (!it->is_string())
      return kernel_error(Errc::corrupt, source, where,
                          fmt::format("out_dtype must be a string, one of: bf16, fp16, fp32 (got {})", shown(*it)));
    auto out = parse_dtype(it->get<std::string>());
    if (!out) return kernel_error(Errc::not_found, source, where, "out_dtype: " + out.error().message);
    entry.spec.out_dtype = *out;
  }
  // label
  if (auto it = k.find("label"); it != k.end()) {
    if (!it->is_string())
      return kernel_error(Errc::corrupt, source, where, fmt::format("label must be a string (got {})", shown(*it)));
    entry.label = it->get<std::string>();
  }
  // params
  std::vector<std::string> param_names;
  for (const ParamInfo& p : (*op)->params()) param_names.emplace_back(p.name);
  auto params_it = k.find("params");
  if (params_it == k.end())
    return kernel_error(Errc::corrupt, source, where,
                        fmt::format("missing field \"params\" ({} takes: {})", entry.spec.op, join(param_names)));
  if (!params_it->is_object())
    return kernel_error(Errc::corrupt, source, where,
                        fmt::format("params must be an object like {{\"{}\": ...}} (got {})", param_names.front(),
                                    shown(*params_it)));
  for (const auto& [key, value] : params_it->items()) {
    auto ps = (*op)->params();
    auto p = std::find_if(ps.begin(), ps.end(), [&](const ParamInfo& i) { return i.name == key; });
    if (p == ps.end())
      return kernel_error(Errc::invalid_argument, source, where,
                          fmt::format("unknown parameter params.{}; {} takes: {}", printable(key, 60), entry.spec.op,
                                      join(param_names)));
    KILN_ASSIGN_OR_RETURN(entry.spec.params[key], param_value(value, *p, source, where));
  }
  for (const ParamInfo& p : (*op)->params())
    if (!entry.spec.params.count(std::string(p.name)) && !p.default_value)
      return kernel_error(Errc::invalid_argument, source, where,
                          fmt::format("missing params.{} ({})", p.name, p.doc));
  return entry;
}

/// The non-blank lines of `text`, with their 1-based numbers, trailing '\r' and blanks removed.
std::vector<std::pair<size_t, std::string_view>> content_lines(std::string_view text) {
  std::vector<std::pair<size_t, std::string_view>> lines;
  size_t number = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    ++number;
    pos = end + 1;
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.remove_suffix(1);
    while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front()))) line.remove_prefix(1);
    if (!line.empty()) lines.emplace_back(number, line);
  }
  return lines;
}

/// The rule of manifest.h: the first non-blank line is, on its own, an object with "op" and no
/// "kernels".
bool is_json_lines(std::string_view text) {
  const size_t start = text.find_first_not_of(" \t\r\n");
  if (start == std::string_view::npos || text[start] != '{') return false;
  std::string_view first = text.substr(start, text.find('\n', start) - start);
  try {
    const json j = parse_json_limited(first, kLimits);
    return j.is_object() && j.contains("op") && !j.contains("kernels");
  } catch (const std::exception&) {
    return false;
  }
}

/// "column 7: ..." of a parse error of one line, for "line N, column 7: invalid JSON (...)".
std::string line_parse_error(std::string_view line, size_t number) {
  try {
    const json parsed = parse_json_limited(line, kLimits);
    (void)parsed;
  } catch (const JsonLimitError& e) {
    return fmt::format("line {}: {}", number, e.what());
  } catch (const json::parse_error& e) {
    const std::string what = e.what();
    std::smatch m;
    if (std::regex_search(what, m, error_position()))
      return fmt::format("line {}, column {}: invalid JSON ({})", number, m[2].str(), m.suffix().str());
    return fmt::format("line {}: invalid JSON ({})", number, what.substr(std::min(what.size(), what.find("] ") + 2)));
  } catch (const std::exception& e) {
    return fmt::format("line {}: invalid JSON ({})", number, e.what());
  }
  return fmt::format("line {}: invalid JSON", number);
}

/// Identity of a kernel for de-duplication: op, dtypes and parameters (not the label).
std::string spec_identity(const KernelSpec& spec) {
  std::string id = fmt::format("{}|{}|{}", spec.op, dtype_name(spec.dtype), dtype_name(spec.out_dtype));
  for (const auto& [k, v] : spec.params) id += fmt::format("|{}={}", k, v);
  return id;
}

Result<Manifest> parse_json_lines(std::string_view text, std::string_view source) {
  Manifest m;
  const auto lines = content_lines(text);
  std::set<std::string> seen;
  for (size_t i = 0; i < lines.size(); ++i) {
    const auto& [number, line] = lines[i];
    json k;
    bool bad = false;
    try {
      k = parse_json_limited(line, kLimits);
    } catch (const std::exception&) {
      bad = true;
    }
    if (bad) {
      if (i + 1 == lines.size()) {
        m.warnings.push_back(fmt::format("'{}': line {}: skipped the last line, which is not complete JSON (a "
                                         "process killed while recording it?)",
                                         source, number));
        break;
      }
      return make_error(Errc::corrupt, fmt::format("'{}': {}", source, line_parse_error(line, number)));
    }
    KILN_ASSIGN_OR_RETURN(ManifestEntry entry, parse_kernel(k, source, fmt::format("line {}", number)));
    entry.line = number;
    if (!seen.insert(spec_identity(entry.spec)).second) {
      ++m.duplicates;
      continue;
    }
    m.kernels.push_back(std::move(entry));
  }
  return m;
}

}  // namespace

Result<Manifest> parse_manifest(std::string_view text, std::string_view source) {
  if (is_json_lines(text)) return parse_json_lines(text, source);
  if (text.size() > kMaxManifestBytes)
    return make_error(Errc::corrupt, fmt::format("'{}': {} bytes, over the limit of {} bytes for a manifest", source,
                                                 text.size(), kMaxManifestBytes));
  json doc;
  try {
    doc = parse_json_limited(text, kLimits);
  } catch (const JsonLimitError& e) {
    return make_error(Errc::corrupt, fmt::format("'{}': invalid manifest: {}", source, e.what()));
  } catch (const json::parse_error& e) {
    return make_error(Errc::corrupt, fmt::format("'{}': {}", source, parse_error_text(e)));
  } catch (const std::exception& e) {
    return make_error(Errc::corrupt, fmt::format("'{}': invalid JSON ({})", source, e.what()));
  }
  if (!doc.is_object())
    return make_error(Errc::corrupt,
                      fmt::format("'{}': a manifest is a JSON object {{\"model\": ..., \"kernels\": [...]}} "
                                  "(got {})",
                                  source, shown(doc)));
  for (const auto& [key, value] : doc.items()) {
    if (is_comment(key)) continue;
    if (std::find(std::begin(kTopFields), std::end(kTopFields), key) == std::end(kTopFields))
      return make_error(Errc::corrupt,
                        fmt::format("'{}': unknown top-level field '{}' (fields: {})", source, printable(key, 60),
                                    join(kTopFields)));
  }
  Manifest m;
  if (auto it = doc.find("model"); it != doc.end()) {
    if (!it->is_string())
      return make_error(Errc::corrupt, fmt::format("'{}': \"model\" must be a string (got {})", source, shown(*it)));
    m.model = it->get<std::string>();
  }
  if (auto it = doc.find("_about"); it != doc.end() && it->is_string()) m.about = it->get<std::string>();
  auto kernels = doc.find("kernels");
  if (kernels == doc.end())
    return make_error(Errc::corrupt,
                      fmt::format("'{}': missing field \"kernels\": an array of kernels like {{\"op\": \"gemm\", "
                                  "\"dtype\": \"bf16\", \"params\": {{...}}}}",
                                  source));
  if (!kernels->is_array())
    return make_error(Errc::corrupt,
                      fmt::format("'{}': \"kernels\" must be an array (got {})", source, shown(*kernels)));
  m.kernels.reserve(kernels->size());
  for (size_t i = 0; i < kernels->size(); ++i) {
    KILN_ASSIGN_OR_RETURN(ManifestEntry entry, parse_kernel((*kernels)[i], source, fmt::format("kernel {}", i)));
    m.kernels.push_back(std::move(entry));
  }
  return m;
}

Result<Manifest> read_manifest(const std::string& path) {
  // A regular file (or '-', standard input), never more than the manifest limit: /dev/zero, a
  // FIFO or a directory is refused at once, not read without bound.
  if (path == "-") {
    auto text = read_fd(STDIN_FILENO, "-", kMaxManifestBytes);
    if (!text) return make_error(Errc::io_error, fmt::format("cannot read the manifest from standard input: {}",
                                                             text.error().message));
    return parse_manifest(*text, "<stdin>");
  }
  OpenedFile f = open_regular_at(AT_FDCWD, path.c_str(), O_RDONLY, /*follow=*/true);
  if (f.not_regular)
    return make_error(Errc::io_error, fmt::format("cannot read manifest '{}': it is {}; give a regular file, or - for "
                                                  "standard input",
                                                  path, S_ISDIR(f.st.st_mode) ? "a directory" : "not a regular file"));
  if (!f.ok()) {
    errno = f.err;
    return make_error(Errc::io_error, "cannot read manifest " + errno_message(path));
  }
  auto text = read_fd(f.fd.get(), path, kMaxManifestBytes);
  if (!text) return make_error(Errc::io_error, fmt::format("cannot read manifest '{}': {}", path, text.error().message));
  return parse_manifest(*text, path);
}

KernelSpec manifest_spec_for_target(const KernelSpec& spec, const TargetInfo& target) {
  KernelSpec out = spec;
  out.dtype = fp8_for_target(spec.dtype, target);
  out.out_dtype = fp8_for_target(spec.out_dtype, target);
  // A fused fp8 output (rmsnorm, swiglu and their backward ops) names its format by value.
  if (auto it = out.params.find("fp8_out"); it != out.params.end() && it->second > 0 &&
                                            it->second < static_cast<int64_t>(fp8_out_names().size()))
    it->second = fp8_out_value(fp8_for_target(fp8_out_dtype(out), target));
  return out;
}

Result<void> validate_manifest(const Manifest& manifest, std::span<const TargetInfo* const> targets,
                               std::string_view source) {
  for (size_t i = 0; i < manifest.kernels.size(); ++i) {
    const ManifestEntry& e = manifest.kernels[i];
    std::string where = e.line ? fmt::format("line {}", e.line) : fmt::format("kernel {}", i);
    if (!e.label.empty()) where += fmt::format(" ({})", printable(e.label, 80));
    auto op = find_op(e.spec.op);
    if (!op) return make_error(Errc::not_found, fmt::format("'{}': {}: {}", source, where, op.error().message));
    std::optional<Error> first;
    std::vector<std::string> failing;
    for (const TargetInfo* t : targets) {
      auto r = (*op)->validate(manifest_spec_for_target(e.spec, *t), *t);
      if (r) continue;
      if (!first) first = r.error();
      failing.emplace_back(t->name);
    }
    if (!first) continue;
    std::string msg = fmt::format("'{}': {}: {}", source, where, first->message);
    if (failing.size() < targets.size()) msg += fmt::format(" (for {})", join(failing));
    return make_error(first->code, std::move(msg));
  }
  return ok();
}

std::string write_manifest(const Manifest& m) {
  std::string out = "{\n";
  if (!m.about.empty()) out += fmt::format("  \"_about\": {},\n", json(m.about).dump());
  if (!m.model.empty()) out += fmt::format("  \"model\": {},\n", json(m.model).dump());
  out += "  \"kernels\": [";
  for (size_t i = 0; i < m.kernels.size(); ++i) {
    const ManifestEntry& e = m.kernels[i];
    std::string line = fmt::format("{{\"op\": {}, \"dtype\": \"{}\"", json(e.spec.op).dump(), dtype_name(e.spec.dtype));
    // out_dtype written when it differs, or when the op lets it differ (gemm), so the file says it.
    auto lets_differ = [&] {
      auto op = find_op(e.spec.op);
      if (!op) return false;
      for (DType t : kAllDTypes)
        if (t != e.spec.dtype && (*op)->supports_out_dtype(e.spec.dtype, t)) return true;
      return false;
    };
    if (e.spec.out_dtype != e.spec.dtype || lets_differ())
      line += fmt::format(", \"out_dtype\": \"{}\"", dtype_name(e.spec.out_dtype));
    if (!e.label.empty()) line += fmt::format(", \"label\": {}", json(e.label).dump());
    // Parameters in the op's order (booleans as true/false), then any the op does not know.
    std::vector<std::string> params;
    std::map<std::string, int64_t> rest = e.spec.params;
    if (auto op = find_op(e.spec.op)) {
      for (const ParamInfo& p : (*op)->params()) {
        auto it = rest.find(std::string(p.name));
        if (it == rest.end()) continue;
        const bool named = it->second >= 0 && static_cast<size_t>(it->second) < p.choices.size();
        params.push_back(p.is_bool && (it->second == 0 || it->second == 1)
                             ? fmt::format("\"{}\": {}", p.name, it->second ? "true" : "false")
                         : named ? fmt::format("\"{}\": {}", p.name, json(std::string(p.choices[it->second])).dump())
                                 : fmt::format("\"{}\": {}", p.name, it->second));
        rest.erase(it);
      }
    }
    for (const auto& [k, v] : rest) params.push_back(fmt::format("{}: {}", json(k).dump(), v));
    line += fmt::format(", \"params\": {{{}}}}}", join(params));
    out += fmt::format("{}\n    {}", i ? "," : "", line);
  }
  out += m.kernels.empty() ? "]\n}\n" : "\n  ]\n}\n";
  return out;
}

}  // namespace kiln
