#include "templates/lib/library.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <regex>
#include <set>

#include "support/embedded.h"

namespace kiln {
namespace {

// name, AMD, NVIDIA, summary. Alphabetical; every row has its file templates/lib/<name>.kernel
// (Library.EveryPartIsEmbeddedAndCompiles checks both ways).
constexpr std::array kParts = {
    LibraryPart{"amd_vectors", true, false, "ext_vector_type registers of MFMA and 16-byte accesses (u32x4, f32x16, ...)"},
    LibraryPart{"attention", true, true, "attention masks (causal, sliding window), softcap tanh, LDS tile loads and dot products"},
    LibraryPart{"attention_sm90", false, true, "sm_90a attention registers: bf16/fp16 A fragments, quad reductions, Q K^T and P V WGMMAs"},
    LibraryPart{"cross_entropy", true, true, "cross-entropy's gradient: the row's factors (dloss, label smoothing, z-loss), one access's gradients, and the fill of a row with no loss term (includes pack)"},
    LibraryPart{"elementwise_row", true, true, "an elementwise-row kernel's block: its row and its chunk of the row, row-major or chunk-major launch order"},
    LibraryPart{"epilogue_sm90", false, true, "sm_90a GEMM epilogue: fp32 accumulators to C through swizzled shared-memory chunks and TMA stores"},
    LibraryPart{"fp8", true, true, "fp8 storage types (OCP e4m3/e5m2, FNUZ), round-to-nearest-even saturating conversions"},
    LibraryPart{"fp8_mfma", true, false, "fp8 MFMA steps of 64 k (gfx942 32x32x16, gfx950 32x32x64) and the K-major fp8 row staging through LDS"},
    LibraryPart{"fp8_row", true, true, "fp8 scales (current and delayed), the amax-history push, one row quantized from registers"},
    LibraryPart{"fp8_sm90", false, true, "sm_90a fp8 GEMM pieces: cp.async of K-major fp8 rows into swizzled 128-byte lines, blockwise promotion of WGMMA accumulators"},
    LibraryPart{"grouped", true, true, "grouped GEMM tiles: a block's group and tile of c from the group offsets on the device"},
    LibraryPart{"grouped_sm90", false, true, "sm_90a grouped GEMM scheduler: offsets and row-tile prefix in shared memory, a persistent tile's group (m-grouped) or its c[g] tile (k-grouped), bounded stores at a group's end, a k-grouped tile's stores"},
    LibraryPart{"load_hints", true, true, "16-byte global loads with L1/L2 eviction hints on sm_90a (plain loads elsewhere)"},
    LibraryPart{"mbarrier", false, true, "sm_90a mbarriers: init, arrive, expect_tx, parity wait"},
    LibraryPart{"mfma", true, false, "CDNA3/CDNA4 MFMA: 32x32x8, 16x16x16 and gfx950's 32x32x16, 16x16x32 (bf16/fp16); fp8/bf8 32x32x16 and gfx950's 32x32x64"},
    LibraryPart{"moe_rows", true, true, "MoE permutation rows: scatter a token row to its K expert rows, gather (weighted) sums of them"},
    LibraryPart{"pack", true, true, "Pack<T, N>: N elements per load or store (16-byte vectors); opaque()"},
    LibraryPart{"reduce", true, true, "lane-group, wavefront and block sum/max reductions; column sums of per-block partials"},
    LibraryPart{"rope", true, true, "rotary position embedding of one token's q and k heads: sin/cos, rotate-half and interleaved pairs"},
    LibraryPart{"sm90", false, true, "sm_90a basics: shared addresses, proxy fence, named barriers, setmaxnreg, cp.async, grouped tile order"},
    LibraryPart{"softmax", true, true, "online softmax: running max and sum, rescale, merge, logsumexp"},
    LibraryPart{"tma", false, true, "sm_90a TMA: tensor-map tile loads on mbarriers, tile stores, bulk groups"},
    LibraryPart{"wgmma", false, true, "sm_90a WGMMA m64nNk16 (bf16/fp16, fp32 accumulators), descriptors, 128-byte swizzle"},
};

std::string part_names() {
  std::string names;
  for (const LibraryPart& p : kParts) names += fmt::format("{}{}", names.empty() ? "" : ", ", p.name);
  return names;
}

// One `#include` line of a template: the part it names, or "" for an include of anything else.
struct IncludeLine {
  size_t begin, end;  // the line's bytes, without its newline
  int number;         // 1-based
  std::string part;
  std::string text;
};

std::vector<IncludeLine> include_lines(std::string_view text) {
  static const std::regex any_include(R"(^\s*#\s*include\b.*$)");
  static const std::regex lib_include(R"(^\s*#\s*include\s*"lib/([A-Za-z0-9_]+)\.kernel"\s*(//.*)?$)");
  std::vector<IncludeLine> out;
  size_t begin = 0;
  int number = 1;
  while (begin <= text.size()) {
    size_t end = text.find('\n', begin);
    if (end == std::string_view::npos) end = text.size();
    const std::string line(text.substr(begin, end - begin));
    std::smatch m;
    if (line.find("include") != std::string::npos && std::regex_match(line, any_include)) {
      IncludeLine l{begin, end, number, "", line};
      if (std::regex_match(line, m, lib_include)) l.part = m[1].str();
      out.push_back(std::move(l));
    }
    if (end == text.size()) break;
    begin = end + 1;
    ++number;
  }
  return out;
}

struct Expander {
  const TargetInfo& target;
  ExpandedTemplate out;
  std::set<std::string> done;
  std::vector<std::string> stack;  // parts being expanded, outermost first

  // The text with its library lines replaced by comments; the parts they name expanded first.
  Result<std::string> expand(std::string_view text, std::string_view who) {
    std::string body;
    size_t copied = 0;
    for (const IncludeLine& l : include_lines(text)) {
      if (l.part.empty())
        return make_error(Errc::invalid_argument,
                          fmt::format("{}, line {}: '{}': device sources include nothing but library parts "
                                      "(#include \"lib/<part>.kernel\"; parts: {})",
                                      who, l.number, l.text, part_names()));
      KILN_TRY(use(l.part, who, l.number));
      body.append(text.substr(copied, l.begin - copied));
      body += fmt::format("// lib/{}.kernel: in the library section above", l.part);
      copied = l.end;
    }
    body.append(text.substr(copied));
    return body;
  }

  Result<void> use(const std::string& name, std::string_view who, int line) {
    if (done.count(name)) return ok();
    if (std::find(stack.begin(), stack.end(), name) != stack.end()) {
      std::string cycle;
      for (const std::string& s : stack) cycle += s + " -> ";
      return make_error(Errc::invalid_argument,
                        fmt::format("{}, line {}: library parts include each other: {}{}", who, line, cycle, name));
    }
    auto part = find_library_part(name);
    if (!part)
      return make_error(Errc::invalid_argument, fmt::format("{}, line {}: {}", who, line, part.error().message));
    if (!(*part)->serves(target))
      return make_error(Errc::invalid_argument,
                        fmt::format("{}, line {}: library part '{}' is for {} targets, not {} ({})", who, line, name,
                                    (*part)->amd ? "AMD" : "NVIDIA", target.name, (*part)->summary));
    const std::string_view text = library_part_text(**part);
    if (text.empty())
      return make_error(Errc::invalid_argument,
                        fmt::format("library part '{}': templates/lib/{}.kernel is not embedded in this build", name, name));
    stack.push_back(name);
    auto body = expand(text, fmt::format("library part '{}'", name));
    stack.pop_back();
    if (!body) return body.error();
    done.insert(name);
    out.parts.push_back(name);
    out.library += fmt::format("// ---- library: {} ----\n{}", name, *body);
    if (!out.library.ends_with('\n')) out.library += '\n';
    return ok();
  }
};

}  // namespace

std::span<const LibraryPart> library_parts() { return kParts; }

Result<const LibraryPart*> find_library_part(std::string_view name) {
  for (const LibraryPart& p : kParts)
    if (p.name == name) return &p;
  return make_error(Errc::not_found, fmt::format("unknown library part '{}'; the library (templates/lib/) has: {}",
                                               name, part_names()));
}

std::string_view library_part_text(const LibraryPart& part) {
  return embedded_file(fmt::format("templates/lib/{}.kernel", part.name));
}

Result<ExpandedTemplate> expand_library(std::string_view device_template, const TargetInfo& target,
                                        std::string_view who) {
  Expander e{target, {}, {}, {}};
  KILN_ASSIGN_OR_RETURN(std::string body, e.expand(device_template, who));
  e.out.body = std::move(body);
  return std::move(e.out);
}

}  // namespace kiln
