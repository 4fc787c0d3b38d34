// Every environment variable Kiln reads, read in one place (documented in README.md's table).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kiln {

struct Env {
  std::string cache_dir;        ///< KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln.
  bool disk_cache = true;       ///< KILN_DISABLE_DISK_CACHE=1 turns the disk cache off.
  std::string log_level = "warn";  ///< KILN_LOG: trace, debug, info, warn, error, off.
  std::string nvidia_compiler = "nvrtc";  ///< KILN_NVIDIA_COMPILER: nvrtc or clang.
  bool dump_source = false;     ///< KILN_DUMP_SOURCE=1 logs generated source at info level.
  double lock_timeout_s = 600;  ///< KILN_LOCK_TIMEOUT: seconds to wait for another compile.
  uint64_t cache_max_bytes = 0;  ///< KILN_CACHE_MAX_SIZE ("2G", "500M", bytes); 0 = unbounded.
  std::string cache_path;       ///< KILN_CACHE_PATH: read-only cache layers, ':'-separated.
  std::string record_file;      ///< KILN_RECORD: append every requested kernel spec to this manifest.
  bool tuning = true;           ///< KILN_TUNING=0 ignores tuning records (kernels use the heuristic).
  std::string test_kill_at;     ///< KILN_TEST_KILL_AT (tests only): SIGKILL at compile|write|publish.
  std::string cuda_lib;         ///< KILN_CUDA_LIB: path of libcuda.so to dlopen first.
  std::string hip_lib;          ///< KILN_HIP_LIB: path of libamdhip64.so to dlopen first.
  std::string nvrtc_lib;        ///< KILN_NVRTC_LIB: path of libnvrtc.so to dlopen first.
  std::string nvjitlink_lib;    ///< KILN_NVJITLINK_LIB: path of libnvJitLink.so to dlopen first.
  std::string amd_emulator;     ///< KILN_AMD_EMULATOR: folder of tinygrad's CDNA emulator (backend "emulator").
  std::string emulator_python;  ///< KILN_EMULATOR_PYTHON: Python with tinygrad 0.14.0 and numpy.
  double emulator_timeout_s = 300;  ///< KILN_EMULATOR_TIMEOUT: seconds one emulator request may take.
};

/// The environment as read at first use (cached: Kiln reads it once per process).
const Env& env();
/// Reads the environment now (tests use it after setenv).
Env read_env();

/// Parses a byte size: "2G", "512M", "64K", "1.5G" (binary units) or a plain number of bytes.
/// Returns nullopt for anything else.
std::optional<uint64_t> parse_size(const std::string& text);

/// The fault-injection hook of the crash-safety tests: SIGKILLs the process when KILN_TEST_KILL_AT
/// names `stage` ("compile", "write", "publish").
void test_kill_point(const char* stage);

}  // namespace kiln
