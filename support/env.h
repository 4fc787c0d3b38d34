// Every environment variable Kiln reads, read in one place (documented in README.md's table).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln {

struct Env {
  std::string cache_dir;        ///< KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln.
  bool disk_cache = true;       ///< KILN_DISABLE_DISK_CACHE=1 turns the disk cache off.
  std::string log_level = "warn";  ///< KILN_LOG: trace, debug, info, warn, error, off.
  std::string nvidia_compiler = "nvrtc";  ///< KILN_NVIDIA_COMPILER: nvrtc or clang.
  bool dump_source = false;     ///< KILN_DUMP_SOURCE=1 logs generated source at info level.
  double lock_timeout_s = 600;  ///< KILN_LOCK_TIMEOUT: seconds to wait for another compile.
  uint64_t cache_max_bytes = 0;  ///< KILN_CACHE_MAX_SIZE ("2G", "500M", bytes, > 0); unset = unbounded.
  std::string cache_path;       ///< KILN_CACHE_PATH: read-only cache layers, ':'-separated.
  std::string record_file;      ///< KILN_RECORD: append every requested kernel spec to this manifest.
  std::string trusted_keys;     ///< KILN_TRUSTED_KEYS: ':'-separated PEM files of Ed25519 public keys.
  bool tuning = true;           ///< KILN_TUNING=0 ignores tuning records (kernels use the heuristic).
  std::string test_kill_at;     ///< KILN_TEST_KILL_AT (tests only): SIGKILL at compile|write|publish.
  std::string cuda_lib;         ///< KILN_CUDA_LIB: path of libcuda.so to dlopen first.
  std::string hip_lib;          ///< KILN_HIP_LIB: path of libamdhip64.so to dlopen first.
  std::string nvrtc_lib;        ///< KILN_NVRTC_LIB: path of libnvrtc.so to dlopen first.
  std::string nvjitlink_lib;    ///< KILN_NVJITLINK_LIB: path of libnvJitLink.so to dlopen first.
  std::string amd_emulator;     ///< KILN_AMD_EMULATOR: folder of tinygrad's CDNA emulator (backend "emulator").
  std::string emulator_python;  ///< KILN_EMULATOR_PYTHON: Python with tinygrad 0.14.0 and numpy.
  double emulator_timeout_s = 300;  ///< KILN_EMULATOR_TIMEOUT: seconds one emulator request may take.
  /// KILN_EMULATOR_FP8: "ocp" or "fnuz", how the emulator decodes fp8 operands; empty (the
  /// default): the target's encoding (FNUZ on gfx942, OCP on gfx950). The tests set "ocp" on
  /// gfx942 to show that an fp8 kernel checked with the wrong decoding fails.
  std::string emulator_fp8;
  /// Invalid values, one message each naming the variable, the value and what is accepted; the
  /// field keeps its default. Runtime::create and the CLI refuse to start with any.
  std::vector<std::string> errors;
};

/// The most KILN_LOCK_TIMEOUT accepts: a week, in seconds.
inline constexpr double kMaxLockTimeout = 7 * 24 * 3600;

/// The environment as read at first use (cached: Kiln reads it once per process).
const Env& env();
/// Reads the environment now (tests use it after setenv).
Env read_env();

/// The invalid environment variables as one message, or nullopt when all are valid.
std::optional<std::string> env_error();

/// Parses a byte size: "2G", "512M", "64K", "1.5G", "2GiB", "2GB" (binary units) or a plain number
/// of bytes, below 2^63. Returns nullopt for anything else (a sign, an exponent, nan, a space).
std::optional<uint64_t> parse_size(const std::string& text);
/// Parses a wait in seconds: digits with at most one '.', from 0 to kMaxLockTimeout.
std::optional<double> parse_seconds(const std::string& text);

/// The fault-injection hook of the crash-safety tests: SIGKILLs the process when KILN_TEST_KILL_AT
/// names `stage` ("compile", "write", "publish"), SIGSTOPs it when it is "stop:<stage>".
void test_kill_point(const char* stage);

}  // namespace kiln
