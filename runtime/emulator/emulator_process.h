// The Python child process of the emulator backend (tools/emulator/kiln_emu.py, embedded): it owns
// the emulated device memory and runs kernels in tinygrad's CDNA emulator. Requests and responses
// are binary frames on a socket (the child's stdin/stdout); see kiln_emu.py for the protocol.
//
// Every exchange has a deadline: a child that does not answer in time is killed (with its process
// group: clang compiles of the emulator die with it) and the call returns Errc::timeout. A child
// that dies gives Errc::driver_error with its exit status and the tail of its stderr. After
// either, every later call fails at once with the same story: the device's memory is gone.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kiln/result.h"

namespace kiln {

struct EmulatorConfig {
  std::string python;        ///< Interpreter with tinygrad 0.14.0 and numpy.
  std::string emulator_dir;  ///< Holds test/mockgpu/amd/emu.py.
  std::string path_prefix;   ///< Prepended to the child's PATH ("" = none): where `clang` is.
  /// NAME=VALUE entries set in the child's environment, replacing the same names of ours
  /// (CDNA_FP8: the emulator's fp8 decoding, read when it is imported).
  std::vector<std::string> env;
  double timeout_s = 300;    ///< Deadline of one request (the startup import included).
};

class EmulatorProcess {
 public:
  enum Op : uint32_t { kMalloc = 1, kFree = 2, kWrite = 3, kRead = 4, kMemset = 5, kRun = 6 };

  /// Starts the child and waits for its ready message. Errors: driver_unavailable (the
  /// interpreter cannot be started, or cannot import the emulator: the message says which),
  /// timeout.
  static Result<std::unique_ptr<EmulatorProcess>> start(const EmulatorConfig& config);
  ~EmulatorProcess();
  EmulatorProcess(const EmulatorProcess&) = delete;
  EmulatorProcess& operator=(const EmulatorProcess&) = delete;

  /// Sends one request (`head` then `tail`, as one payload) and returns the response payload.
  /// `what` names the request in errors ("launch of kiln_gemm"). Thread-safe (one at a time).
  Result<std::vector<uint8_t>> call(Op op, std::span<const uint8_t> head, std::span<const uint8_t> tail,
                                    const std::string& what);
  /// The versions the child reported ("tinygrad 0.14.0, Python 3.11.2").
  const std::string& versions() const { return versions_; }

 private:
  EmulatorProcess() = default;
  // Sends all of `bytes` / receives exactly `out.size()` bytes before `deadline` (a
  // steady_clock time in ns), draining the child's stderr meanwhile.
  Result<void> send_all(std::span<const uint8_t> bytes, int64_t deadline_ns, const std::string& what);
  Result<void> recv_all(std::span<uint8_t> out, int64_t deadline_ns, const std::string& what);
  Result<std::vector<uint8_t>> receive(int64_t deadline_ns, const std::string& what);
  void drain_stderr();
  // Kills the child (and its process group), reaps it and returns the error every later call gets.
  Error fail(Errc code, const std::string& what, const std::string& why);
  std::string exit_story();

  std::mutex mu_;
  pid_t pid_ = -1;
  int sock_ = -1;     // our end of the request socket (the child's stdin and stdout)
  int stderr_ = -1;   // read end of the child's stderr
  std::string stderr_tail_;
  std::string versions_;
  double timeout_s_ = 300;
  bool dead_ = false;
  Error dead_error_;
};

}  // namespace kiln
