// In-process clang/LLVM 22: the clang frontend and LLVM backends as libraries (libclang-cpp,
// libLLVM) and lld's ELF linker (liblldELF). No subprocess is started: the source is a memory
// buffer, the object comes back in a memory stream, lld reads it from a memfd, and only lld's
// output passes through a private temporary directory (see link_hsaco).
#include <clang/Basic/Diagnostic.h>
#include <clang/Basic/DiagnosticOptions.h>
#include <clang/Basic/Version.h>
#include <clang/CodeGen/CodeGenAction.h>
#include <clang/Frontend/CompilerInstance.h>
#include <clang/Frontend/CompilerInvocation.h>
#include <clang/Frontend/TextDiagnosticPrinter.h>
#include <fmt/format.h>
#include <lld/Common/Driver.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "compile/amdgpu_metadata.h"
#include "compile/clang_options.h"
#include "compile/compiler.h"
#include "compile/nvrtc_api.h"
#include "support/log.h"

LLD_HAS_DRIVER(elf)

namespace kiln {
namespace {

using Action = ClangAction;

// lld keeps global state: one link at a time per process.
std::mutex g_lld_mutex;

// `warnings`, when given, receives clang's warnings (CompiledCode::log); nothing is printed.
Result<std::string> run_frontend(const KernelSource& src, Action action, std::string* warnings = nullptr) {
  const std::vector<std::string> args = clang_cc1_args(*src.target, action);
  std::vector<const char*> argv;
  for (const auto& s : args) argv.push_back(s.c_str());

  std::string diag_text;
  llvm::raw_string_ostream diag_os(diag_text);
  clang::DiagnosticOptions diag_opts;
  diag_opts.ShowColors = false;
  auto* printer = new clang::TextDiagnosticPrinter(diag_os, diag_opts);
  clang::DiagnosticsEngine diags(llvm::makeIntrusiveRefCnt<clang::DiagnosticIDs>(), diag_opts, printer,
                                 /*ShouldOwnClient=*/true);
  auto invocation = std::make_shared<clang::CompilerInvocation>();
  if (!clang::CompilerInvocation::CreateFromArgs(*invocation, argv, diags))
    return make_error(Errc::compile_failed, "clang rejected Kiln's own options:\n" + diag_text);

  auto buffer = llvm::MemoryBuffer::getMemBuffer(src.text, "kiln_kernel.hip", false);
  auto& inputs = invocation->getFrontendOpts().Inputs;
  const clang::InputKind kind(src.target->vendor == Vendor::amd ? clang::Language::HIP : clang::Language::CUDA);
  inputs.clear();
  inputs.emplace_back(buffer->getMemBufferRef(), kind);
  invocation->getFrontendOpts().OutputFile = "-";

  clang::CompilerInstance ci(invocation);
  ci.createVirtualFileSystem();
  ci.createDiagnostics(new clang::TextDiagnosticPrinter(diag_os, ci.getDiagnosticOpts()), true);
  // ExecuteAction prints "N warnings generated" to the verbose stream, stderr by default: a library
  // writes nothing there (the warnings themselves are in diag_text).
  std::string stats;
  ci.setVerboseOutputStream(std::make_unique<llvm::raw_string_ostream>(stats));
  llvm::SmallString<0> out;
  ci.setOutputStream(std::make_unique<llvm::raw_svector_ostream>(out));

  llvm::LLVMContext context;
  std::unique_ptr<clang::CodeGenAction> act;
  switch (action) {
    case ClangAction::object: act = std::make_unique<clang::EmitObjAction>(&context); break;
    case ClangAction::assembly: act = std::make_unique<clang::EmitAssemblyAction>(&context); break;
    case ClangAction::llvm_ir: act = std::make_unique<clang::EmitLLVMAction>(&context); break;
  }
  const bool ok = ci.ExecuteAction(*act);
  diag_os.flush();
  if (!ok || ci.getDiagnostics().hasErrorOccurred())
    return make_error(Errc::compile_failed,
                      fmt::format("clang failed to compile {} for {}; log:\n{}\n--- source "
                                  "(kiln_kernel.hip) ---\n{}",
                                  to_string(src.spec), src.target->name, diag_text, src.text));
  if (!diag_text.empty()) KILN_LOG_DEBUG("clang warnings for {}:\n{}", to_string(src.spec), diag_text);
  if (warnings) *warnings = diag_text;
  return std::string(out.data(), out.size());
}

// An anonymous in-memory file with a path lld can open.
struct MemFile {
  int fd = -1;
  explicit MemFile(const char* name) : fd(memfd_create(name, MFD_CLOEXEC)) {}
  ~MemFile() {
    if (fd >= 0) close(fd);
  }
  std::string path() const { return fmt::format("/proc/self/fd/{}", fd); }
};

Result<std::vector<uint8_t>> link_hsaco(const std::string& object) {
  // lld reads its input from a memfd. Its output cannot go to one: lld first probes the output
  // path by creating "<path>.tmpXXXX" beside it, which /proc/self/fd cannot hold. So the code
  // object is written into a private (0700) directory made by mkdtemp and removed at once.
  MemFile in("kiln-object");
  if (in.fd < 0) return make_error(Errc::io_error, "memfd_create failed for the lld link");
  if (write(in.fd, object.data(), object.size()) != static_cast<ssize_t>(object.size()))
    return make_error(Errc::io_error, "writing the object for lld failed");
  const char* tmpdir = std::getenv("TMPDIR");
  std::string dir_template = fmt::format("{}/kiln-lld-XXXXXX", tmpdir && *tmpdir ? tmpdir : "/tmp");
  if (!mkdtemp(dir_template.data()))
    return make_error(Errc::io_error, fmt::format("cannot create a private directory for lld in '{}': {}",
                                                  dir_template, std::strerror(errno)));
  const std::string dir = dir_template;
  struct RemoveDir {
    std::string dir;
    ~RemoveDir() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } remove_dir{dir};
  const std::string in_path = in.path(), out_path = dir + "/kernel.hsaco";
  const char* argv[] = {"ld.lld", "-m", "elf64_amdgpu", "--no-undefined", "-shared",
                        "-o", out_path.c_str(), in_path.c_str()};
  std::string log;
  llvm::raw_string_ostream log_os(log);
  lld::Result r;
  {
    std::lock_guard<std::mutex> lock(g_lld_mutex);
    r = lld::lldMain(argv, log_os, log_os, {{lld::Gnu, &lld::elf::link}});
  }
  log_os.flush();
  if (r.retCode != 0) return make_error(Errc::compile_failed, "lld failed to link the AMDGPU code object:\n" + log);
  std::ifstream file(out_path, std::ios::binary);
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (bytes.empty()) return make_error(Errc::compile_failed, "lld produced an empty code object:\n" + log);
  return bytes;
}

Result<CompiledCode> assemble_cubin(const std::string& ptx, const KernelSource& src) {
  KILN_ASSIGN_OR_RETURN(const NvJitLinkApi* api, nvjitlink_api());
  const std::string arch = fmt::format("-arch={}", src.target->cpu);
  const char* opts[] = {arch.c_str(), "-verbose"};
  nvJitLinkHandle handle = nullptr;
  if (api->__nvJitLinkCreate_13_0(&handle, 2, opts) != NVJITLINK_SUCCESS)
    return make_error(Errc::compile_failed, "nvJitLinkCreate failed");
  struct Guard {
    const NvJitLinkApi* api;
    nvJitLinkHandle* h;
    ~Guard() { api->__nvJitLinkDestroy_13_0(h); }
  } guard{api, &handle};
  auto log_of = [&](bool error) {
    size_t n = 0;
    (error ? api->__nvJitLinkGetErrorLogSize_13_0 : api->__nvJitLinkGetInfoLogSize_13_0)(handle, &n);
    std::string s(n, '\0');
    if (n) (error ? api->__nvJitLinkGetErrorLog_13_0 : api->__nvJitLinkGetInfoLog_13_0)(handle, s.data());
    while (!s.empty() && (s.back() == '\0' || s.back() == '\n')) s.pop_back();
    return s;
  };
  if (api->__nvJitLinkAddData_13_0(handle, NVJITLINK_INPUT_PTX, ptx.data(), ptx.size(), "kiln_kernel.ptx") !=
          NVJITLINK_SUCCESS ||
      api->__nvJitLinkComplete_13_0(handle) != NVJITLINK_SUCCESS)
    return make_error(Errc::compile_failed, "nvJitLink failed to assemble clang's PTX:\n" + log_of(true));
  size_t size = 0;
  api->__nvJitLinkGetLinkedCubinSize_13_0(handle, &size);
  CompiledCode out;
  out.code.format = "cubin";
  out.code.bytes.resize(size);
  api->__nvJitLinkGetLinkedCubin_13_0(handle, out.code.bytes.data());
  out.log = log_of(false);
  parse_ptxas_report(out.log, out.info);
  return out;
}

class ClangCompiler final : public Compiler {
 public:
  ClangCompiler() {
    LLVMInitializeAMDGPUTargetInfo();
    LLVMInitializeAMDGPUTarget();
    LLVMInitializeAMDGPUTargetMC();
    LLVMInitializeAMDGPUAsmPrinter();
    LLVMInitializeAMDGPUAsmParser();
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
  }
  std::string_view name() const override { return "clang"; }
  std::string version() const override { return clang_version(); }
  std::string flags(const TargetInfo& target) const override { return clang_flags(target); }
  bool supports(const TargetInfo&) const override { return true; }

  Result<CompiledCode> compile(const KernelSource& src) override {
    const auto start = std::chrono::steady_clock::now();
    CompiledCode out;
    if (src.target->vendor == Vendor::amd) {
      std::string warnings;
      KILN_ASSIGN_OR_RETURN(std::string object, run_frontend(src, ClangAction::object, &warnings));
      KILN_ASSIGN_OR_RETURN(out.code.bytes, link_hsaco(object));
      out.log = std::move(warnings);
      out.code.format = "hsaco";
      KILN_ASSIGN_OR_RETURN(out.info, read_amdgpu_metadata(out.code.bytes, src.kernel_name));
    } else {
      std::string warnings;
      KILN_ASSIGN_OR_RETURN(std::string ptx, run_frontend(src, ClangAction::assembly, &warnings));
      KILN_ASSIGN_OR_RETURN(out, assemble_cubin(ptx, src));
      if (!warnings.empty()) out.log = warnings + (out.log.empty() ? "" : "\n" + out.log);
    }
    out.info.kernel = src.kernel_name;
    out.info.wave_size = src.target->wave_size;
    out.compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return out;
  }

  Result<std::string> emit(const KernelSource& src, Emit what) override {
    return run_frontend(src, what == Emit::llvm_ir ? ClangAction::llvm_ir : ClangAction::assembly);
  }
};

}  // namespace

Result<Compiler*> clang_compiler() {
  static ClangCompiler* compiler = new ClangCompiler();
  return static_cast<Compiler*>(compiler);
}

}  // namespace kiln
