#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <regex>

#include "compile/compiler.h"
#include "compile/nvrtc_api.h"
#include "support/log.h"

namespace kiln {
namespace {

class NvrtcCompiler final : public Compiler {
 public:
  explicit NvrtcCompiler(const NvrtcApi* api) : api_(api) {}
  std::string_view name() const override { return "nvrtc"; }
  std::string version() const override { return fmt::format("{}.{}", api_->major, api_->minor); }
  std::string flags(const TargetInfo& target) const override {
    std::string s;
    for (const std::string& o : options(target)) s += (s.empty() ? "" : " ") + o;
    return s;
  }
  bool supports(const TargetInfo& target) const override { return target.vendor == Vendor::nvidia; }

  Result<CompiledCode> compile(const KernelSource& src) override {
    const auto start = std::chrono::steady_clock::now();
    KILN_ASSIGN_OR_RETURN(Program prog, run(src));
    CompiledCode out;
    size_t size = 0;
    if (api_->nvrtcGetCUBINSize(prog.handle, &size) != NVRTC_SUCCESS || size == 0)
      return make_error(Errc::compile_failed, "NVRTC produced no cubin for " + to_string(src.spec));
    out.code.format = "cubin";
    out.code.bytes.resize(size);
    api_->nvrtcGetCUBIN(prog.handle, reinterpret_cast<char*>(out.code.bytes.data()));
    out.log = prog.log;
    out.info.kernel = src.kernel_name;
    out.info.wave_size = src.target->wave_size;
    parse_ptxas_report(prog.log, out.info);
    out.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return out;
  }

  Result<std::string> emit(const KernelSource& src, Emit what) override {
    if (what == Emit::llvm_ir)
      return make_error(Errc::unsupported,
                        "NVRTC does not emit LLVM IR; use a build with LLVM (KILN_WITH_LLVM=ON), "
                        "which emits it with clang");
    KILN_ASSIGN_OR_RETURN(Program prog, run(src));
    size_t size = 0;
    api_->nvrtcGetPTXSize(prog.handle, &size);
    std::string ptx(size, '\0');
    api_->nvrtcGetPTX(prog.handle, ptx.data());
    while (!ptx.empty() && ptx.back() == '\0') ptx.pop_back();
    return ptx;
  }

 private:
  struct Program {
    nvrtcProgram handle = nullptr;
    std::string log;
    const NvrtcApi* api = nullptr;
    Program() = default;
    Program(Program&& o) noexcept : handle(o.handle), log(std::move(o.log)), api(o.api) { o.handle = nullptr; }
    ~Program() {
      if (handle) api->nvrtcDestroyProgram(&handle);
    }
  };

  std::vector<std::string> options(const TargetInfo& target) const {
    // -Xptxas -v puts ptxas's resource report (registers, shared memory, spills) into the log.
    // --diag-suppress=177: "variable was declared but never referenced". Every kernel's source
    // holds its template's baked constants and the prelude's, used or not; that warning filled
    // every NVIDIA compile log (and meta.json, which a disk hit parses) with two to seven copies.
    std::vector<std::string> o = {fmt::format("--gpu-architecture={}", target.cpu), "--std=c++17", "-default-device",
                                  "--ptxas-options=-v", "--diag-suppress=177"};
    // ptxas compiles a module's kernels on parallel threads (0: as many as the host has). The
    // machine code is byte-identical (every sm_90a kernel of the llama3.1-8b, its fp8 block and the
    // deepseek-v3 manifests compared, 2026-11-27: 84 code objects, 21 ops); a cold compile of the
    // attention backward's three kernels took 0.93 s instead of 1.10 s on a 2-core host. NVRTC's
    // own --split-compile is not used: it changed five instructions of the attention forward.
    // Checked with NVRTC 13 only, so older ones keep the single-threaded ptxas.
    if (api_->major >= 13) o.push_back("--ptxas-options=--split-compile=0");
    return o;
  }

  Result<Program> run(const KernelSource& src) {
    Program prog;
    prog.api = api_;
    nvrtcResult rc = api_->nvrtcCreateProgram(&prog.handle, src.text.c_str(), "kiln_kernel.cu", 0, nullptr, nullptr);
    if (rc != NVRTC_SUCCESS)
      return make_error(Errc::compile_failed, fmt::format("nvrtcCreateProgram failed: {}", api_->nvrtcGetErrorString(rc)));
    std::vector<std::string> opts = options(*src.target);
    std::vector<const char*> argv;
    for (const auto& o : opts) argv.push_back(o.c_str());
    rc = api_->nvrtcCompileProgram(prog.handle, static_cast<int>(argv.size()), argv.data());
    size_t log_size = 0;
    api_->nvrtcGetProgramLogSize(prog.handle, &log_size);
    prog.log.resize(log_size);
    if (log_size) api_->nvrtcGetProgramLog(prog.handle, prog.log.data());
    while (!prog.log.empty() && (prog.log.back() == '\0' || prog.log.back() == '\n')) prog.log.pop_back();
    if (rc != NVRTC_SUCCESS)
      return make_error(Errc::compile_failed,
                        fmt::format("NVRTC failed to compile {} for {} ({}); log:\n{}\n--- source "
                                    "(kiln_kernel.cu) ---\n{}",
                                    to_string(src.spec), src.target->name,
                                    api_->nvrtcGetErrorString(rc), prog.log, src.text));
    return prog;
  }

  const NvrtcApi* api_;
};

}  // namespace

Result<Compiler*> nvrtc_compiler() {
  static Result<Compiler*> compiler = []() -> Result<Compiler*> {
    KILN_ASSIGN_OR_RETURN(const NvrtcApi* api, nvrtc_api());
    return static_cast<Compiler*>(new NvrtcCompiler(api));
  }();
  return compiler;
}

void parse_ptxas_report(const std::string& log, CodeObjectInfo& info) {
  // One report per entry function; a module may hold several (rmsnorm_bwd's row pass and its
  // dgamma reduction), and ptxas lists them in no useful order: keep the largest of each figure,
  // so that a spill or a register count anywhere in the module shows.
  static const std::regex used(R"(Used (\d+) registers(?:.*?, (\d+) bytes smem)?)");
  static const std::regex frame(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  for (auto it = std::sregex_iterator(log.begin(), log.end(), used); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    info.registers = std::max(info.registers, std::stoi(m[1]));
    info.shared_bytes = std::max(info.shared_bytes, m[2].matched ? std::stoi(m[2]) : 0);
  }
  for (auto it = std::sregex_iterator(log.begin(), log.end(), frame); it != std::sregex_iterator(); ++it) {
    const std::smatch& m = *it;
    info.scratch_bytes = std::max(info.scratch_bytes, std::stoi(m[1]));
    info.spill_stores = std::max(info.spill_stores, std::stoi(m[2]));
    info.spill_loads = std::max(info.spill_loads, std::stoi(m[3]));
  }
  std::string extra;
  for (size_t pos = 0; pos < log.size();) {
    size_t end = log.find('\n', pos);
    if (end == std::string::npos) end = log.size();
    std::string line = log.substr(pos, end - pos);
    if (line.find("Used") != std::string::npos || line.find("stack frame") != std::string::npos)
      extra += (extra.empty() ? "" : "\n") + line;
    pos = end + 1;
  }
  info.extra = extra;
}

}  // namespace kiln
