// The recorder: with KILN_RECORD (or RuntimeOptions::record_file), every spec a runtime compiles is
// appended to a manifest in JSON lines, for `kiln prewarm`. Part of RuntimeImpl
// (runtime/runtime_impl.h); Runtime::create opens the file.
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "runtime/runtime_impl.h"
#include "support/log.h"

namespace kiln::detail {

void RuntimeImpl::record(const KernelSpec& spec) {
  if (record_fd_ < 0) return;
  nlohmann::json params = nlohmann::json::object();
  for (const auto& [k, v] : spec.params) params[k] = v;
  const std::string line = nlohmann::json{{"op", spec.op},
                                          {"dtype", dtype_name(spec.dtype)},
                                          {"out_dtype", dtype_name(spec.out_dtype)},
                                          {"params", params}}
                               .dump() +
                           "\n";
  const ssize_t n = ::write(record_fd_, line.data(), line.size());
  if (n != static_cast<ssize_t>(line.size()) && !record_failed_.exchange(true))
    KILN_LOG_WARN("cannot record kernel specs (KILN_RECORD): {}; this runtime records nothing more",
                  n < 0 ? std::strerror(errno) : "short write (disk full?)");
}

}  // namespace kiln::detail
