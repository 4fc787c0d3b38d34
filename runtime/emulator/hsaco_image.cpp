#include "runtime/emulator/hsaco_image.h"

#include <fmt/format.h>
#include <llvm/BinaryFormat/ELF.h>
#include <llvm/BinaryFormat/MsgPackDocument.h>
#include <llvm/Object/ELF.h>
#include <llvm/Support/AMDHSAKernelDescriptor.h>

#include <algorithm>
#include <cstring>

namespace kiln {
namespace {

namespace hsa = llvm::amdhsa;
using Elf = llvm::object::ELF64LEFile;

// A code object image larger than this is not one of Kiln's (they are a few KiB): refuse it
// rather than allocate what a corrupt p_memsz asks for.
constexpr uint64_t kMaxImageBytes = 64ull << 20;

Error corrupt(const std::string& kernel, const std::string& what) {
  return make_error(Errc::corrupt, fmt::format("code object of kernel '{}': {}", kernel, what));
}

template <class T>
std::string take_message(llvm::Expected<T>& e) {
  std::string text = llvm::toString(e.takeError());
  return text;
}

int64_t msgpack_int(const llvm::msgpack::DocNode& node) {
  if (node.getKind() == llvm::msgpack::Type::UInt) return static_cast<int64_t>(node.getUInt());
  if (node.getKind() == llvm::msgpack::Type::Int) return node.getInt();
  return -1;
}

// The kernel's entry of amdhsa.kernels and the amdhsa.target string, from the metadata note.
Result<void> read_metadata(const Elf& file, const std::string& kernel, HsacoKernel& out, std::string& symbol) {
  auto phdrs = file.program_headers();
  if (!phdrs) return corrupt(kernel, "no program headers: " + take_message(phdrs));
  for (const auto& phdr : *phdrs) {
    if (phdr.p_type != llvm::ELF::PT_NOTE) continue;
    llvm::Error err = llvm::Error::success();
    for (const auto& note : file.notes(phdr, err)) {
      if (note.getName() != "AMDGPU" || note.getType() != llvm::ELF::NT_AMDGPU_METADATA) continue;
      llvm::msgpack::Document doc;
      auto desc = note.getDesc(phdr.p_align);
      if (!doc.readFromBlob(llvm::StringRef(reinterpret_cast<const char*>(desc.data()), desc.size()), false))
        return corrupt(kernel, "the AMDGPU metadata note is not valid msgpack");
      auto& root = doc.getRoot();
      if (!root.isMap()) return corrupt(kernel, "the AMDGPU metadata is not a map");
      auto& map = root.getMap();
      if (auto t = map.find("amdhsa.target"); t != map.end() && t->second.isString()) {
        // "amdgcn-amd-amdhsa--gfx942" or "...--gfx942:sramecc+:xnack-".
        std::string target = t->second.getString().str();
        target = target.substr(target.rfind('-') + 1);
        out.target = target.substr(0, target.find(':'));
      }
      auto kernels = map.find("amdhsa.kernels");
      if (kernels == map.end() || !kernels->second.isArray()) return corrupt(kernel, "the metadata has no amdhsa.kernels");
      for (auto& k : kernels->second.getArray()) {
        if (!k.isMap()) continue;
        auto& m = k.getMap();
        auto name = m.find(".name");
        if (name == m.end() || !name->second.isString() || name->second.getString() != kernel) continue;
        if (auto s = m.find(".symbol"); s != m.end() && s->second.isString()) symbol = s->second.getString().str();
        if (auto w = m.find(".wavefront_size"); w != m.end() && msgpack_int(w->second) != 64)
          return make_error(Errc::unsupported,
                            fmt::format("kernel '{}' is wave{}; the CDNA emulator runs wave64 code", kernel,
                                        msgpack_int(w->second)));
        auto size = m.find(".kernarg_segment_size");
        if (size == m.end() || msgpack_int(size->second) < 0)
          return corrupt(kernel, "the metadata has no .kernarg_segment_size");
        out.kernarg_bytes = static_cast<uint32_t>(std::min<int64_t>(msgpack_int(size->second), 1 << 16));
        if (auto args = m.find(".args"); args != m.end() && args->second.isArray()) {
          for (auto& a : args->second.getArray()) {
            if (!a.isMap()) return corrupt(kernel, "an entry of .args is not a map");
            auto& am = a.getMap();
            auto off = am.find(".offset"), sz = am.find(".size"), kind = am.find(".value_kind");
            if (off == am.end() || sz == am.end() || kind == am.end() || !kind->second.isString())
              return corrupt(kernel, "an entry of .args lacks .offset, .size or .value_kind");
            const int64_t o = msgpack_int(off->second), s = msgpack_int(sz->second);
            if (o < 0 || s < 0 || o + s > out.kernarg_bytes)
              return corrupt(kernel, fmt::format("argument {} (offset {}, {} bytes) lies outside the {}-byte kernarg "
                                                 "segment",
                                                 out.args.size(), o, s, out.kernarg_bytes));
            KernargSlot slot{static_cast<uint32_t>(o), static_cast<uint32_t>(s), kind->second.getString().str()};
            if (!slot.hidden()) {
              if (out.explicit_args != out.args.size())
                return corrupt(kernel, "an explicit argument follows a hidden one in .args");
              ++out.explicit_args;
            }
            out.args.push_back(std::move(slot));
          }
        }
        return ok();
      }
      return corrupt(kernel, "the metadata lists no kernel of that name");
    }
    if (err) llvm::consumeError(std::move(err));
  }
  return corrupt(kernel, "no AMDGPU metadata note (NT_AMDGPU_METADATA)");
}

// The address of `symbol` in the dynamic symbol table.
Result<uint64_t> find_symbol(const Elf& file, const std::string& kernel, const std::string& symbol) {
  auto sections = file.sections();
  if (!sections) return corrupt(kernel, "bad section headers: " + take_message(sections));
  for (const auto& sec : *sections) {
    if (sec.sh_type != llvm::ELF::SHT_DYNSYM && sec.sh_type != llvm::ELF::SHT_SYMTAB) continue;
    auto syms = file.symbols(&sec);
    if (!syms) return corrupt(kernel, "bad symbol table: " + take_message(syms));
    auto strtab = file.getStringTableForSymtab(sec);
    if (!strtab) return corrupt(kernel, "bad symbol names: " + take_message(strtab));
    for (const auto& sym : *syms) {
      auto name = sym.getName(*strtab);
      if (!name) {
        llvm::consumeError(name.takeError());
        continue;
      }
      if (*name == symbol) return static_cast<uint64_t>(sym.st_value);
    }
  }
  return corrupt(kernel, fmt::format("no symbol '{}' (the kernel descriptor)", symbol));
}

}  // namespace

Result<HsacoKernel> read_hsaco_kernel(std::span<const uint8_t> hsaco, const std::string& kernel) {
  llvm::StringRef data(reinterpret_cast<const char*>(hsaco.data()), hsaco.size());
  auto created = Elf::create(data);
  if (!created) return corrupt(kernel, "not a 64-bit ELF file: " + take_message(created));
  const Elf& file = *created;
  const auto& header = file.getHeader();
  if (header.e_machine != llvm::ELF::EM_AMDGPU || header.e_type != llvm::ELF::ET_DYN)
    return corrupt(kernel, fmt::format("not an AMDGPU shared object (e_machine {}, e_type {})",
                                       static_cast<int>(header.e_machine), static_cast<int>(header.e_type)));
  HsacoKernel k;
  std::string symbol = kernel + ".kd";
  KILN_TRY(read_metadata(file, kernel, k, symbol));

  // The loaded image: PT_LOAD segments at their virtual addresses.
  auto phdrs = file.program_headers();
  if (!phdrs) return corrupt(kernel, "no program headers: " + take_message(phdrs));
  uint64_t end = 0;
  for (const auto& p : *phdrs) {
    if (p.p_type != llvm::ELF::PT_LOAD) continue;
    if (p.p_filesz > p.p_memsz || p.p_offset > hsaco.size() || p.p_filesz > hsaco.size() - p.p_offset ||
        p.p_vaddr > kMaxImageBytes || p.p_memsz > kMaxImageBytes - p.p_vaddr)
      return corrupt(kernel, "a PT_LOAD segment lies outside the file or is implausibly large");
    end = std::max<uint64_t>(end, p.p_vaddr + p.p_memsz);
  }
  if (end == 0) return corrupt(kernel, "no PT_LOAD segment");
  k.image.assign(end + HsacoKernel::kImageSlack, 0);
  for (const auto& p : *phdrs)
    if (p.p_type == llvm::ELF::PT_LOAD && p.p_filesz > 0)
      std::memcpy(k.image.data() + p.p_vaddr, hsaco.data() + p.p_offset, p.p_filesz);

  // Kiln's kernels need no relocation (the descriptor's entry is relative); a code object that
  // does (global data with absolute addresses) would run wrongly here, so refuse it.
  if (auto sections = file.sections()) {
    for (const auto& sec : *sections)
      if ((sec.sh_type == llvm::ELF::SHT_RELA || sec.sh_type == llvm::ELF::SHT_REL) &&
          (sec.sh_flags & llvm::ELF::SHF_ALLOC) && sec.sh_size > 0)
        return make_error(Errc::unsupported,
                          fmt::format("code object of kernel '{}' has dynamic relocations; the emulator backend "
                                      "loads position-independent code objects without a loader",
                                      kernel));
  } else {
    return corrupt(kernel, "bad section headers: " + take_message(sections));
  }

  KILN_ASSIGN_OR_RETURN(k.descriptor, find_symbol(file, kernel, symbol));
  if (k.descriptor > end || end - k.descriptor < sizeof(hsa::kernel_descriptor_t))
    return corrupt(kernel, "the kernel descriptor lies outside the loaded image");
  hsa::kernel_descriptor_t kd;
  std::memcpy(&kd, k.image.data() + k.descriptor, sizeof(kd));
  const int64_t entry = static_cast<int64_t>(k.descriptor) + kd.kernel_code_entry_byte_offset;
  if (entry < 0 || static_cast<uint64_t>(entry) >= end)
    return corrupt(kernel, "the kernel code entry lies outside the loaded image");
  k.entry = static_cast<uint64_t>(entry);
  k.group_segment_bytes = kd.group_segment_fixed_size;
  k.private_segment_bytes = kd.private_segment_fixed_size;
  k.rsrc2 = kd.compute_pgm_rsrc2;
  k.code_properties = kd.kernel_code_properties;
  if (kd.kernarg_preload != 0)
    return make_error(Errc::unsupported,
                      fmt::format("kernel '{}' preloads kernel arguments into SGPRs; the emulator backend does not "
                                  "set that up",
                                  kernel));
  if (k.code_properties & hsa::KERNEL_CODE_PROPERTY_ENABLE_WAVEFRONT_SIZE32)
    return make_error(Errc::unsupported, fmt::format("kernel '{}' is wave32; the CDNA emulator runs wave64 code", kernel));
  return k;
}

Result<Dispatch> prepare_dispatch(const HsacoKernel& k, void* const* args, const DispatchShape& s,
                                  uint64_t kernarg_address, uint64_t packet_address, uint64_t queue_address) {
  uint64_t threads = 1;
  for (int i = 0; i < 3; ++i) {
    if (s.grid[i] == 0 || s.block[i] == 0)
      return make_error(Errc::invalid_argument,
                        fmt::format("launch of a {}x{}x{} grid of {}x{}x{} blocks: every dimension must be >= 1",
                                    s.grid[0], s.grid[1], s.grid[2], s.block[0], s.block[1], s.block[2]));
    threads *= s.block[i];
  }
  if (threads > 1024)
    return make_error(Errc::invalid_argument, fmt::format("a block of {} work-items; AMD GPUs allow 1024", threads));

  Dispatch d;
  // Kernarg segment: explicit arguments as passed, hidden ones as the HIP runtime fills them.
  d.kernarg.assign(std::max<uint32_t>(k.kernarg_bytes, 1), 0);
  auto put = [&](const KernargSlot& slot, uint64_t value) {
    std::memcpy(d.kernarg.data() + slot.offset, &value, std::min<size_t>(slot.size, sizeof(value)));
  };
  const int dims = s.grid[2] > 1 || s.block[2] > 1 ? 3 : (s.grid[1] > 1 || s.block[1] > 1 ? 2 : 1);
  for (size_t i = 0; i < k.args.size(); ++i) {
    const KernargSlot& slot = k.args[i];
    if (!slot.hidden()) {
      if (slot.size > 0) std::memcpy(d.kernarg.data() + slot.offset, args[i], slot.size);
      continue;
    }
    const std::string_view kind = std::string_view(slot.value_kind).substr(7);  // past "hidden_"
    const int axis = kind.empty() ? 0 : (kind.back() == 'y' ? 1 : (kind.back() == 'z' ? 2 : 0));
    if (kind.starts_with("block_count_")) put(slot, s.grid[axis]);
    else if (kind.starts_with("group_size_")) put(slot, s.block[axis]);
    else if (kind == "grid_dims") put(slot, static_cast<uint64_t>(dims));
    else if (kind == "dynamic_lds_size") put(slot, s.dynamic_lds_bytes);
    // remainder_* (whole workgroups only), global_offset_*, and pointers to runtime services
    // (hostcall, printf, heap, queue, completion action) stay 0.
  }

  // hsa_kernel_dispatch_packet_t: setup (dimensions), workgroup size (u16 x3), grid size in
  // work-items (u32 x3), segment sizes, kernarg address.
  auto at = [&](size_t offset, auto value) { std::memcpy(d.packet.data() + offset, &value, sizeof(value)); };
  at(2, static_cast<uint16_t>(dims));
  for (int i = 0; i < 3; ++i) {
    at(4 + 2 * i, static_cast<uint16_t>(s.block[i]));
    at(12 + 4 * i, static_cast<uint32_t>(std::min<uint64_t>(uint64_t{s.grid[i]} * s.block[i], UINT32_MAX)));
  }
  at(24, k.private_segment_bytes);
  at(28, k.group_segment_bytes + s.dynamic_lds_bytes);
  at(40, kernarg_address);

  // User SGPRs, in the ABI's order, for the features the kernel enabled.
  auto push64 = [&](uint64_t v) {
    d.user_sgprs.push_back(static_cast<uint32_t>(v));
    d.user_sgprs.push_back(static_cast<uint32_t>(v >> 32));
  };
  const uint16_t p = k.code_properties;
  if (p & hsa::KERNEL_CODE_PROPERTY_ENABLE_SGPR_PRIVATE_SEGMENT_BUFFER) d.user_sgprs.insert(d.user_sgprs.end(), 4, 0);
  if (p & hsa::KERNEL_CODE_PROPERTY_ENABLE_SGPR_DISPATCH_PTR) push64(packet_address);
  if (p & hsa::KERNEL_CODE_PROPERTY_ENABLE_SGPR_QUEUE_PTR) push64(queue_address);
  if (p & hsa::KERNEL_CODE_PROPERTY_ENABLE_SGPR_KERNARG_SEGMENT_PTR) push64(kernarg_address);
  if (p & hsa::KERNEL_CODE_PROPERTY_ENABLE_SGPR_DISPATCH_ID) push64(0);
  if (p & hsa::KERNEL_CODE_PROPERTY_ENABLE_SGPR_FLAT_SCRATCH_INIT) push64(0);
  if (p & hsa::KERNEL_CODE_PROPERTY_ENABLE_SGPR_PRIVATE_SEGMENT_SIZE) d.user_sgprs.push_back(k.private_segment_bytes);
  const uint32_t user_count = (k.rsrc2 & hsa::COMPUTE_PGM_RSRC2_GFX6_GFX120_USER_SGPR_COUNT) >>
                              hsa::COMPUTE_PGM_RSRC2_GFX6_GFX120_USER_SGPR_COUNT_SHIFT;
  if (d.user_sgprs.size() > user_count)
    return make_error(Errc::unsupported, fmt::format("the kernel enables {} user SGPRs but its descriptor reserves {}",
                                                     d.user_sgprs.size(), user_count));
  d.user_sgprs.resize(user_count, 0);

  // LDS: the packet processor sizes it from the group segment; the emulator reads rsrc2.
  const uint64_t lds = uint64_t{k.group_segment_bytes} + s.dynamic_lds_bytes;
  const uint64_t granules = (lds + 511) / 512;
  constexpr uint32_t kLdsMask = hsa::COMPUTE_PGM_RSRC2_GRANULATED_LDS_SIZE;
  constexpr uint32_t kLdsShift = hsa::COMPUTE_PGM_RSRC2_GRANULATED_LDS_SIZE_SHIFT;
  if (granules > (kLdsMask >> kLdsShift))
    return make_error(Errc::unsupported, fmt::format("a workgroup of {} bytes of LDS is beyond the emulator's limit", lds));
  d.rsrc2 = (k.rsrc2 & ~kLdsMask) | static_cast<uint32_t>(granules << kLdsShift);
  return d;
}

}  // namespace kiln
