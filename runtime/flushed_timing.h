// Device time of single launches from cold caches: what Runtime::tune and `kiln run --bench`
// (check_on_device's bench_iterations) measure, as bench/ times kernels. Before each timed launch
// twice Device::cache_bytes() are written, so that no launch finds the previous one's inputs in
// L2 (or an AMD GPU's Infinity Cache). With the caches warm the tuner ranked candidates wrongly:
// H100, 2026-11-28, quantize_fp8 block1x128 at 8192 x 4096 went to the tile kernel, 0.0412 ms
// warm, 0.0427 ms flushed against the row blocks' 0.0405
// (bench/results/h100-2026-11-27-session17/quantize-load-tried/).
#pragma once

#include <functional>
#include <string_view>

#include "kiln/device.h"

namespace kiln {

struct FlushedTimes {
  double median_ms = 0, min_ms = 0, max_ms = 0;
  bool flushed = false;  ///< false: no device memory for the flush (a warning said so), caches warm
};

/// The flush buffer: 2 x Device::cache_bytes() of device memory, allocated once and reused by
/// every time_flushed_launches call given it (the tuner makes one per tuning, not one per
/// candidate). Where the memory is missing, one warning names `what`, and launches are timed with
/// the caches warm. Freed by the destructor; not copyable.
class CacheFlush {
 public:
  CacheFlush(Device& device, std::string_view what);
  ~CacheFlush();
  CacheFlush(const CacheFlush&) = delete;
  CacheFlush& operator=(const CacheFlush&) = delete;
  /// Writes the buffer (stream order: before the next timed launch); ok() without a buffer.
  Result<void> flush(uint8_t value);
  bool active() const { return buffer_ != nullptr; }

 private:
  Device& device_;
  void* buffer_ = nullptr;
  size_t bytes_ = 0;
};

/// Most settling launches time_flushed_launches issues: a tiny kernel's settling stays a few
/// milliseconds of host time.
inline constexpr int kMaxSettleLaunches = 1000;

/// How Kiln times a kernel (the tuner, `kiln run --bench`): one launch of `launch` (a warm-up,
/// timed), then launches back to back for about `settle_ms` of device time (at most
/// kMaxSettleLaunches; none at 0), so that the timed launches run at the clock the GPU holds under
/// that kernel's sustained load, not its boost clock (H200, 2026-11-28: 1740-1785 MHz under the
/// attention forward's load, 1980 for a burst of launches); then `reps` (>= 1) launches on the
/// default stream with device events, each alone after `flush` writes its buffer. `settle_ms` must
/// be >= 0 (callers refuse other values up front). `what` names the work in errors. Errors: the
/// memset's, time_ms's or the launch's.
Result<FlushedTimes> time_flushed_launches(Device& device, CacheFlush& flush, int reps, double settle_ms,
                                           const std::function<Result<void>()>& launch, std::string_view what);

/// The same with a flush buffer of its own, allocated and freed by this call.
Result<FlushedTimes> time_flushed_launches(Device& device, int reps, double settle_ms,
                                           const std::function<Result<void>()>& launch, std::string_view what);

}  // namespace kiln
