// The recorder: with KILN_RECORD (or RuntimeOptions::record_file), every spec a runtime compiles is
// appended to a manifest in JSON lines, for `kiln prewarm`. Part of RuntimeImpl
// (runtime/runtime_impl.h); Runtime::create opens the file.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "runtime/runtime_impl.h"
#include "support/log.h"
#include "support/spec_json.h"

namespace kiln::detail {

void RuntimeImpl::record(const KernelSpec& spec) {
  if (record_fd_ < 0) return;
  const std::string line = spec_to_json(spec).dump() + "\n";
  const ssize_t n = ::write(record_fd_, line.data(), line.size());
  if (n != static_cast<ssize_t>(line.size()) && !record_failed_.exchange(true))
    KILN_LOG_WARN("cannot record kernel specs (KILN_RECORD): {}; this runtime records nothing more",
                  n < 0 ? std::strerror(errno) : "short write (disk full?)");
}

}  // namespace kiln::detail
