#include "runtime/flushed_timing.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "support/log.h"

namespace kiln {

CacheFlush::CacheFlush(Device& device, std::string_view what) : device_(device) {
  const size_t bytes = 2 * device.cache_bytes();
  if (!bytes) return;
  auto p = device.malloc(bytes);
  if (p) {
    buffer_ = *p;
    bytes_ = bytes;
  } else {
    KILN_LOG_WARN("{}: no {} bytes to flush the caches between timed launches ({}); timing with the caches warm",
                  what, bytes, p.error().message);
  }
}

CacheFlush::~CacheFlush() {
  if (buffer_) (void)device_.free(buffer_);
}

Result<void> CacheFlush::flush(uint8_t value) {
  if (!buffer_) return ok();
  return device_.memset(buffer_, value, bytes_);
}

Result<FlushedTimes> time_flushed_launches(Device& device, CacheFlush& flush, int reps, double settle_ms,
                                           const std::function<Result<void>()>& launch, std::string_view what) {
  KILN_ASSIGN_OR_RETURN(float once, device.time_ms(nullptr, launch));  // warm-up
  if (settle_ms > 0) {
    const double n = std::ceil(settle_ms / std::max(static_cast<double>(once), 1e-3));
    for (int i = 0, count = static_cast<int>(std::min(n, double{kMaxSettleLaunches})); i < count; ++i) KILN_TRY(launch());
  }
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    KILN_TRY(flush.flush(static_cast<uint8_t>(r)));  // stream order: before the timing
    KILN_ASSIGN_OR_RETURN(float t, device.time_ms(nullptr, launch));
    ms.push_back(t);
  }
  if (ms.empty()) return make_error(Errc::invalid_argument, fmt::format("{}: no launch timed (reps = {})", what, reps));
  std::sort(ms.begin(), ms.end());
  FlushedTimes out;
  out.median_ms = ms.size() % 2 ? ms[ms.size() / 2] : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
  out.min_ms = ms.front();
  out.max_ms = ms.back();
  out.flushed = flush.active();
  return out;
}

Result<FlushedTimes> time_flushed_launches(Device& device, int reps, double settle_ms,
                                           const std::function<Result<void>()>& launch, std::string_view what) {
  CacheFlush flush(device, what);
  return time_flushed_launches(device, flush, reps, settle_ms, launch, what);
}

}  // namespace kiln
