// Codegen and the cache key: determinism, and exactly the right things change the key.
#include <fmt/format.h>

#include <filesystem>
#include <set>

#include "templates/lib/library.h"
#include "templates/registry.h"
#include "cache/cache_key.h"
#include "codegen/codegen.h"
#include "compile/compiler.h"
#include "support/embedded.h"
#include "support/sha256.h"
#include "test_util.h"

namespace kiln {
namespace {
using testing::gemm_spec;
using testing::rmsnorm_spec;
using testing::swiglu_spec;
using testing::target;

std::string key_of(const KernelSpec& spec, const char* t, const char* compiler = "nvrtc") {
  auto src = generate(spec, target(t));
  EXPECT_TRUE(src.ok()) << src.error().message;
  Compiler* c = target(t).vendor == Vendor::amd ? *clang_compiler()
                                                  : *compiler_for(target(t), compiler);
  return CacheKey::make(*src, *c).digest();
}

TEST(Codegen, IsDeterministic) {
  for (const char* t : {"gfx942", "gfx950", "sm_90a"}) {
    auto a = generate(gemm_spec(100, 70, 33, false, true), target(t));
    auto b = generate(gemm_spec(100, 70, 33, false, true), target(t));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->text, b->text);
    EXPECT_EQ(a->template_sha256, b->template_sha256);
  }
}

TEST(Codegen, SourceHoldsPreludeConstantsAndTemplate) {
  auto amd = generate(gemm_spec(100, 70, 33, false, true), target("gfx942"));
  ASSERT_TRUE(amd.ok());
  EXPECT_NE(amd->text.find("constexpr long long M = 100, N = 70, K = 33;"), std::string::npos);
  // bf16 on gfx942: the MFMA kernel, whose constants add the input type.
  EXPECT_NE(amd->text.find("constexpr bool TRANS_A = false, TRANS_B = true, IN_BF16 = true;"), std::string::npos);
  EXPECT_NE(amd->text.find("__builtin_amdgcn_mfma_f32_32x32x8bf16_1k"), std::string::npos);
  EXPECT_NE(amd->text.find("kWaveSize = 64"), std::string::npos);
  EXPECT_NE(amd->text.find("__builtin_amdgcn_s_barrier"), std::string::npos);
  EXPECT_NE(amd->text.find("void kiln_gemm("), std::string::npos);
  auto nv = generate(gemm_spec(100, 70, 33, false, true), target("sm_90a"));
  ASSERT_TRUE(nv.ok());
  EXPECT_NE(nv->text.find("kWaveSize = 32"), std::string::npos);
  EXPECT_EQ(nv->text.find("__builtin_amdgcn"), std::string::npos);
  // The template hash covers the prelude, the library parts and the device template actually
  // used: bf16 gemm on sm_90a takes a WGMMA template, the cp.async one when K = 33 rules out TMA.
  auto expanded_hash = [](const char* kernel) {
    const std::string body = std::string(embedded_file("templates/gemm/gemm_sm90_common.kernel")) + "\n" +
                             std::string(embedded_file(kernel));
    auto e = expand_library(body, target("sm_90a"), "test");
    EXPECT_TRUE(e.ok()) << e.error().message;
    return sha256_hex(std::string(prelude_for(target("sm_90a"))) + "\n" + e->library + "\n" + e->body);
  };
  EXPECT_EQ(nv->template_sha256, expanded_hash("templates/gemm/gemm_sm90.kernel"));
  EXPECT_EQ(nv->library_parts, (std::vector<std::string>{"sm90", "wgmma"}));
  auto tma = generate(gemm_spec(100, 72, 40, false, true), target("sm_90a"));
  ASSERT_TRUE(tma.ok());
  EXPECT_EQ(tma->template_sha256, expanded_hash("templates/gemm/gemm_sm90_tma.kernel"));
  EXPECT_EQ(tma->library_parts, (std::vector<std::string>{"sm90", "wgmma", "mbarrier", "tma", "epilogue_sm90"}));
  EXPECT_NE(tma->text.find("cp.async.bulk.tensor.2d"), std::string::npos);
  // The parts come after the prelude and before the baked constants, each once.
  const size_t lib = tma->text.find("// ---- library: tma ----");
  ASSERT_NE(lib, std::string::npos);
  EXPECT_LT(tma->text.find("// ---- prelude"), lib);
  EXPECT_LT(lib, tma->text.find("// ---- baked constants"));
  EXPECT_EQ(tma->text.find("// ---- library: sm90 ----", tma->text.find("// ---- library: sm90 ----") + 1),
            std::string::npos);
  EXPECT_EQ(tma->text.find("#include"), std::string::npos) << "every library line is expanded";
  // An op without library lines has no library section; rmsnorm has the parts it names.
  auto rms = generate(rmsnorm_spec(4, 1024), target("gfx942"));
  ASSERT_TRUE(rms.ok());
  EXPECT_EQ(rms->library_parts, (std::vector<std::string>{"load_hints", "pack", "reduce"}));
  EXPECT_EQ(rms->text.find("// ---- library: fp8"), std::string::npos) << "only the parts used";
}

TEST(Codegen, EveryTemplateAndPreludeIsEmbedded) {
  for (const char* f : {"codegen/preludes/amdgpu.prelude", "codegen/preludes/nvptx.prelude",
                        "templates/gemm/gemm.kernel", "templates/gemm/gemm_sm90.kernel",
                        "templates/gemm/gemm_sm90_tma.kernel", "templates/gemm/gemm_sm90_common.kernel",
                        "templates/rmsnorm/rmsnorm.kernel", "templates/swiglu/swiglu.kernel"})
    EXPECT_FALSE(embedded_file(f).empty()) << f;
  EXPECT_TRUE(embedded_file("no/such/file").empty());
}

// ---- the device-code library (templates/lib/) -----------------------------------------------

TEST(Library, EveryPartHasItsFileAndEveryFileItsPart) {
  std::set<std::string> rows, files;
  for (const LibraryPart& p : library_parts()) {
    rows.insert(std::string(p.name));
    EXPECT_FALSE(library_part_text(p).empty()) << "templates/lib/" << p.name << ".kernel is not embedded";
    EXPECT_TRUE(p.amd || p.nvidia) << p.name;
    EXPECT_FALSE(p.summary.empty()) << p.name;
  }
  for (const auto& e : std::filesystem::directory_iterator(std::filesystem::path(KILN_SOURCE_DIR) / "templates/lib"))
    if (e.path().extension() == ".kernel") files.insert(e.path().stem().string());
  EXPECT_EQ(rows, files) << "one row of library_parts() (templates/lib/library.cpp) per .kernel file";
  EXPECT_GE(rows.size(), 10u);
}

TEST(Library, PartsResolveByNameEachOnceDependenciesFirst) {
  const std::string text = "#include \"lib/tma.kernel\"\n#include \"lib/sm90.kernel\"  // again\n"
                           "  # include \"lib/softmax.kernel\"\nKILN_GLOBAL void k() {}\n";
  auto e = expand_library(text, target("sm_90a"), "test template");
  ASSERT_TRUE(e.ok()) << e.error().message;
  EXPECT_EQ(e->parts, (std::vector<std::string>{"sm90", "mbarrier", "tma", "reduce", "softmax"}));
  for (const std::string& p : e->parts) {
    const std::string head = "// ---- library: " + p + " ----\n";
    const size_t at = e->library.find(head);
    ASSERT_NE(at, std::string::npos) << p;
    EXPECT_EQ(e->library.find(head, at + 1), std::string::npos) << p << " appears once";
    EXPECT_NE(e->library.find(std::string(library_part_text(**find_library_part(p))).substr(0, 60)),
              std::string::npos)
        << p << "'s text is in the library section";
  }
  EXPECT_EQ(e->library.find("#include"), std::string::npos) << "the parts' own library lines are expanded";
  EXPECT_EQ(e->body,
            "// lib/tma.kernel: in the library section above\n// lib/sm90.kernel: in the library section above\n"
            "// lib/softmax.kernel: in the library section above\nKILN_GLOBAL void k() {}\n");
  // Deterministic.
  auto again = expand_library(text, target("sm_90a"), "test template");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->library, e->library);
}

TEST(Library, AnUnknownPartIsAClearError) {
  auto e = expand_library("// x\n#include \"lib/wgmmma.kernel\"\n", target("sm_90a"), "attention's device template");
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, Errc::invalid_argument);
  for (const char* what : {"attention's device template, line 2", "unknown library part 'wgmmma'", "tma, wgmma"})
    EXPECT_NE(e.error().message.find(what), std::string::npos) << what << " in: " << e.error().message;
  auto found = find_library_part("nosuch");
  ASSERT_FALSE(found.ok());
  EXPECT_EQ(found.error().code, Errc::not_found);
}

TEST(Library, APartOfAnotherVendorAndOtherIncludesAreRefused) {
  auto amd = expand_library("#include \"lib/wgmma.kernel\"\n", target("gfx942"), "t");
  ASSERT_FALSE(amd.ok());
  EXPECT_NE(amd.error().message.find("library part 'wgmma' is for NVIDIA targets, not gfx942"), std::string::npos)
      << amd.error().message;
  auto nv = expand_library("#include \"lib/mfma.kernel\"\n", target("sm_90a"), "t");
  ASSERT_FALSE(nv.ok());
  EXPECT_NE(nv.error().message.find("is for AMD targets, not sm_90a"), std::string::npos) << nv.error().message;
  for (const char* line : {"#include <cuda.h>", "#include \"templates/gemm/wgmma.kernel\"", "#include \"lib/../x.kernel\""}) {
    auto other = expand_library(std::string("a\n") + line + "\n", target("gfx950"), "t");
    ASSERT_FALSE(other.ok()) << line;
    EXPECT_NE(other.error().message.find("t, line 2"), std::string::npos) << other.error().message;
    EXPECT_NE(other.error().message.find("device sources include nothing but library parts"), std::string::npos)
        << other.error().message;
  }
  // A comment that mentions a library line is not one.
  auto comment = expand_library("// #include \"lib/nosuch.kernel\"\n", target("gfx950"), "t");
  ASSERT_TRUE(comment.ok());
  EXPECT_TRUE(comment->parts.empty());
}

TEST(Codegen, InvalidSpecsAreRejectedBeforeCodegen) {
  auto bad = generate(gemm_spec(0, 1, 1, false, false), target("gfx942"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, Errc::invalid_argument);
  auto unknown = generate(KernelSpec{"no_such_op", DType::bf16, DType::bf16, {}}, target("sm_90a"));
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(unknown.error().code, Errc::not_found);
}

TEST(Codegen, GeneratesEveryTuningCandidateAndRefusesOtherConfigs) {
  const KernelSpec spec = gemm_spec(1024, 1024, 1024, false, true);
  const TargetInfo& sm90 = target("sm_90a");
  const OpTemplate* gemm = *find_op("gemm");
  auto heuristic = generate(spec, sm90);
  ASSERT_TRUE(heuristic.ok());
  // The heuristic's tile-order group is the default, 8.
  EXPECT_NE(heuristic->text.find("GROUP_M = 8;"), std::string::npos);
  std::set<std::string> texts;
  for (const KernelConfig& c : gemm->tuning_candidates(spec, sm90)) {
    auto src = generate(spec, sm90, &c);
    ASSERT_TRUE(src.ok()) << src.error().message;
    EXPECT_EQ(src->config, c);
    EXPECT_EQ(src->template_sha256, heuristic->template_sha256) << "one kernel family, other constants";
    EXPECT_EQ(src->text.find("GROUP_M = 16;") != std::string::npos, c.count("GROUP_M") == 1);
    EXPECT_NE(src->text.find(fmt::format("BN = {}, BK = 64, STAGES = {}", c.at("BN"), c.at("STAGES"))), std::string::npos);
    texts.insert(src->text);
  }
  EXPECT_EQ(texts.size(), 4u);
  EXPECT_TRUE(texts.count(heuristic->text)) << "the heuristic's config given explicitly generates the same text";

  // A configuration the op does not offer: refused, naming it and listing the valid ones.
  KernelConfig foreign = heuristic->config;
  foreign["BK"] = 32;
  auto bad = generate(spec, sm90, &foreign);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, Errc::invalid_argument);
  EXPECT_NE(bad.error().message.find("'BK=32 BM=128"), std::string::npos) << bad.error().message;
  EXPECT_NE(bad.error().message.find("is not one of its variants or tuning candidates; use one of: '" +
                                     config_string(heuristic->config) + "'"),
            std::string::npos)
      << bad.error().message;
  // Another target's configuration is foreign too.
  const KernelConfig amd = gemm->choose_config(spec, target("gfx942"));
  EXPECT_FALSE(generate(spec, sm90, &amd).ok());
}

TEST(CacheKey, EveryBakedParameterChangesTheKey) {
  const std::string base = key_of(gemm_spec(64, 64, 64, false, true), "sm_90a");
  EXPECT_EQ(base, key_of(gemm_spec(64, 64, 64, false, true), "sm_90a")) << "the key is stable";
  EXPECT_NE(base, key_of(gemm_spec(65, 64, 64, false, true), "sm_90a"));
  EXPECT_NE(base, key_of(gemm_spec(64, 65, 64, false, true), "sm_90a"));
  EXPECT_NE(base, key_of(gemm_spec(64, 64, 65, false, true), "sm_90a"));
  EXPECT_NE(base, key_of(gemm_spec(64, 64, 64, true, true), "sm_90a"));
  EXPECT_NE(base, key_of(gemm_spec(64, 64, 64, false, false), "sm_90a"));
  EXPECT_NE(base, key_of(gemm_spec(64, 64, 64, false, true, DType::f16, DType::bf16), "sm_90a"));
  EXPECT_NE(base, key_of(gemm_spec(64, 64, 64, false, true, DType::bf16, DType::f32), "sm_90a"));
  EXPECT_NE(key_of(rmsnorm_spec(8, 4096), "sm_90a"), key_of(rmsnorm_spec(8, 4097), "sm_90a"));
  EXPECT_NE(key_of(swiglu_spec(8, 1024), "sm_90a"), key_of(swiglu_spec(8, 1025), "sm_90a"));
}

TEST(CacheKey, TargetAndCompilerChangeTheKey) {
  const KernelSpec s = gemm_spec(64, 64, 64, false, true);
  EXPECT_NE(key_of(s, "gfx942"), key_of(s, "gfx950"));
  EXPECT_NE(key_of(s, "gfx942"), key_of(s, "sm_90a"));
  EXPECT_NE(key_of(s, "sm_90a", "nvrtc"), key_of(s, "sm_90a", "clang"));
}

TEST(CacheKey, RuntimeArgumentsDoNotChangeTheKey) {
  // rows is a runtime argument of rmsnorm and swiglu (and eps a runtime scalar): one kernel serves
  // every token count.
  EXPECT_EQ(key_of(rmsnorm_spec(8, 4096), "gfx942"), key_of(rmsnorm_spec(8192, 4096), "gfx942"));
  EXPECT_EQ(key_of(swiglu_spec(1, 14336), "sm_90a"), key_of(swiglu_spec(16384, 14336), "sm_90a"));
  auto a = generate(rmsnorm_spec(8, 4096), target("sm_90a"));
  auto b = generate(rmsnorm_spec(8192, 4096), target("sm_90a"));
  EXPECT_EQ(a->text, b->text);
}

TEST(CacheKey, TemplateTextVersionsAndFlagsChangeTheKey) {
  auto src = generate(gemm_spec(64, 64, 64, false, true), target("sm_90a"));
  ASSERT_TRUE(src.ok());
  const CacheKey key = CacheKey::make(*src, **nvrtc_compiler());
  const std::string base = key.digest();
  auto changed = [&](auto mutate) {
    CacheKey k = key;
    mutate(k);
    return k.digest() != base;
  };
  EXPECT_TRUE(changed([](CacheKey& k) { k.template_sha256 = sha256_hex(std::string("edited template")); }));
  EXPECT_TRUE(changed([](CacheKey& k) { k.compiler_version += ".1"; }));
  EXPECT_TRUE(changed([](CacheKey& k) { k.flags += " -G"; }));
  EXPECT_TRUE(changed([](CacheKey& k) { k.format_version += 1; }));
  EXPECT_TRUE(changed([](CacheKey& k) { k.codegen_version += 1; }));
  EXPECT_TRUE(changed([](CacheKey& k) { k.config["BK"] = 32; }));
  EXPECT_TRUE(changed([](CacheKey& k) { k.config["GROUP_M"] = 16; }));
}

TEST(CacheKey, HoldsNoPathsOrHostNames) {
  for (const char* t : {"gfx942", "sm_90a"}) {
    auto src = generate(gemm_spec(64, 64, 64, false, true), target(t));
    Compiler* c = std::string(t) == "sm_90a" ? *nvrtc_compiler() : *clang_compiler();
    const std::string text = CacheKey::make(*src, *c).to_json().dump();
    EXPECT_EQ(text.find("/usr"), std::string::npos) << text;
    EXPECT_EQ(text.find("/home"), std::string::npos) << text;
    EXPECT_EQ(text.find("/tmp"), std::string::npos) << text;
    EXPECT_EQ(text.find(KILN_SOURCE_DIR), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// The key covers the generated source: one changed line of host-side specialization (or of
// codegen's preamble) changes the key, with every typed field (op, dtypes, parameters,
// configuration, template hash) unchanged. With a key of typed fields only, both sources would
// share one cache entry and the second would be served the first's stale code object.
TEST(CacheKey, CoversTheFullGeneratedSource) {
  auto src = generate(testing::rmsnorm_spec(8, 4096), testing::target("gfx942"));
  ASSERT_TRUE(src.ok()) << src.error().message;
  Compiler* clang = *clang_compiler();
  const CacheKey before = CacheKey::make(*src, *clang);

  KernelSource edited = *src;
  const std::string line = "constexpr int HIDDEN = 4096;";
  const size_t at = edited.text.find(line);
  ASSERT_NE(at, std::string::npos);
  edited.text.replace(at, line.size(), "constexpr int HIDDEN = 4096;  // emitted differently");
  edited.source_sha256 = sha256_hex(edited.text);
  const CacheKey after = CacheKey::make(edited, *clang);

  EXPECT_EQ(before.spec.op, after.spec.op);
  EXPECT_EQ(before.spec.params, after.spec.params);
  EXPECT_EQ(before.config, after.config);
  EXPECT_EQ(before.template_sha256, after.template_sha256);
  EXPECT_NE(before.digest(), after.digest()) << "the key must change with any emitted byte";
  EXPECT_EQ(before.to_json().at("source_sha256"), sha256_hex(src->text));
}

}  // namespace
}  // namespace kiln
