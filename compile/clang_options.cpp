#include "compile/clang_options.h"

#include <mutex>
#include <string>
#include <vector>

#ifndef KILN_CLANG_VERSION
#error "KILN_CLANG_VERSION must be defined by the build"
#endif

namespace kiln {

std::vector<std::string> clang_cc1_args(const TargetInfo& target, ClangAction action) {
  // The device half of `clang++ -x hip --offload-arch=gfx942 -nogpulib -nogpuinc
  // --cuda-device-only -O3` (and of `-x cuda --cuda-gpu-arch=sm_90a -nocudainc -nocudalib`), as
  // clang's driver expands it (`-###`), minus paths: the preludes need no headers.
  std::vector<std::string> a = {"-triple", std::string(target.llvm_triple), "-aux-triple",
                                "x86_64-unknown-linux-gnu", "-target-cpu", std::string(target.cpu),
                                "-O3", "-std=c++17", "-fcuda-is-device",
                                "-fcuda-allow-variadic-functions", "-fno-threadsafe-statics",
                                "-discard-value-names", "-nostdsysteminc", "-nobuiltininc"};
  if (target.vendor == Vendor::amd) {
    a.insert(a.end(), {"-x", "hip", "-fhip-new-launch-api", "-mrelocation-model", "pic",
                       "-pic-level", "2", "-fvisibility=hidden", "-fapply-global-visibility-to-externs",
                       "-mllvm", "-amdgpu-internalize-symbols"});
  } else {
    a.insert(a.end(), {"-x", "cuda", "-mrelocation-model", "static", "-target-feature", "+ptx88",
                       "-mllvm", "-enable-memcpyopt-without-libcalls"});
  }
  switch (action) {
    case ClangAction::object: a.push_back("-emit-obj"); break;
    case ClangAction::assembly: a.push_back("-S"); break;
    case ClangAction::llvm_ir: a.push_back("-emit-llvm"); break;
  }
  return a;
}

namespace {
std::string join_clang_flags(const TargetInfo& target) {
  // NVIDIA keys use the assembly action (PTX), AMD keys the object action.
  std::string s;
  for (const auto& a : clang_cc1_args(target, target.vendor == Vendor::amd ? ClangAction::object : ClangAction::assembly))
    s += (s.empty() ? "" : " ") + a;
  if (target.vendor == Vendor::amd) s += " | ld.lld -m elf64_amdgpu --no-undefined -shared";
  else s += " | nvJitLink -arch=" + std::string(target.cpu);
  return s;
}
}  // namespace

std::string clang_flags(const TargetInfo& target) {
  // A function of the target's triple, CPU and vendor only: joined once per process for each
  // (every disk hit's key asks for it; joining thirty arguments cost about 2 us a time).
  struct Memo {
    std::string triple, cpu;
    Vendor vendor;
    std::string flags;
  };
  static std::mutex mu;
  static std::vector<Memo> memo;
  std::lock_guard lock(mu);
  for (const Memo& m : memo)
    if (m.vendor == target.vendor && m.triple == target.llvm_triple && m.cpu == target.cpu) return m.flags;
  memo.push_back({std::string(target.llvm_triple), std::string(target.cpu), target.vendor, join_clang_flags(target)});
  return memo.back().flags;
}

std::string clang_version() { return KILN_CLANG_VERSION; }

}  // namespace kiln
