// Host work over large arrays on every core: the test and benchmark inputs of GPU-sized tensors
// (billions of elements) are drawn and encoded here, and one thread would take minutes.
#pragma once

#include <cstddef>
#include <functional>

namespace kiln {

/// Runs body(begin, end) over [0, n) in chunks of `grain` elements (the last may be shorter), on
/// up to std::thread::hardware_concurrency() threads, the calling thread among them; returns when
/// every chunk is done. A range of one chunk runs on the calling thread alone. Chunks are
/// disjoint, so a body that writes only its own range needs no lock; `body` must not throw. If a
/// thread cannot be started, the threads already running (or the caller) take its chunks.
void parallel_for(size_t n, size_t grain, const std::function<void(size_t begin, size_t end)>& body);

}  // namespace kiln
