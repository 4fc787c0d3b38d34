// Shared pieces of the kiln command-line tool: the command registry, error reporting, and the
// helpers several commands use (kernel specs from --param, runtime options, formatting).
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/manifest.h"
#include "kiln/result.h"
#include "kiln/runtime.h"
#include "kiln/spec.h"
#include "kiln/target.h"

namespace kiln::cli {

/// Options every command sees.
struct Globals {
  bool verbose = false;  ///< Print multi-line error details (compiler logs) after the error line.
};
Globals& globals();

/// A registered command: runs after a successful parse and returns the exit code.
using Command = std::function<int()>;

/// Each command file adds its subcommand to `app` and returns the function that runs it.
Command add_ops_command(CLI::App& app);
Command add_manifest_command(CLI::App& app);
Command add_prewarm_command(CLI::App& app);
Command add_inspect_command(CLI::App& app);
Command add_run_command(CLI::App& app);
Command add_cache_command(CLI::App& app);

/// Prints "kiln: error: <first line of message>" on stderr (and, with --verbose, the other lines
/// after it) and returns `exit_code`.
int fail(std::string_view message, int exit_code = 1);
inline int fail(const Error& error, int exit_code = 1) { return fail(error.message, exit_code); }
/// Prints "kiln: warning: <first line of message>" on stderr.
void warn(std::string_view message);
/// The first line of a possibly multi-line message.
std::string first_line(std::string_view message);

/// Adds --cache-dir to a command, bound to `dir`.
void add_cache_dir_option(CLI::App& cmd, std::string& dir);
/// Adds --nvidia-compiler (nvrtc|clang) to a command, bound to `compiler`.
void add_nvidia_compiler_option(CLI::App& cmd, std::string& compiler);
/// The cache root a command uses: --cache-dir, else KILN_CACHE_DIR / $XDG_CACHE_HOME/kiln / ~/.cache/kiln.
std::string cache_root(const std::string& cache_dir_option);
/// The NVIDIA compiler a command uses: --nvidia-compiler, else KILN_NVIDIA_COMPILER, else nvrtc.
std::string nvidia_compiler(const std::string& option);

/// Options shared by the commands that take one kernel (inspect, run).
struct SpecOptions {
  std::string op;
  std::vector<std::string> params;  ///< "NAME=VALUE" (VALUE: integer, true or false).
  std::string dtype = "bf16";
  std::string out_dtype;            ///< Empty: same as dtype.
};
void add_spec_options(CLI::App& cmd, SpecOptions& options);
/// Builds the spec from the options (names and value syntax only; validation is the op's).
Result<KernelSpec> make_spec(const SpecOptions& options);

/// Targets from --arch values ("gfx942", "sm_90a", "all"); duplicates removed, order kept.
Result<std::vector<const TargetInfo*>> parse_targets(const std::vector<std::string>& names);

/// "gemm bf16 8192x6144x4096 NT", "rmsnorm bf16 rows=8192 hidden=4096".
std::string spec_summary(const KernelSpec& spec);
/// One line per candidate of a tuning report, each starting with `indent`: the tile
/// configuration, then the median ms and, when `flops` > 0 (gemm: 2MNK), TFLOP/s, with
/// "<- winner" on the winner's line; or the first line of the candidate's error.
std::string format_candidates(const TuneReport& report, double flops, std::string_view indent);
/// Floating-point operations of one launch of `spec` (gemm: 2*M*N*K), 0 for other ops.
double spec_flops(const KernelSpec& spec);

/// "12.3 KiB", "812 B", "1.2 MiB".
std::string human_bytes(uint64_t bytes);
/// "-" for unknown (-1) values, else the number.
std::string known(long long value);

/// A plain text table: columns padded to their widest cell, the header underlined.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  /// Columns listed in `right` are right-aligned (numbers).
  std::string render(const std::vector<size_t>& right = {}, std::string_view indent = "") const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace kiln::cli
