// A program built against an installed Kiln (CMake package or pkg-config): prints the versions,
// then compiles one kernel for sm_90a (NVRTC; needs no GPU) in a compile-only runtime.
#include <kiln/kiln.h>

#include <cstdio>

int main() {
  std::printf("kiln headers %s, library %s\n", KILN_VERSION_STRING, kiln::version());
  kiln::RuntimeOptions options;
  options.backend = "none";  // compile-only: no GPU needed
  auto runtime = kiln::Runtime::create(options);
  if (!runtime) {
    std::fprintf(stderr, "kiln: %s\n", runtime.error().message.c_str());
    return 1;
  }
  const kiln::KernelSpec spec{"rmsnorm", kiln::DType::bf16, kiln::DType::bf16, {{"rows", 1}, {"hidden", 4096}}};
  auto compiled = (*runtime)->compile(spec, "sm_90a");
  if (!compiled) {
    std::fprintf(stderr, "kiln: %s\n", compiled.error().message.c_str());
    return 1;
  }
  const kiln::KernelInfo& info = (*compiled)->info();
  std::printf("%s for %s: %s, %zu bytes, %d registers\n", info.kernel.c_str(), info.target.c_str(),
              info.code_format.c_str(), info.code_bytes, info.registers);
  return 0;
}
