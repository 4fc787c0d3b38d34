#include "compile/amdgpu_code_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "compile/amdgpu_metadata.h"

#if KILN_WITH_LLVM
#include <llvm/MC/MCAsmInfo.h>
#include <llvm/MC/MCContext.h>
#include <llvm/MC/MCDisassembler/MCDisassembler.h>
#include <llvm/MC/MCInst.h>
#include <llvm/MC/MCInstPrinter.h>
#include <llvm/MC/MCInstrAnalysis.h>
#include <llvm/MC/MCInstrInfo.h>
#include <llvm/MC/MCRegisterInfo.h>
#include <llvm/MC/MCSubtargetInfo.h>
#include <llvm/MC/MCTargetOptions.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Object/ELFObjectFile.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/TargetParser/Triple.h>
#endif

namespace kiln {

int amd_lds_bytes_per_cu(const TargetInfo& target) { return target.name == "gfx950" ? 163840 : 65536; }

int occupancy_waves_per_cu(int vgprs, int agprs, int lds_bytes, int threads, int lds_per_cu, std::string* limit) {
  auto granule = [](int n) { return (std::max(n, 1) + 7) / 8 * 8; };
  // Unified register file: the arch VGPRs, then the AGPRs from the next granule.
  const int regs = granule(std::max(vgprs, 0)) + (agprs > 0 ? granule(agprs) : 0);
  int per_simd = 8;
  std::string why = "waves";
  const int by_regs = 512 / regs;
  if (by_regs < per_simd) per_simd = by_regs, why = "VGPRs+AGPRs";
  // Whole workgroups: a workgroup's waves are dealt over the CU's 4 SIMDs (a 2-wave workgroup
  // takes a wave slot on two of them), so the registers hold 4 x per_simd / waves_per_block of
  // them per CU, and the LDS lds_per_cu / lds_bytes.
  const int waves_per_block = std::max(1, (threads + 63) / 64);
  int blocks = 4 * per_simd / waves_per_block;
  if (lds_bytes > 0) {
    const int by_lds = lds_per_cu / lds_bytes;
    if (by_lds < blocks) blocks = by_lds, why = "LDS";
  }
  if (blocks * waves_per_block < 4 * per_simd && why == "waves") why = "workgroup size";
  if (limit) *limit = why;
  return blocks * waves_per_block;
}

int occupancy_waves_per_simd(int vgprs, int agprs, int lds_bytes, int threads, int lds_per_cu, std::string* limit) {
  return (occupancy_waves_per_cu(vgprs, agprs, lds_bytes, threads, lds_per_cu, limit) + 3) / 4;
}

namespace {
[[maybe_unused]] void count(InstructionMix& mix, std::string_view op) {  // unused without LLVM
  ++mix.total;
  auto starts = [&](std::string_view p) { return op.substr(0, p.size()) == p; };
  if (starts("v_mfma")) ++mix.mfma;
  else if (starts("ds_")) ++mix.lds;
  else if (starts("global_") || starts("buffer_") || starts("flat_")) ++mix.global;
  else if (starts("s_waitcnt")) ++mix.waitcnt;
  else if (starts("s_barrier")) ++mix.barrier;
  else if (starts("v_")) ++mix.valu;
  else ++mix.salu;
}
}  // namespace

#if KILN_WITH_LLVM
Result<AmdgpuCodeReport> amdgpu_code_report(std::span<const uint8_t> hsaco, const std::string& kernel,
                                            const TargetInfo& target, int threads) {
  AmdgpuCodeReport r;
  KILN_ASSIGN_OR_RETURN(r.meta, read_amdgpu_metadata(hsaco, kernel));
  r.waves_per_cu = occupancy_waves_per_cu(r.meta.registers, r.meta.agprs, r.meta.shared_bytes, threads,
                                          amd_lds_bytes_per_cu(target), &r.occupancy_limit);
  r.waves_per_simd = (r.waves_per_cu + 3) / 4;

  // The kernel's code: its function symbol's bytes in .text.
  llvm::StringRef data(reinterpret_cast<const char*>(hsaco.data()), hsaco.size());
  auto obj = llvm::object::ELF64LEObjectFile::create(llvm::MemoryBufferRef(data, "code object"));
  if (!obj) {
    llvm::consumeError(obj.takeError());
    return make_error(Errc::corrupt, "the AMDGPU code object is not a 64-bit ELF file");
  }
  llvm::StringRef code;
  for (const llvm::object::ELFSymbolRef sym : obj->symbols()) {
    auto name = sym.getName();
    auto type = sym.getType();
    auto section = sym.getSection();
    if (!name || !type || !section) {
      if (!name) llvm::consumeError(name.takeError());
      if (!type) llvm::consumeError(type.takeError());
      if (!section) llvm::consumeError(section.takeError());
      continue;
    }
    if (*name != kernel || *type != llvm::object::SymbolRef::ST_Function || *section == obj->section_end()) continue;
    auto contents = (*section)->getContents();
    if (!contents) {
      llvm::consumeError(contents.takeError());
      continue;
    }
    auto value = sym.getValue();
    if (!value) {
      llvm::consumeError(value.takeError());
      continue;
    }
    const uint64_t offset = *value - (*section)->getAddress(), size = sym.getSize();
    if (offset + size > contents->size()) continue;
    code = contents->substr(offset, size);
  }
  if (code.empty())
    return make_error(Errc::corrupt, fmt::format("the AMDGPU code object has no code for kernel '{}'", kernel));

  LLVMInitializeAMDGPUTargetInfo();
  LLVMInitializeAMDGPUTargetMC();
  LLVMInitializeAMDGPUDisassembler();
  const llvm::Triple triple(std::string(target.llvm_triple));
  std::string error;
  const llvm::Target* t = llvm::TargetRegistry::lookupTarget(triple, error);
  if (!t) return make_error(Errc::unsupported, "LLVM has no AMDGPU target: " + error);
  std::unique_ptr<llvm::MCRegisterInfo> mri(t->createMCRegInfo(triple));
  llvm::MCTargetOptions options;
  std::unique_ptr<llvm::MCAsmInfo> mai(t->createMCAsmInfo(*mri, triple, options));
  std::unique_ptr<llvm::MCSubtargetInfo> sti(t->createMCSubtargetInfo(triple, std::string(target.cpu), ""));
  std::unique_ptr<llvm::MCInstrInfo> mii(t->createMCInstrInfo());
  if (!mri || !mai || !sti || !mii) return make_error(Errc::unsupported, "LLVM's AMDGPU MC layer is incomplete");
  llvm::MCContext ctx(triple, mai.get(), mri.get(), sti.get());
  std::unique_ptr<llvm::MCDisassembler> dis(t->createMCDisassembler(*sti, ctx));
  std::unique_ptr<llvm::MCInstPrinter> printer(
      t->createMCInstPrinter(triple, mai->getAssemblerDialect(), *mai, *mii, *mri));
  std::unique_ptr<llvm::MCInstrAnalysis> analysis(t->createMCInstrAnalysis(mii.get()));
  if (!dis || !printer || !analysis) return make_error(Errc::unsupported, "LLVM has no AMDGPU disassembler");

  struct Decoded {
    uint64_t at;
    std::string op;  // mnemonic
  };
  std::vector<Decoded> insts;
  std::vector<std::pair<uint64_t, uint64_t>> loops;  // (head, back branch)
  const llvm::ArrayRef<uint8_t> bytes(reinterpret_cast<const uint8_t*>(code.data()), code.size());
  for (uint64_t at = 0; at < bytes.size();) {
    llvm::MCInst inst;
    uint64_t size = 0;
    if (dis->getInstruction(inst, size, bytes.slice(at), at, llvm::nulls()) != llvm::MCDisassembler::Success ||
        size == 0) {
      // s_code_end padding after s_endpgm decodes; anything else undecodable ends the walk.
      if (std::any_of(insts.begin(), insts.end(), [](const Decoded& d) { return d.op == "s_endpgm"; })) break;
      return make_error(Errc::corrupt, fmt::format("kernel '{}': undecodable {} machine code at byte {}", kernel,
                                                   target.name, at));
    }
    std::string text;
    llvm::raw_string_ostream os(text);
    printer->printInst(&inst, at, "", *sti, os);
    os.flush();
    const size_t b = text.find_first_not_of(" \t");
    const size_t e = text.find_first_of(" \t", b == std::string::npos ? 0 : b);
    std::string op = b == std::string::npos ? "" : text.substr(b, e == std::string::npos ? std::string::npos : e - b);
    uint64_t dest = 0;
    if (mii->get(inst.getOpcode()).isBranch() && analysis->evaluateBranch(inst, at, size, dest) && dest <= at)
      loops.emplace_back(dest, at);
    if (op != "s_code_end") {
      count(r.kernel, op);
      insts.push_back({at, std::move(op)});
    }
    at += size;
  }
  for (const auto& [head, back] : loops) {
    InstructionMix mix;
    for (const Decoded& d : insts)
      if (d.at >= head && d.at <= back) count(mix, d.op);
    const InstructionMix& best = r.hot_loop.mix;
    // A loop whose body has a conditional block (the k-loop's "stage the next tile" part) has
    // two back branches to one head: the larger range is the whole body.
    const bool better = !r.hot_loop.found || mix.mfma > best.mfma || (mix.mfma == best.mfma && mix.total > best.total);
    if (better) r.hot_loop = {true, head, back, mix};
  }
  return r;
}
#else
Result<AmdgpuCodeReport> amdgpu_code_report(std::span<const uint8_t>, const std::string&, const TargetInfo&, int) {
  return make_error(Errc::unsupported,
                    "the AMDGPU code report needs LLVM's disassembler: this Kiln was built without LLVM (KILN_WITH_LLVM=OFF)");
}
#endif

}  // namespace kiln
