// Helpers shared by the kiln commands.
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>

#include "support/env.h"
#include "templates/registry.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {

Globals& globals() {
  static Globals g;
  return g;
}

std::string first_line(std::string_view message) {
  std::string_view line = message.substr(0, message.find('\n'));
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.remove_suffix(1);
  return std::string(line);
}

int fail(std::string_view message, int exit_code) {
  std::string line = first_line(message);
  if (line.empty()) line = "failed (no message)";
  std::fflush(stdout);
  fmt::print(stderr, "kiln: error: {}\n", line);
  if (globals().verbose) {
    const size_t nl = message.find('\n');
    if (nl != std::string_view::npos) fmt::print(stderr, "{}\n", message.substr(nl + 1));
  }
  return exit_code;
}

void warn(std::string_view message) {
  std::fflush(stdout);
  fmt::print(stderr, "kiln: warning: {}\n", first_line(message));
}

void add_cache_dir_option(CLI::App& cmd, std::string& dir) {
  cmd.add_option("--cache-dir", dir,
                 "Cache directory (default: $KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln)");
}

void add_nvidia_compiler_option(CLI::App& cmd, std::string& compiler) {
  cmd.add_option("--nvidia-compiler", compiler,
                 "Compiler for NVIDIA targets: nvrtc or clang (default: $KILN_NVIDIA_COMPILER, else nvrtc)")
      ->check(CLI::IsMember({"nvrtc", "clang"}));
}

std::string cache_root(const std::string& option) {
  const std::string root = option.empty() ? env().cache_dir : option;
  std::error_code ec;
  auto abs = std::filesystem::absolute(root, ec);
  return ec ? root : abs.lexically_normal().string();
}

std::string nvidia_compiler(const std::string& option) {
  return option.empty() ? env().nvidia_compiler : option;
}

void add_spec_options(CLI::App& cmd, SpecOptions& o) {
  std::string ops;
  for (const OpTemplate* op : all_ops()) ops += fmt::format("{}{}", ops.empty() ? "" : ", ", op->name());
  cmd.add_option("op", o.op, fmt::format("The op ({}); see 'kiln ops'", ops))->required();
  cmd.add_option("-p,--param", o.params,
                 "A parameter, NAME=VALUE (VALUE an integer, true or false); repeat it or separate with commas")
      ->delimiter(',');
  // The input dtypes of every op, grouped by op (dequantize_fp8 takes fp8, the others do not).
  std::vector<std::pair<std::string, std::string>> groups;  // dtype list -> ops
  for (const OpTemplate* op : all_ops()) {
    std::string names;
    for (DType t : op->dtypes()) names += fmt::format("{}{}", names.empty() ? "" : ", ", dtype_name(t));
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == names; });
    if (it == groups.end()) groups.emplace_back(names, std::string(op->name()));
    else it->second += fmt::format(", {}", op->name());
  }
  std::string dtypes;
  for (const auto& [names, ops_of] : groups) dtypes += fmt::format("{}{} ({})", dtypes.empty() ? "" : "; ", names, ops_of);
  cmd.add_option("--dtype", o.dtype, fmt::format("Input dtype, one of the op's ('kiln ops OP'): {}", dtypes))
      ->capture_default_str();
  cmd.add_option("--out-dtype", o.out_dtype, "Output dtype (default: the input dtype; gemm may differ)");
}

Result<KernelSpec> make_spec(const SpecOptions& o) {
  KernelSpec spec;
  KILN_ASSIGN_OR_RETURN(const OpTemplate* op, find_op(o.op));
  spec.op = o.op;
  auto dtype = parse_dtype(o.dtype);
  if (!dtype) return make_error(dtype.error().code, "--dtype: " + dtype.error().message);
  spec.dtype = spec.out_dtype = *dtype;
  if (!o.out_dtype.empty()) {
    auto out = parse_dtype(o.out_dtype);
    if (!out) return make_error(out.error().code, "--out-dtype: " + out.error().message);
    spec.out_dtype = *out;
  }
  std::string names;
  for (const ParamInfo& p : op->params()) names += fmt::format("{}{}", names.empty() ? "" : ", ", p.name);
  for (const std::string& kv : o.params) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      return make_error(Errc::invalid_argument,
                        fmt::format("--param '{}': write NAME=VALUE; {} takes: {}", kv, o.op, names));
    const std::string name = kv.substr(0, eq), text = kv.substr(eq + 1);
    int64_t value = 0;
    // An enumerated parameter takes the name of a value (granularity=rowwise) as well as its number.
    const ParamInfo* info = nullptr;
    for (const ParamInfo& p : op->params())
      if (p.name == name) info = &p;
    const std::span<const std::string_view> choices = info ? info->choices : std::span<const std::string_view>{};
    if (auto c = std::find(choices.begin(), choices.end(), text); c != choices.end()) {
      value = c - choices.begin();
    } else if (text == "true") {
      value = 1;
    } else if (text == "false") {
      value = 0;
    } else {
      auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
        std::string names;
        if (info)
          for (std::string_view c : info->choices) names += fmt::format("{}{}", names.empty() ? "" : ", ", c);
        return make_error(Errc::invalid_argument,
                          names.empty() ? fmt::format("--param '{}': the value must be an integer, true or false", kv)
                                        : fmt::format("--param '{}': the value must be one of: {} (or its number)", kv,
                                                      names));
      }
    }
    if (spec.params.count(name))
      return make_error(Errc::invalid_argument, fmt::format("--param '{}': '{}' is given twice", kv, name));
    spec.params[name] = value;
  }
  return spec;
}

Result<std::vector<const TargetInfo*>> parse_targets(const std::vector<std::string>& names) {
  std::vector<const TargetInfo*> out;
  auto add = [&](const TargetInfo* t) {
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  };
  for (const std::string& name : names) {
    if (name == "all") {
      for (const TargetInfo& t : all_targets()) add(&t);
      continue;
    }
    auto t = find_target(name);
    if (!t) return make_error(t.error().code, "--arch: " + t.error().message + " (or all)");
    add(*t);
  }
  if (out.empty()) return make_error(Errc::invalid_argument, "--arch: no target given");
  return out;
}

std::string spec_summary(const KernelSpec& spec) {
  // The op's short form when it has one and the spec is valid, else the parameters in its order.
  if (auto op = find_op(spec.op); op && (*op)->validate(spec, all_targets().back())) {
    if (std::string short_form = (*op)->short_form(spec); !short_form.empty()) {
      std::string s = fmt::format("{} {}", spec.op, dtype_name(spec.dtype));
      if (spec.out_dtype != spec.dtype) s += fmt::format("->{}", dtype_name(spec.out_dtype));
      return s + " " + short_form;
    }
  }
  return spec_text(spec);
}

std::string format_candidates(const TuneReport& r, double flops, std::string_view indent) {
  size_t width = 0;
  for (const TuneCandidate& c : r.candidates) width = std::max(width, config_string(c.config).size());
  std::string out;
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    const TuneCandidate& c = r.candidates[i];
    std::string result;
    if (!c.error.empty()) result = "failed: " + first_line(c.error);
    else if (c.median_ms <= 0) result = "not timed";
    else result = fmt::format("{:.4f} ms", c.median_ms);
    if (c.error.empty() && c.median_ms > 0 && flops > 0)
      result += fmt::format("  {:.1f} TFLOP/s", flops / (c.median_ms * 1e-3) / 1e12);
    if (c.error.empty() && c.median_ms > 0 && i == r.winner) result += "  <- winner";
    out += fmt::format("{}{:<{}}  {}\n", indent, config_string(c.config), width, result);
  }
  return out;
}

double spec_flops(const KernelSpec& spec) {
  auto op = find_op(spec.op);
  return op ? (*op)->flops((*op)->with_defaults(spec)) : 0.0;
}

std::string human_bytes(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (bytes < 1024 * 1024) return fmt::format("{:.1f} KiB", bytes / 1024.0);
  if (bytes < uint64_t{1024} * 1024 * 1024) return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0));
  return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024.0 * 1024.0));
}

std::string known(long long value) { return value < 0 ? std::string("-") : std::to_string(value); }

std::string Table::render(const std::vector<size_t>& right, std::string_view indent) const {
  std::vector<size_t> width;
  for (const auto& row : rows_) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  auto is_right = [&](size_t c) { return std::find(right.begin(), right.end(), c) != right.end(); };
  std::string out;
  for (size_t r = 0; r < rows_.size(); ++r) {
    std::string line(indent);
    for (size_t c = 0; c < rows_[r].size(); ++c) {
      const std::string& cell = rows_[r][c];
      const bool last = c + 1 == rows_[r].size();
      if (is_right(c)) line += std::string(width[c] - cell.size(), ' ') + cell;
      else line += last ? cell : cell + std::string(width[c] - cell.size(), ' ');
      if (!last) line += "  ";
    }
    out += line + "\n";
    if (r == 0) {
      size_t total = 0;
      for (size_t c = 0; c < width.size(); ++c) total += width[c] + (c + 1 < width.size() ? 2 : 0);
      out += std::string(indent) + std::string(total, '-') + "\n";
    }
  }
  return out;
}

}  // namespace kiln::cli
