#include "compile/amdgpu_metadata.h"

#include <fmt/format.h>
#include <llvm/BinaryFormat/ELF.h>
#include <llvm/BinaryFormat/MsgPackDocument.h>
#include <llvm/Object/ELFObjectFile.h>
#include <llvm/Support/MemoryBuffer.h>

namespace kiln {

Result<CodeObjectInfo> read_amdgpu_metadata(std::span<const uint8_t> hsaco, const std::string& kernel) {
  llvm::StringRef data(reinterpret_cast<const char*>(hsaco.data()), hsaco.size());
  auto file = llvm::object::ELF64LEFile::create(data);
  if (!file) {
    llvm::consumeError(file.takeError());
    return make_error(Errc::corrupt, "the AMDGPU code object is not a 64-bit ELF file");
  }
  const auto& header = file->getHeader();
  if (header.e_machine != llvm::ELF::EM_AMDGPU || header.e_type != llvm::ELF::ET_DYN)
    return make_error(Errc::corrupt, fmt::format("the code object is not an AMDGPU shared object "
                                                 "(e_machine {}, e_type {})",
                                                 header.e_machine, header.e_type));
  auto phdrs = file->program_headers();
  if (!phdrs) {
    llvm::consumeError(phdrs.takeError());
    return make_error(Errc::corrupt, "the AMDGPU code object has no program headers");
  }
  for (const auto& phdr : *phdrs) {
    if (phdr.p_type != llvm::ELF::PT_NOTE) continue;
    llvm::Error err = llvm::Error::success();
    for (const auto& note : file->notes(phdr, err)) {
      if (note.getName() != "AMDGPU" || note.getType() != llvm::ELF::NT_AMDGPU_METADATA) continue;
      llvm::msgpack::Document doc;
      auto desc = note.getDesc(phdr.p_align);
      if (!doc.readFromBlob(llvm::StringRef(reinterpret_cast<const char*>(desc.data()), desc.size()), false))
        return make_error(Errc::corrupt, "the AMDGPU metadata note is not valid msgpack");
      auto& root = doc.getRoot();
      if (!root.isMap()) break;
      auto kernels = root.getMap().find("amdhsa.kernels");
      if (kernels == root.getMap().end() || !kernels->second.isArray()) break;
      for (auto& k : kernels->second.getArray()) {
        if (!k.isMap()) continue;
        auto& m = k.getMap();
        auto str = [&](const char* key) -> std::string {
          auto it = m.find(key);
          return it != m.end() && it->second.isString() ? it->second.getString().str() : "";
        };
        auto num = [&](const char* key) -> int {
          auto it = m.find(key);
          if (it == m.end()) return -1;
          if (it->second.getKind() == llvm::msgpack::Type::UInt) return static_cast<int>(it->second.getUInt());
          if (it->second.getKind() == llvm::msgpack::Type::Int) return static_cast<int>(it->second.getInt());
          return -1;
        };
        if (str(".name") != kernel) continue;
        CodeObjectInfo info;
        info.kernel = kernel;
        info.registers = num(".vgpr_count");
        info.sgprs = num(".sgpr_count");
        info.agprs = num(".agpr_count");
        info.shared_bytes = num(".group_segment_fixed_size");
        info.scratch_bytes = num(".private_segment_fixed_size");
        const int vs = num(".vgpr_spill_count"), ss = num(".sgpr_spill_count");
        info.spill_stores = (vs < 0 ? 0 : vs) + (ss < 0 ? 0 : ss);
        info.wave_size = num(".wavefront_size");
        return info;
      }
    }
    if (err) llvm::consumeError(std::move(err));
  }
  return make_error(Errc::corrupt,
                    fmt::format("the AMDGPU code object has no metadata for kernel '{}'", kernel));
}

}  // namespace kiln
