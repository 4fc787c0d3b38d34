// A separate process for the cache's multi-process tests: opens a runtime on a shared cache,
// waits for a start signal (a file), compiles N distinct small kernels, and writes its counters.
//   cache_worker CACHE_DIR TARGET N REPORT_FILE [START_FILE]
// KILN_TEST_KILL_AT=compile|write|publish makes it SIGKILL itself at that point (crash tests).
// KILN_REMOTE_CACHE (and KILN_REMOTE_CACHE_KEY) add the remote tier: the worker is then one node
// of a cluster (tests/cache/test_remote_cache.cpp, bench/remote_cluster.sh).
// The report: kernels obtained, compiles, disk hits, lock waits, kernels compiled here, remote hits.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "kiln/kiln.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: cache_worker CACHE_DIR TARGET N REPORT_FILE [START_FILE]\n");
    return 2;
  }
  kiln::RuntimeOptions o;
  o.backend = "none";
  o.cache_dir = argv[1];
  auto rt = kiln::Runtime::create(o);
  if (!rt) {
    std::fprintf(stderr, "%s\n", rt.error().message.c_str());
    return 1;
  }
  if (argc > 5)
    while (access(argv[5], F_OK) != 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const int n = std::atoi(argv[3]);
  int ok = 0, compiled = 0;
  for (int k = 0; k < n; ++k) {
    const kiln::KernelSpec spec{"swiglu", kiln::DType::bf16, kiln::DType::bf16, {{"rows", 1}, {"intermediate", 64 + k}}};
    auto c = (*rt)->compile(spec, argv[2]);
    if (!c) {
      std::fprintf(stderr, "kernel %d: %s\n", k, c.error().message.c_str());
      continue;
    }
    ok += (*c)->code_object().size() > 0;
    compiled += (*c)->origin() == "compiled";
  }
  const kiln::CacheStats s = (*rt)->stats();
  std::ofstream(argv[4]) << ok << " " << s.compiles << " " << s.disk_hits << " " << s.lock_waits << " " << compiled << " "
                         << s.remote_hits << "\n";
  return ok == n ? 0 : 1;
}
