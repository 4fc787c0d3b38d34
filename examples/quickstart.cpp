// Kiln in one page: compile a GEMM for every target, then (on a GPU) run it and check it.
#include <kiln/kiln.h>

#include <cstdio>

int main() {
  // The first GPU (NVIDIA, else AMD) and the default cache (~/.cache/kiln or KILN_CACHE_DIR).
  // Without a GPU the runtime is compile-only.
  auto runtime = kiln::Runtime::create();
  if (!runtime) {
    std::fprintf(stderr, "kiln: %s\n", runtime.error().message.c_str());
    return 1;
  }
  kiln::Runtime& rt = **runtime;

  // The forward GEMM of a Llama-3.1-8B attention output projection: y[M,N] = x[M,K] @ W[N,K]^T.
  const kiln::KernelSpec spec{"gemm", kiln::DType::bf16, kiln::DType::bf16,
                              {{"M", 4096}, {"N", 4096}, {"K", 4096}, {"trans_a", 0}, {"trans_b", 1}}};

  for (const char* target : {"gfx942", "gfx950", "sm_90a"}) {
    auto compiled = rt.compile(spec, target);  // compiled once, then served from the cache
    if (!compiled && compiled.error().code == kiln::Errc::unsupported) {
      std::printf("%-7s skipped: %s\n", target, compiled.error().message.c_str());  // e.g. no LLVM here
      continue;
    }
    if (!compiled) {
      std::fprintf(stderr, "kiln: %s\n", compiled.error().message.c_str());
      return 1;
    }
    const kiln::KernelInfo& info = (*compiled)->info();
    std::printf("%-7s %-5s %6zu bytes, %3d registers, %5d bytes LDS, from %s\n", target,
                info.code_format.c_str(), info.code_bytes, info.registers, info.shared_bytes,
                std::string((*compiled)->origin()).c_str());
  }

  if (rt.device() != nullptr) {
    // Random inputs, NaN-poisoned output, one launch, compared with the CPU reference.
    kiln::CheckOptions options;
    options.sample_rows = 16;
    auto report = kiln::check_on_device(rt, spec, options);
    if (!report) {
      std::fprintf(stderr, "kiln: %s\n", report.error().message.c_str());
      return 1;
    }
    std::printf("%s\n", kiln::format_report(*report).c_str());
    return report->pass ? 0 : 1;
  }
  std::printf("no GPU: compiled only\n");
  return 0;
}
