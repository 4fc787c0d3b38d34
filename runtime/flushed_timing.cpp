#include "runtime/flushed_timing.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "support/log.h"

namespace kiln {

Result<FlushedTimes> time_flushed_launches(Device& device, int reps, const std::function<Result<void>()>& launch,
                                           std::string_view what) {
  void* flush = nullptr;
  const size_t bytes = 2 * device.cache_bytes();
  if (bytes) {
    auto p = device.malloc(bytes);
    if (p)
      flush = *p;
    else
      KILN_LOG_WARN("{}: no {} bytes to flush the caches between timed launches ({}); timing with the caches warm",
                    what, bytes, p.error().message);
  }
  std::vector<float> ms;
  Result<void> status = ok();
  for (int r = 0; r < reps && status; ++r) {
    if (flush) status = device.memset(flush, static_cast<uint8_t>(r), bytes);  // stream order: before the timing
    if (!status) break;
    auto t = device.time_ms(nullptr, launch);
    if (t)
      ms.push_back(*t);
    else
      status = t.take_error();
  }
  if (flush) (void)device.free(flush);
  KILN_TRY(std::move(status));
  if (ms.empty()) return make_error(Errc::invalid_argument, fmt::format("{}: no launch timed (reps = {})", what, reps));
  std::sort(ms.begin(), ms.end());
  FlushedTimes out;
  out.median_ms = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  out.min_ms = ms.front();
  out.max_ms = ms.back();
  out.flushed = flush != nullptr;
  return out;
}

}  // namespace kiln
