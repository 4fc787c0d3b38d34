// How much memory this process may still take, to refuse a request whose sizes come from a user
// before allocating it (instead of std::bad_alloc, or the OOM killer) with the figures.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace kiln {

/// A bound on memory, in bytes, and where it comes from, for an error message
/// ("MemAvailable of /proc/meminfo", "RLIMIT_AS (ulimit -v) of 8.0 GiB less the 1.2 GiB this
/// process has mapped").
struct MemoryLimit {
  uint64_t bytes = 0;
  std::string source;
};

/// The least of what this process may still allocate on the host: MemAvailable (/proc/meminfo),
/// RLIMIT_AS less the address space already mapped (VmSize), RLIMIT_DATA less the data segment
/// (VmData). nullopt where none is known (no /proc, no limits).
std::optional<MemoryLimit> host_memory_limit();

/// MemAvailable of /proc/meminfo alone (what other processes, e.g. the emulator's, may take).
std::optional<MemoryLimit> host_available_memory();

/// "512 B", "3.0 KiB", "1.5 GiB".
std::string format_bytes(uint64_t bytes);

}  // namespace kiln
