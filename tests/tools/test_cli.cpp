// The kiln command-line tool, run as a separate process: exit codes, stdout, stderr (errors are
// exactly one "kiln: error: ..." line) and what it leaves in the cache. Each test has its own
// temporary directory and cache (--cache-dir and KILN_CACHE_DIR). Needs no GPU; kernels are small.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cache/tuning.h"
#include "kiln/manifest.h"
#include "templates/registry.h"
#include "test_util.h"

extern char** environ;

namespace fs = std::filesystem;

namespace {

struct Output {
  int code = -1;
  std::string out, err;
};

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void write(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

size_t count_lines(const std::string& s) {
  size_t n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

class CliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/kiln-cli-test-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    cache_ = dir_ + "/cache";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  /// Runs kiln with `args` (KILN_CACHE_DIR set to this test's cache), capturing both streams.
  Output kiln(const std::vector<std::string>& args) { return kiln_env(args, {}); }

  /// kiln with extra environment variables ("NAME=VALUE"). KILN_RECORD, KILN_CACHE_MAX_SIZE and
  /// KILN_CACHE_PATH from the test's own environment are not passed on.
  Output kiln_env(const std::vector<std::string>& args, const std::vector<std::string>& extra_env) {
    const std::string out_path = dir_ + "/stdout", err_path = dir_ + "/stderr";
    std::vector<std::string> argv_s = {KILN_CLI_PATH};
    // A time limit turns a hang into a failure (exit 128+9) instead of a stuck suite.
    if (time_limit_s_ > 0) argv_s = {"/usr/bin/timeout", "-s", "KILL", std::to_string(time_limit_s_), KILN_CLI_PATH};
    // An address-space limit (RLIMIT_AS, as `ulimit -v`), set by the shell that then becomes kiln.
    if (as_limit_kib_ > 0)
      argv_s = {"/bin/sh", "-c", fmt::format("ulimit -v {} && exec \"$0\" \"$@\"", as_limit_kib_), KILN_CLI_PATH};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e) {
      const std::string var(*e);
      bool keep = true;
      for (const char* drop : {"KILN_CACHE_DIR=", "KILN_RECORD=", "KILN_CACHE_MAX_SIZE=", "KILN_CACHE_PATH="})
        keep = keep && var.rfind(drop, 0) != 0;
      if (keep) env_s.push_back(var);
    }
    env_s.push_back("KILN_CACHE_DIR=" + cache_);
    env_s.insert(env_s.end(), extra_env.begin(), extra_env.end());
    std::vector<char*> envp;
    for (auto& e : env_s) envp.push_back(e.data());
    envp.push_back(nullptr);

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid = 0;
    Output o;
    const int rc = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    if (rc != 0) {
      ADD_FAILURE() << "cannot start " << KILN_CLI_PATH << ": " << std::strerror(rc);
      return o;
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    o.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    o.out = slurp(out_path);
    o.err = slurp(err_path);
    return o;
  }

  /// kiln with --cache-dir added after the command words.
  Output kiln_cached(std::vector<std::string> args) {
    args.push_back("--cache-dir");
    args.push_back(cache_);
    return kiln(args);
  }

  /// Regular files under the cache directory (0 when it was never created).
  size_t cache_files() const {
    size_t n = 0;
    std::error_code ec;
    if (!fs::exists(cache_, ec)) return 0;
    for (auto it = fs::recursive_directory_iterator(cache_, ec); it != fs::recursive_directory_iterator(); ++it)
      n += it->is_regular_file();
    return n;
  }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_, cache_;
  int time_limit_s_ = 0;
  long as_limit_kib_ = 0;
};

/// Exactly one line on stderr, "kiln: error: ...", containing every one of `parts`.
void expect_one_error_line(const Output& o, std::initializer_list<std::string> parts) {
  EXPECT_NE(o.code, 0) << o.out;
  EXPECT_EQ(count_lines(o.err), 1u) << o.err;
  EXPECT_EQ(o.err.rfind("kiln: error: ", 0), 0u) << o.err;
  for (const std::string& p : parts) EXPECT_NE(o.err.find(p), std::string::npos) << "'" << p << "' not in: " << o.err;
}

const char* kSmallManifest = R"({"model": "tiny", "kernels": [
  {"op": "gemm", "dtype": "bf16", "label": "tiny.fwd",
   "params": {"M": 64, "N": 64, "K": 32, "trans_a": false, "trans_b": true}},
  {"op": "rmsnorm", "dtype": "bf16", "label": "norm", "params": {"rows": 4, "hidden": 128}},
  {"op": "swiglu", "dtype": "fp16", "params": {"rows": 4, "intermediate": 64}}
]})";

const std::vector<std::string> kGemmParams = {"--param", "M=64,N=128,K=32,trans_a=false,trans_b=true"};

TEST_F(CliTest, OpsListsOpsParametersAndTargets) {
  Output o = kiln({"ops"});
  ASSERT_EQ(o.code, 0) << o.err;
  for (const char* s : {"gemm", "rmsnorm", "swiglu", "trans_a", "baked", "runtime", "eps", "gfx942", "gfx950",
                        "sm_90a", "bf16", "fp32", "A [M, K]"})
    EXPECT_NE(o.out.find(s), std::string::npos) << s;
  EXPECT_TRUE(o.err.empty()) << o.err;
}

TEST_F(CliTest, VersionAndHelp) {
  Output v = kiln({"--version"});
  EXPECT_EQ(v.code, 0);
  EXPECT_NE(v.out.find("kiln"), std::string::npos);
  Output h = kiln({"--help"});
  EXPECT_EQ(h.code, 0);
  for (const char* s : {"prewarm", "manifest", "inspect", "cache"}) EXPECT_NE(h.out.find(s), std::string::npos) << s;
}

TEST_F(CliTest, CommandLineMistakesAreOneErrorLine) {
  expect_one_error_line(kiln({"bogus"}), {"unknown command 'bogus'"});
  expect_one_error_line(kiln({"prewarm"}), {"manifest is required"});
  Output o = kiln({"inspect", "gemm", "--arch", "gfx942", "--emit", "foo"});
  EXPECT_EQ(o.code, 2);
  expect_one_error_line(o, {"--emit"});
  expect_one_error_line(kiln({"inspect", "gemm", "--param", "M=x", "--arch", "gfx942"}), {"M=x", "integer"});
}

TEST_F(CliTest, ManifestOfLlama31_8b) {
  const std::string file = path("llama.json");
  Output o = kiln({"manifest", "llama3.1-8b", "-o", file});
  ASSERT_EQ(o.code, 0) << o.err;
  auto m = kiln::read_manifest(file);
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->model, "llama3.1-8b");
  auto find = [&](const std::string& op, std::map<std::string, int64_t> params) -> const kiln::ManifestEntry* {
    for (const auto& e : m->kernels)
      if (e.spec.op == op && e.spec.params == params) return &e;
    return nullptr;
  };
  const auto* fwd = find("gemm", {{"M", 8192}, {"N", 6144}, {"K", 4096}, {"trans_a", 0}, {"trans_b", 1}});
  ASSERT_NE(fwd, nullptr);
  EXPECT_EQ(fwd->label, "qkv.fwd");
  EXPECT_EQ(fwd->spec.dtype, kiln::DType::bf16);
  EXPECT_EQ(fwd->spec.out_dtype, kiln::DType::bf16);
  const auto* dgrad = find("gemm", {{"M", 8192}, {"N", 4096}, {"K", 6144}, {"trans_a", 0}, {"trans_b", 0}});
  ASSERT_NE(dgrad, nullptr);
  EXPECT_EQ(dgrad->label, "qkv.dgrad");
  const auto* wgrad = find("gemm", {{"M", 6144}, {"N", 4096}, {"K", 8192}, {"trans_a", 1}, {"trans_b", 0}});
  ASSERT_NE(wgrad, nullptr);
  EXPECT_EQ(wgrad->label, "qkv.wgrad");
  EXPECT_NE(find("rmsnorm", {{"rows", 8192}, {"hidden", 4096}, {"save_rstd", 1}}), nullptr);
  EXPECT_NE(find("rmsnorm", {{"rows", 8192}, {"hidden", 4096}, {"residual", 1}, {"save_rstd", 1}}), nullptr);
  EXPECT_NE(find("rmsnorm_bwd", {{"rows", 8192}, {"hidden", 4096}}), nullptr);
  EXPECT_NE(find("swiglu", {{"rows", 8192}, {"intermediate", 14336}}), nullptr);
  EXPECT_NE(find("swiglu_bwd", {{"rows", 8192}, {"intermediate", 14336}}), nullptr);
  EXPECT_NE(find("gemm", {{"M", 8192}, {"N", 128256}, {"K", 4096}, {"trans_a", 0}, {"trans_b", 1}}), nullptr);
  // No kernel twice.
  for (size_t i = 0; i < m->kernels.size(); ++i)
    for (size_t j = i + 1; j < m->kernels.size(); ++j)
      EXPECT_FALSE(m->kernels[i].spec.op == m->kernels[j].spec.op &&
                   m->kernels[i].spec.params == m->kernels[j].spec.params)
          << i << " and " << j;
  // The shipped manifest is what the tool generates today.
  EXPECT_EQ(slurp(file), slurp(std::string(KILN_SOURCE_DIR) + "/manifests/llama3.1-8b.json"));
}

// The library side of manifests: booleans as 1/0, out_dtype defaulting to dtype, write -> parse.
TEST(Manifest, ParseWriteRoundTrip) {
  auto m = kiln::parse_manifest(R"({"model": "m", "_note": "comments are ignored", "kernels": [
      {"op": "gemm", "dtype": "fp16", "out_dtype": "fp32", "label": "a",
       "params": {"M": 8, "N": 16, "K": 24, "trans_a": true, "trans_b": 0}},
      {"op": "rmsnorm", "dtype": "bf16", "params": {"rows": 3, "hidden": 64}}]})",
                                "inline");
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_EQ(m->kernels.size(), 2u);
  EXPECT_EQ(m->kernels[0].spec.params.at("trans_a"), 1);
  EXPECT_EQ(m->kernels[0].spec.params.at("trans_b"), 0);
  EXPECT_EQ(m->kernels[0].spec.out_dtype, kiln::DType::f32);
  EXPECT_EQ(m->kernels[1].spec.out_dtype, kiln::DType::bf16);
  EXPECT_EQ(m->kernels[1].label, "");
  const std::string text = kiln::write_manifest(*m);
  EXPECT_NE(text.find("\"trans_a\": true"), std::string::npos) << text;
  auto again = kiln::parse_manifest(text, "written");
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->model, "m");
  ASSERT_EQ(again->kernels.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(again->kernels[i].spec.op, m->kernels[i].spec.op);
    EXPECT_EQ(again->kernels[i].spec.dtype, m->kernels[i].spec.dtype);
    EXPECT_EQ(again->kernels[i].spec.out_dtype, m->kernels[i].spec.out_dtype);
    EXPECT_EQ(again->kernels[i].spec.params, m->kernels[i].spec.params);
    EXPECT_EQ(again->kernels[i].label, m->kernels[i].label);
  }
  // Validation against targets names the kernel and its label.
  m->kernels[0].spec.params["M"] = 0;
  const kiln::TargetInfo* gfx942 = kiln::find_target("gfx942").value();
  auto valid = kiln::validate_manifest(*m, std::span<const kiln::TargetInfo* const>(&gfx942, 1), "inline");
  ASSERT_FALSE(valid.ok());
  EXPECT_NE(valid.error().message.find("'inline': kernel 0 (a): gemm: parameter 'M' = 0"), std::string::npos)
      << valid.error().message;
}

// fp8 in manifests: formats mapped to each target's encoding (fp8_for_target), enumerated
// parameters by name.
TEST(Manifest, Fp8FormatsTakeEachTargetsEncoding) {
  const kiln::TargetInfo* gfx942 = kiln::find_target("gfx942").value();
  const kiln::TargetInfo* gfx950 = kiln::find_target("gfx950").value();
  const kiln::TargetInfo* sm90 = kiln::find_target("sm_90a").value();
  using kiln::DType;
  for (DType t : {DType::e4m3, DType::e4m3fnuz}) {
    EXPECT_EQ(kiln::fp8_for_target(t, *gfx942), DType::e4m3fnuz);
    EXPECT_EQ(kiln::fp8_for_target(t, *gfx950), DType::e4m3);
    EXPECT_EQ(kiln::fp8_for_target(t, *sm90), DType::e4m3);
  }
  for (DType t : {DType::e5m2, DType::e5m2fnuz}) {
    EXPECT_EQ(kiln::fp8_for_target(t, *gfx942), DType::e5m2fnuz);
    EXPECT_EQ(kiln::fp8_for_target(t, *sm90), DType::e5m2);
  }
  for (DType t : {DType::bf16, DType::f16, DType::f32, DType::i32, DType::i64})
    EXPECT_EQ(kiln::fp8_for_target(t, *gfx942), t);

  auto m = kiln::parse_manifest(R"({"kernels": [
      {"op": "quantize_fp8", "dtype": "bf16", "out_dtype": "fp8_e4m3",
       "params": {"rows": 256, "cols": 512, "granularity": "block128x128", "transpose": true}},
      {"op": "dequantize_fp8", "dtype": "fp8_e5m2fnuz", "out_dtype": "bf16",
       "params": {"rows": 256, "cols": 512, "granularity": 1}}]})",
                                "inline");
  ASSERT_TRUE(m.ok()) << m.error().message;
  EXPECT_EQ(m->kernels[0].spec.params.at("granularity"), 3);
  const kiln::KernelSpec q942 = kiln::manifest_spec_for_target(m->kernels[0].spec, *gfx942);
  EXPECT_EQ(q942.dtype, DType::bf16);
  EXPECT_EQ(q942.out_dtype, DType::e4m3fnuz);
  EXPECT_EQ(q942.params, m->kernels[0].spec.params);
  const kiln::KernelSpec d90 = kiln::manifest_spec_for_target(m->kernels[1].spec, *sm90);
  EXPECT_EQ(d90.dtype, DType::e5m2);
  EXPECT_EQ(d90.out_dtype, DType::bf16);
  const kiln::TargetInfo* all[] = {gfx942, gfx950, sm90};
  auto valid = kiln::validate_manifest(*m, all, "inline");
  EXPECT_TRUE(valid.ok()) << valid.error().message;
  // Written by name, read back the same.
  const std::string text = kiln::write_manifest(*m);
  EXPECT_NE(text.find(R"("granularity": "block128x128")"), std::string::npos) << text;
  EXPECT_NE(text.find(R"("granularity": "rowwise")"), std::string::npos) << text;
  auto again = kiln::parse_manifest(text, "written");
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ(again->kernels[1].spec.params, m->kernels[1].spec.params);
  // An unknown name lists the names.
  auto bad = kiln::parse_manifest(R"({"kernels": [{"op": "quantize_fp8", "dtype": "bf16", "out_dtype": "fp8_e4m3",
      "params": {"rows": 1, "cols": 8, "granularity": "block"}}]})",
                                  "bad");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("'bad': kernel 0: params.granularity = \"block\" is not one of: tensorwise, "
                                     "rowwise, block1x128, block128x128"),
            std::string::npos)
      << bad.error().message;
}

TEST_F(CliTest, ManifestWithSeveralMicroBatches) {
  Output o = kiln({"manifest", "llama2-7b", "--micro-batch", "1,2", "--seq", "128"});
  ASSERT_EQ(o.code, 0) << o.err;
  auto m = kiln::parse_manifest(o.out, "stdout");
  ASSERT_TRUE(m.ok()) << m.error().message;
  // 15 GEMMs, rmsnorm twice (plain, residual), rmsnorm_bwd twice (plain, residual gradient), swiglu,
  // swiglu_bwd, rope, attention and embedding with their backward, and cross_entropy (its gradient
  // in the same launch); for M = 128 and 256.
  EXPECT_EQ(m->kernels.size(), 56u);
}

// kiln manifest of a mixture-of-experts model (issue 18): the MoE FFN (router GEMM, moe_router,
// permute, the six grouped GEMMs, swiglu, unpermute, with their backward) in place of gate_up,
// down and swiglu; an MLA model lists its attention core and says what it leaves out.
TEST_F(CliTest, ManifestOfAnMoeModelListsItsExpertKernels) {
  const Output o = kiln({"manifest", "deepseek-v3", "--seq", "1024", "--experts-per-rank", "16"});
  ASSERT_EQ(o.code, 0) << o.err;
  auto m = kiln::parse_manifest(o.out, "stdout");
  ASSERT_TRUE(m.ok()) << m.error().message;
  std::map<std::string, int> ops;
  for (const auto& e : m->kernels) ++ops[e.spec.op];
  EXPECT_EQ(ops["grouped_gemm"], 6);
  for (const char* op : {"moe_router", "moe_router_bwd", "moe_permute", "moe_permute_bwd", "moe_unpermute",
                         "moe_unpermute_bwd", "attention", "attention_bwd", "swiglu", "swiglu_bwd"})
    EXPECT_EQ(ops[op], 1) << op;
  EXPECT_EQ(ops["rope"], 0);  // MLA's decoupled RoPE is not a Kiln op
  for (const auto& e : m->kernels) {
    if (e.spec.op == "grouped_gemm") {
      EXPECT_EQ(e.spec.params.at("groups"), 16) << e.label;
    }
    if (e.spec.op == "moe_router") {
      EXPECT_EQ(e.spec.params.at("experts"), 256);
      EXPECT_EQ(e.spec.params.at("k"), 8);
      EXPECT_EQ(e.spec.params.at("bias"), 1);
    }
    if (e.spec.op == "attention") {
      EXPECT_EQ(e.spec.params.at("head_dim"), 192);
      EXPECT_EQ(e.spec.params.at("head_dim_v"), 128);
    }
    if (e.label == "experts.down.dgrad") {  // dx = dy W_g: nn with N = moe_intermediate, K = hidden
      EXPECT_EQ(e.spec.params.at("mode"), 1);
      EXPECT_EQ(e.spec.params.at("N"), 2048);
      EXPECT_EQ(e.spec.params.at("K"), 7168);
    }
    if (e.label == "experts.gate_up.wgrad") {
      EXPECT_EQ(e.spec.out_dtype, kiln::DType::f32);
    }
    EXPECT_EQ(e.label.find("qkv"), std::string::npos) << e.label;
  }
  EXPECT_NE(o.out.find("multi-head latent attention"), std::string::npos);
  EXPECT_NE(o.out.find("all-to-all"), std::string::npos);
  // A GQA MoE model keeps qkv, rope and attention on the fused qkv; a divisor is required.
  const Output q = kiln({"manifest", "qwen3-235b-a22b", "--seq", "512"});
  ASSERT_EQ(q.code, 0) << q.err;
  EXPECT_NE(q.out.find("\"rope\""), std::string::npos);
  EXPECT_NE(q.out.find("qkv.fwd"), std::string::npos);
  expect_one_error_line(kiln({"manifest", "deepseek-v3", "--experts-per-rank", "7"}), {"divisor of 256"});
  // --fp8 block: the six grouped GEMMs in fp8 (dgrad nt with b = W^T, wgrad tn over panels) and the
  // quantize_fp8 calls of their operands: W^T batched over the experts, dy^T and x^T in panels.
  const Output f = kiln({"manifest", "deepseek-v3", "--seq", "1024", "--experts-per-rank", "16", "--fp8", "block"});
  ASSERT_EQ(f.code, 0) << f.err;
  auto mf = kiln::parse_manifest(f.out, "stdout");
  ASSERT_TRUE(mf.ok()) << mf.error().message;
  int grouped8 = 0, batched = 0, panels = 0;
  for (const auto& e : mf->kernels) {
    if (e.spec.op == "grouped_gemm") {
      EXPECT_EQ(e.spec.dtype, kiln::DType::e4m3) << e.label;
      ++grouped8;
    }
    if (e.label.starts_with("experts.down.dgrad")) {  // dx = dy W_g: nt over b = W^T [G, K, N]
      EXPECT_EQ(e.spec.params.at("mode"), 0);
      EXPECT_EQ(e.spec.params.at("N"), 2048);
      EXPECT_EQ(e.spec.params.at("K"), 7168);
    }
    if (e.spec.op == "quantize_fp8" && e.spec.params.count("batch")) {
      EXPECT_EQ(e.spec.params.at("batch"), 16) << e.label;
      ++batched;
    }
    if (e.spec.op == "quantize_fp8" && e.spec.params.count("groups")) {
      EXPECT_EQ(e.spec.params.at("groups"), 16) << e.label;
      ++panels;
    }
  }
  EXPECT_EQ(grouped8, 6);
  EXPECT_EQ(batched, 2);  // gate_up's and down's W^T
  EXPECT_EQ(panels, 3);   // x^T and dy^T of gate_up, x^T of down (shared with gate_up's dy^T: both [M k, 7168])
  EXPECT_NE(f.out.find("fp8 blockwise (e4m3, DeepSeek-V3's recipe)"), std::string::npos);
  // Another recipe keeps the grouped GEMMs in the step's dtype, and says which one serves them.
  const Output t = kiln({"manifest", "mixtral-8x7b", "--seq", "512", "--fp8", "tensorwise"});
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_NE(t.out.find("their fp8 form serves --fp8 block"), std::string::npos);
  EXPECT_EQ(t.out.find("\"grouped_gemm\", \"dtype\": \"fp8"), std::string::npos);
  expect_one_error_line(kiln({"manifest", "llama3.1-8b", "--experts-per-rank", "8"}), {"llama3.1-8b is dense"});
}

TEST_F(CliTest, UnknownModel) {
  Output o = kiln({"manifest", "x", "-o", path("x.json")});
  expect_one_error_line(o, {"unknown model 'x'; known models: ", "llama3.1-8b", "mistral-7b"});
  EXPECT_FALSE(fs::exists(path("x.json")));
  Output list = kiln({"manifest", "--list"});
  EXPECT_EQ(list.code, 0);
  for (const char* s : {"llama2-7b", "llama2-70b", "llama3.1-405b", "qwen2.5-7b", "(heads + 2*kv_heads) * head_dim",
                        "deepseek-v3", "mixtral-8x7b", "MLA 192/128 x 128"})
    EXPECT_NE(list.out.find(s), std::string::npos) << s;
}

// kiln manifest --fp8: the quantize_fp8 kernels of an fp8 step next to the unchanged GEMMs, norms
// and SwiGLU (docs/manifest.md).
TEST_F(CliTest, ManifestFp8ListsTheQuantizeKernelsWithTheirTransposes) {
  const std::string plain_file = path("plain.json"), block_file = path("block.json");
  ASSERT_EQ(kiln({"manifest", "llama3.1-8b", "-o", plain_file}).code, 0);
  const Output o = kiln({"manifest", "llama3.1-8b", "--fp8", "block", "-o", block_file});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("15 quantize_fp8"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("fp8 block"), std::string::npos) << o.out;
  auto plain = kiln::read_manifest(plain_file);
  auto block = kiln::read_manifest(block_file);
  ASSERT_TRUE(plain.ok()) << plain.error().message;
  ASSERT_TRUE(block.ok()) << block.error().message;
  // Enumerated parameters are written by name.
  EXPECT_NE(slurp(block_file).find(R"("granularity": "block1x128")"), std::string::npos);
  EXPECT_NE(slurp(block_file).find(R"("fp8_out": "fp8_e5m2")"), std::string::npos);
  // Every kernel of the bf16 step is still there under its label: the layer GEMMs as gemm_fp8 (lm_head
  // stays a bf16 gemm); the norms, swiglu and their backward ops with a fused fp8 output of the GEMM
  // input they write (x e4m3, dy e5m2, 1x128 groups); everything else unchanged.
  size_t layer_gemms = 0;
  for (const auto& e : plain->kernels) {
    const bool layer_gemm = e.spec.op == "gemm" && e.label.find("lm_head") == std::string::npos;
    const bool producer = e.spec.op == "rmsnorm" || e.spec.op == "swiglu" || e.spec.op == "rmsnorm_bwd" ||
                          e.spec.op == "swiglu_bwd";
    std::map<std::string, int64_t> want = e.spec.params;
    if (producer) {
      want["fp8_out"] = e.spec.op.find("_bwd") != std::string::npos ? 2 : 1;  // fp8_e5m2, fp8_e4m3
      want["fp8_granularity"] = 2;                                            // block1x128
    }
    layer_gemms += layer_gemm;
    bool found = false;
    for (const auto& f : block->kernels)
      found |= layer_gemm ? f.spec.op == "gemm_fp8" && f.label == e.label
                          : f.spec.op == e.spec.op && f.spec.dtype == e.spec.dtype &&
                                f.spec.out_dtype == e.spec.out_dtype && f.spec.params == want && f.label == e.label;
    EXPECT_TRUE(found) << e.label;
  }
  // Two norms keep no fp8 output: the final one (its y feeds the lm_head) and the first layer's
  // input-norm backward (its dx feeds the embedding).
  std::vector<std::string> plain_norms;
  for (const auto& f : block->kernels)
    if (f.spec.op.rfind("rmsnorm", 0) == 0 && !f.spec.params.count("fp8_out")) plain_norms.push_back(f.label);
  EXPECT_EQ(plain_norms, (std::vector<std::string>{"rmsnorm.fwd_final", "rmsnorm.bwd_residual_first"}));
  std::vector<const kiln::ManifestEntry*> quant, gemm8;
  for (const auto& e : block->kernels) {
    if (e.spec.op == "quantize_fp8") quant.push_back(&e);
    if (e.spec.op == "gemm_fp8") gemm8.push_back(&e);
  }
  EXPECT_EQ(gemm8.size(), layer_gemms);
  EXPECT_EQ(quant.size() + plain->kernels.size() + plain_norms.size(), block->kernels.size());
  // qkv's three GEMMs: forward e4m3 x e4m3 blockwise (x 1x128, W 128x128), dgrad e5m2 dy x W^T and
  // wgrad e5m2 dy^T x x^T, both with 1x128 blocks along their reduction (block1x128), wgrad into fp32.
  auto find8 = [&](int64_t M, int64_t N, int64_t K) -> const kiln::ManifestEntry* {
    for (const auto* e : gemm8)
      if (e->spec.params.at("M") == M && e->spec.params.at("N") == N && e->spec.params.at("K") == K) return e;
    return nullptr;
  };
  const auto *fwd8 = find8(8192, 6144, 4096), *dgrad8 = find8(8192, 4096, 6144), *wgrad8 = find8(6144, 4096, 8192);
  for (const auto* e : {fwd8, dgrad8, wgrad8}) ASSERT_NE(e, nullptr);
  EXPECT_EQ(fwd8->label, "qkv.fwd");
  EXPECT_EQ(fwd8->spec.dtype, kiln::DType::e4m3);
  EXPECT_EQ(dgrad8->spec.dtype, kiln::DType::e5m2);
  EXPECT_EQ(wgrad8->spec.out_dtype, kiln::DType::f32);
  EXPECT_EQ(fwd8->spec.params.at("granularity"), 2);
  EXPECT_EQ(dgrad8->spec.params.at("granularity"), 3);
  EXPECT_EQ(wgrad8->spec.params.at("granularity"), 3);
  auto find = [&](int64_t rows, int64_t cols, int64_t gran, int64_t transpose) -> const kiln::ManifestEntry* {
    std::map<std::string, int64_t> want{{"rows", rows}, {"cols", cols}, {"granularity", gran}, {"transpose", transpose}};
    if (transpose) want["only_qt"] = 1;
    for (const auto* e : quant)
      if (e->spec.params == want) return e;
    return nullptr;
  };
  // Llama-3.1-8B (M 8192, hidden 4096, qkv N 6144): rmsnorm writes the x of qkv and gate_up, so only
  // attn_out's x (the attention output) is quantized; x^T (wgrad) 1x128 along the tokens; W 128x128
  // and W^T (dgrad) 1x128 along N; qkv's dy (dqkv, from attention_bwd) 1x128 and dy^T, in e5m2.
  const auto* x = find(8192, 4096, 2, 0);
  const auto* xt = find(8192, 4096, 2, 1);
  const auto* w = find(6144, 4096, 3, 0);
  const auto* wt = find(6144, 4096, 2, 1);
  const auto* dy = find(8192, 6144, 2, 0);
  const auto* dyt = find(8192, 6144, 2, 1);
  for (const auto* e : {x, xt, w, wt, dy, dyt}) ASSERT_NE(e, nullptr);
  EXPECT_EQ(x->label, "attn_out.fp8_x");
  EXPECT_EQ(xt->label, "qkv.fp8_xT+attn_out.fp8_xT+gate_up.fp8_xT");
  EXPECT_EQ(w->label, "qkv.fp8_w");
  EXPECT_EQ(wt->label, "qkv.fp8_wT");
  EXPECT_EQ(dy->label, "qkv.fp8_dy");
  EXPECT_EQ(dyt->label, "qkv.fp8_dyT");
  for (const auto* e : {x, xt, w, wt}) EXPECT_EQ(e->spec.out_dtype, kiln::DType::e4m3) << e->label;
  for (const auto* e : {dy, dyt}) EXPECT_EQ(e->spec.out_dtype, kiln::DType::e5m2) << e->label;
  for (const auto* e : quant) {
    EXPECT_EQ(e->spec.dtype, kiln::DType::bf16) << e->label;
    EXPECT_EQ(e->label.find("lm_head"), std::string::npos) << e->label;  // lm_head stays bf16
    // Weights are 128x128 without qt; every transposed copy is only_qt in 1x128 blocks.
    EXPECT_EQ(e->spec.params.at("transpose"), e->spec.params.count("only_qt")) << e->label;
    if (e->spec.params.at("transpose")) {
      EXPECT_EQ(e->spec.params.at("granularity"), 2) << e->label;
    }
  }
  // The fused outputs name their format by value, and each target compiles its own encoding.
  const kiln::ManifestEntry* bwd = nullptr;
  for (const auto& e : block->kernels)
    if (e.label == "swiglu.bwd") bwd = &e;
  ASSERT_NE(bwd, nullptr);
  const kiln::TargetInfo* gfx942 = kiln::find_target("gfx942").value();
  EXPECT_EQ(kiln::manifest_spec_for_target(bwd->spec, *gfx942).params.at("fp8_out"), 4);  // fp8_e5m2fnuz
  EXPECT_EQ(kiln::manifest_spec_for_target(bwd->spec, *kiln::find_target("sm_90a").value()).params.at("fp8_out"), 2);
  // tensorwise: every quantization writes qt itself, no separate transposed call.
  const Output t = kiln({"manifest", "llama3.1-8b", "--fp8", "tensorwise"});
  ASSERT_EQ(t.code, 0) << t.err;
  auto tw = kiln::parse_manifest(t.out, "stdout");
  ASSERT_TRUE(tw.ok()) << tw.error().message;
  size_t n = 0;
  for (const auto& e : tw->kernels) {
    if (e.spec.op != "quantize_fp8") continue;
    ++n;
    EXPECT_EQ(e.spec.params.at("granularity"), 0) << e.label;
    EXPECT_EQ(e.spec.params.at("transpose"), 1) << e.label;
    EXPECT_EQ(e.label.find("T"), std::string::npos) << e.label;
  }
  EXPECT_EQ(n, 9u);  // x [M,4096], x [M,14336]; W of 4 GEMMs; dy [M,6144], [M,4096], [M,28672]
}

TEST_F(CliTest, ManifestFp8RefusesAnUnknownGranularity) {
  const Output o = kiln({"manifest", "llama3.1-8b", "--fp8", "block64", "-o", path("m.json")});
  expect_one_error_line(o, {"--fp8 'block64'", "tensorwise, rowwise, block (", "block1x128, block128x128"});
  EXPECT_EQ(o.code, 2);
  EXPECT_FALSE(fs::exists(path("m.json")));
  for (const char* g : {"rowwise", "block1x128", "block128x128"})
    EXPECT_EQ(kiln({"manifest", "llama2-7b", "--seq", "128", "--fp8", g}).code, 0) << g;
}

// A manifest names fp8 formats: prewarm compiles FNUZ kernels for gfx942 and OCP ones for gfx950
// and sm_90a from the same kernels (before, validation refused fp8_e4m3 for gfx942).
TEST_F(CliTest, PrewarmOfAnFp8ManifestCompilesEachTargetsEncoding) {
  KILN_REQUIRE_LLVM();
  const Output m = kiln({"manifest", "llama3.1-8b", "--seq", "256", "--fp8", "block"});
  ASSERT_EQ(m.code, 0) << m.err;
  // The first quantize kernels (x, x^T, W with qt, dy: e4m3 and e5m2), to keep the test short.
  auto doc = nlohmann::json::parse(m.out);
  nlohmann::json kernels = nlohmann::json::array();
  for (const auto& k : doc["kernels"])
    if (k["op"] == "quantize_fp8" && kernels.size() < 4) kernels.push_back(k);
  ASSERT_EQ(kernels.size(), 4u);
  doc["kernels"] = kernels;
  const std::string file = path("fp8.json");
  write(file, doc.dump());
  const Output o = kiln_cached({"prewarm", file, "--arch", "gfx942,gfx950,sm_90a", "-j", "2", "--json"});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  const auto report = nlohmann::json::parse(o.out);
  EXPECT_EQ(report["summary"]["failed"], 0);
  ASSERT_EQ(report["kernels"].size(), 12u);
  std::set<std::string> seen;
  for (const auto& row : report["kernels"]) {
    const std::string target = row["target"], out = row["out_dtype"];
    EXPECT_EQ(row["op"], "quantize_fp8");
    EXPECT_EQ(row["dtype"], "bf16");
    if (target == "gfx942") {
      EXPECT_TRUE(out == "fp8_e4m3fnuz" || out == "fp8_e5m2fnuz") << row.dump();
      EXPECT_EQ(row["format"], "hsaco");
    } else {
      EXPECT_TRUE(out == "fp8_e4m3" || out == "fp8_e5m2") << row.dump();
    }
    EXPECT_NE(row["kernel"].get<std::string>().find(out), std::string::npos) << row.dump();
    // Enumerated parameters by name, as -p takes them (issue 19: it printed granularity=2).
    EXPECT_TRUE(std::regex_search(row["kernel"].get<std::string>(), std::regex("granularity=block(1x128|128x128)( |$)")))
        << row.dump();
    seen.insert(target + " " + out);
  }
  EXPECT_EQ(seen, (std::set<std::string>{"gfx942 fp8_e4m3fnuz", "gfx942 fp8_e5m2fnuz", "gfx950 fp8_e4m3",
                                         "gfx950 fp8_e5m2", "sm_90a fp8_e4m3", "sm_90a fp8_e5m2"}));
  // The cache holds the target's encoding too.
  const Output ls = kiln_cached({"cache", "ls"});
  ASSERT_EQ(ls.code, 0) << ls.err;
  EXPECT_NE(ls.out.find("fp8_e4m3fnuz"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("fp8_e5m2fnuz"), std::string::npos) << ls.out;
}

TEST_F(CliTest, PrewarmThenCachedThenCacheCommands) {
  KILN_REQUIRE_LLVM();  // prewarms or inspects gfx942
  const std::string file = path("small.json");
  write(file, kSmallManifest);
  Output first = kiln_cached({"prewarm", file, "--arch", "gfx942,sm_90a", "-j", "2"});
  ASSERT_EQ(first.code, 0) << first.out << first.err;
  EXPECT_TRUE(first.err.empty()) << first.err;  // no progress bar when stderr is not a terminal
  EXPECT_NE(first.out.find("3 kernels x 2 targets"), std::string::npos) << first.out;
  EXPECT_TRUE(std::regex_search(first.out, std::regex(R"(compiled\s+6\n)"))) << first.out;
  EXPECT_TRUE(std::regex_search(first.out, std::regex(R"(already cached\s+0\n)"))) << first.out;
  EXPECT_TRUE(std::regex_search(first.out, std::regex(R"(failed\s+0\n)"))) << first.out;
  EXPECT_NE(first.out.find("tiny.fwd"), std::string::npos);
  EXPECT_NE(first.out.find("hsaco"), std::string::npos);
  EXPECT_NE(first.out.find("cubin"), std::string::npos);

  // KILN_CACHE_DIR names the same cache: the second run finds everything.
  Output second = kiln({"prewarm", file, "--arch", "gfx942,sm_90a"});
  ASSERT_EQ(second.code, 0) << second.out << second.err;
  EXPECT_TRUE(std::regex_search(second.out, std::regex(R"(compiled\s+0\n)"))) << second.out;
  EXPECT_TRUE(std::regex_search(second.out, std::regex(R"(already cached\s+6\n)"))) << second.out;

  Output stat = kiln_cached({"cache", "stat"});
  ASSERT_EQ(stat.code, 0) << stat.err;
  EXPECT_TRUE(std::regex_search(stat.out, std::regex(R"(entries\s+6\n)"))) << stat.out;
  EXPECT_NE(stat.out.find("gfx942 3"), std::string::npos) << stat.out;
  EXPECT_NE(stat.out.find("sm_90a 3"), std::string::npos) << stat.out;
  EXPECT_NE(stat.out.find("clang"), std::string::npos) << stat.out;

  Output ls = kiln_cached({"cache", "ls"});
  ASSERT_EQ(ls.code, 0) << ls.err;
  EXPECT_EQ(count_lines(ls.out), 2u + 6u) << ls.out;  // header, rule, one line per entry
  EXPECT_NE(ls.out.find("rmsnorm bf16"), std::string::npos) << ls.out;

  Output verify = kiln_cached({"cache", "verify"});
  EXPECT_EQ(verify.code, 0) << verify.out << verify.err;
  EXPECT_NE(verify.out.find("6 ok, 0 corrupt"), std::string::npos) << verify.out;

  // Flip one byte of one AMD code object: verify names it and fails.
  std::string victim;
  for (const auto& f : fs::recursive_directory_iterator(cache_ + "/v1/entries"))
    if (f.path().filename() == "code.hsaco") victim = f.path().string();
  ASSERT_FALSE(victim.empty());
  std::string bytes = slurp(victim);
  ASSERT_GT(bytes.size(), 64u);
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x5a);
  write(victim, bytes);
  Output bad = kiln_cached({"cache", "verify"});
  EXPECT_EQ(bad.code, 1);
  expect_one_error_line(bad, {"1 of 6 cache entries failed verification"});
  EXPECT_NE(bad.out.find("code.hsaco fails its SHA-256 check"), std::string::npos) << bad.out;

  Output clear = kiln_cached({"cache", "clear"});
  EXPECT_EQ(clear.code, 0) << clear.err;
  EXPECT_NE(clear.out.find("removed 6 entries"), std::string::npos) << clear.out;
  Output empty = kiln_cached({"cache", "stat"});
  EXPECT_TRUE(std::regex_search(empty.out, std::regex(R"(entries\s+0\n)"))) << empty.out;
}

TEST_F(CliTest, MalformedManifestsCompileNothing) {
  struct Case {
    const char* name;
    const char* text;
    std::vector<std::string> expect;
  };
  const Case cases[] = {
      {"invalid.json", "{\"kernels\": [\n  {\"op\": \"gemm\",,}]}", {"line 2, column", "invalid JSON"}},
      {"nokernels.json", R"({"model": "m"})", {"missing field \"kernels\""}},
      {"badop.json", R"({"kernels": [{"op": "gemv", "dtype": "bf16", "params": {}}]})",
       {"kernel 0: unknown op 'gemv'", "gemm, rmsnorm, swiglu"}},
      {"bf17.json",
       R"({"kernels": [{"op": "rmsnorm", "dtype": "bf16", "params": {"rows": 1, "hidden": 64}},
                       {"op": "rmsnorm", "dtype": "bf17", "params": {"rows": 1, "hidden": 64}}]})",
       {"kernel 1: unknown dtype 'bf17'; use one of: fp32, fp16, bf16, fp8_e4m3"}},
      {"field.json", R"({"kernels": [{"op": "rmsnorm", "dtype": "bf16", "prams": {"rows": 1, "hidden": 64}}]})",
       {"kernel 0: unknown field 'prams' (fields: op, dtype, out_dtype, label, params)"}},
      {"m0.json",
       R"({"kernels": [{"op": "gemm", "dtype": "bf16", "params": {"M": 0, "N": 64, "K": 32, "trans_a": false, "trans_b": true}}]})",
       {"kernel 0", "'M' = 0", "[1, "}},
      {"transa2.json",
       R"({"kernels": [{"op": "gemm", "dtype": "bf16", "params": {"M": 64, "N": 64, "K": 32, "trans_a": 2, "trans_b": true}}]})",
       {"kernel 0", "'trans_a' = 2", "true or false"}},
      {"string.json",
       R"({"kernels": [{"op": "gemm", "dtype": "bf16", "params": {"M": "64", "N": 64, "K": 32, "trans_a": false, "trans_b": true}}]})",
       {"kernel 0: params.M must be an integer"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string file = path(c.name);
    write(file, c.text);
    Output o = kiln_cached({"prewarm", file, "--arch", "gfx942,sm_90a"});
    expect_one_error_line(o, {std::string("'") + file + "'"});
    for (const std::string& e : c.expect) EXPECT_NE(o.err.find(e), std::string::npos) << "'" << e << "' not in " << o.err;
    EXPECT_TRUE(o.out.empty()) << o.out;
    EXPECT_EQ(cache_files(), 0u) << "the cache was written to";
  }
  // A missing file, and an unknown target (checked before the manifest is read).
  expect_one_error_line(kiln_cached({"prewarm", path("absent.json"), "--arch", "gfx942"}),
                        {"cannot read manifest", "absent.json"});
  write(path("small.json"), kSmallManifest);
  expect_one_error_line(kiln_cached({"prewarm", path("small.json"), "--arch", "gfx942,gfx941"}),
                        {"unknown target 'gfx941'", "gfx942, gfx950, sm_90a"});
  EXPECT_EQ(cache_files(), 0u);
}

TEST_F(CliTest, InspectSource) {
  std::vector<std::string> args = {"inspect", "gemm"};
  args.insert(args.end(), kGemmParams.begin(), kGemmParams.end());
  args.insert(args.end(), {"--arch", "gfx942", "--emit", "source"});
  Output o = kiln(args);
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("kiln_gemm"), std::string::npos);
  EXPECT_NE(o.out.find("constexpr long long M = 64, N = 128, K = 32;"), std::string::npos);
  EXPECT_NE(o.out.find("TRANS_A = false, TRANS_B = true"), std::string::npos);
  EXPECT_EQ(cache_files(), 0u);  // source needs no compile
}

// --config picks one of the op's variants or tuning candidates instead of the heuristic's, in the
// form --emit meta prints (space- or comma-separated KEY=VALUE items); anything else is refused
// with the configurations that exist.
TEST_F(CliTest, InspectTakesATuningCandidateWithConfig) {
  const std::vector<std::string> spec = {"inspect", "rmsnorm", "--param", "rows=8,hidden=16384", "--dtype", "bf16",
                                         "--arch", "sm_90a"};
  auto with = [&](std::initializer_list<std::string> more) {
    std::vector<std::string> args = spec;
    args.insert(args.end(), more);
    return kiln(args);
  };
  Output heuristic = with({"--emit", "source"});
  ASSERT_EQ(heuristic.code, 0) << heuristic.err;
  EXPECT_NE(heuristic.out.find("THREADS = 1024, VEC = 8, ITEMS = 2;"), std::string::npos) << heuristic.out;
  for (const char* config : {"ITEMS=4 THREADS=512 VEC=8", "THREADS=512,VEC=8,ITEMS=4"}) {
    Output o = with({"--emit", "source", "--config", config});
    ASSERT_EQ(o.code, 0) << config << ": " << o.err;
    EXPECT_NE(o.out.find("THREADS = 512, VEC = 8, ITEMS = 4;"), std::string::npos) << config;
  }
  Output split = with({"--emit", "source", "--config", "ITEMS=4", "--config", "THREADS=512 VEC=8"});
  ASSERT_EQ(split.code, 0) << split.err;
  EXPECT_NE(split.out.find("THREADS = 512, VEC = 8, ITEMS = 4;"), std::string::npos);
  expect_one_error_line(with({"--emit", "source", "--config", "THREADS=1 VEC=8 ITEMS=4"}),
                        {"'ITEMS=4 THREADS=1 VEC=8' is not one of its variants or tuning candidates",
                         "'ITEMS=4 THREADS=512 VEC=8'"});
  expect_one_error_line(with({"--emit", "source", "--config", "THREADS"}), {"'THREADS' is not KEY=INTEGER"});
  expect_one_error_line(with({"--emit", "source", "--config", "THREADS=5x"}), {"'THREADS=5x' is not KEY=INTEGER"});
  expect_one_error_line(with({"--emit", "source", "--config", "ITEMS=4 ITEMS=2"}), {"'ITEMS' is given twice"});
  expect_one_error_line(with({"--emit", "meta", "--config", "ITEMS=4 THREADS=2 VEC=8"}), {"tuning candidates"});
  EXPECT_EQ(cache_files(), 0u);
}

// An enumerated parameter takes its value's name (granularity=block1x128) or its number.
TEST_F(CliTest, ParamsTakeTheNamesOfEnumeratedValues) {
  const std::vector<std::string> rest = {"--dtype", "bf16", "--out-dtype", "fp8_e4m3", "--arch", "sm_90a", "--emit", "source"};
  for (const char* value : {"granularity=block1x128", "granularity=2"}) {
    std::vector<std::string> args = {"inspect", "quantize_fp8", "--param", std::string("rows=4,cols=256,") + value};
    args.insert(args.end(), rest.begin(), rest.end());
    Output o = kiln(args);
    ASSERT_EQ(o.code, 0) << value << ": " << o.err;
    EXPECT_NE(o.out.find("#define GRAN 2"), std::string::npos) << value;
  }
  std::vector<std::string> bad = {"inspect", "quantize_fp8", "--param", "rows=4,cols=256,granularity=blocky"};
  bad.insert(bad.end(), rest.begin(), rest.end());
  expect_one_error_line(kiln(bad), {"granularity=blocky", "tensorwise, rowwise, block1x128, block128x128"});
}

TEST_F(CliTest, InspectMetaShowsResourcesAndTheCacheEntry) {
  KILN_REQUIRE_LLVM();  // prewarms or inspects gfx942
  for (const char* arch : {"gfx942", "sm_90a"}) {
    SCOPED_TRACE(arch);
    std::vector<std::string> args = {"inspect", "gemm"};
    args.insert(args.end(), kGemmParams.begin(), kGemmParams.end());
    args.insert(args.end(), {"--arch", arch, "--emit", "meta"});
    Output o = kiln_cached(args);
    ASSERT_EQ(o.code, 0) << o.err;
    if (std::string(arch) == "gfx942") {
      EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(registers\s+\d+ VGPRs, \d+ SGPRs)"))) << o.out;
      EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(LDS\s+\d+ bytes)"))) << o.out;
      EXPECT_NE(o.out.find("hsaco"), std::string::npos);
    } else {
      EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(registers\s+\d+ per thread)"))) << o.out;
      EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(shared\s+\d+ bytes)"))) << o.out;
      EXPECT_NE(o.out.find("cubin"), std::string::npos);
    }
    EXPECT_NE(o.out.find("origin        compiled"), std::string::npos) << o.out;
    std::smatch m;
    ASSERT_TRUE(std::regex_search(o.out, m, std::regex(R"(entry\s+(\S+)\n)"))) << o.out;
    EXPECT_TRUE(fs::is_directory(m[1].str())) << m[1].str();
    EXPECT_EQ(m[1].str().rfind(cache_ + "/v1/entries/", 0), 0u) << m[1].str();
    // The second time it comes from the disk cache.
    Output again = kiln_cached(args);
    EXPECT_NE(again.out.find("origin        disk"), std::string::npos) << again.out;
  }
}

TEST_F(CliTest, InspectMetaReportsTheMfmaHotLoopOnAmd) {
  KILN_REQUIRE_LLVM();
  for (const char* arch : {"gfx942", "gfx950"}) {
    SCOPED_TRACE(arch);
    Output o = kiln_cached({"inspect", "gemm", "-p", "M=512,N=512,K=4096,trans_a=0,trans_b=1", "--dtype", "bf16",
                            "--arch", arch, "--emit", "meta"});
    ASSERT_EQ(o.code, 0) << o.err;
    EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(tile config .*MFMA=1)"))) << o.out;
    EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(AGPRs\s+\d+)"))) << o.out;
    EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(hot loop\s+bytes 0x[0-9a-f]+\.\.0x[0-9a-f]+, \d+ instructions: [1-9]\d* MFMA, \d+ LDS, \d+ global, \d+ s_waitcnt)")))
        << o.out;
    EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(occupancy\s+[1-8] waves per SIMD)"))) << o.out;
    EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(model\s+modelled, not measured: [0-9.]+ TFLOP/s on MI3)"))) << o.out;
    EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(scratch\s+0 bytes)"))) << o.out;
  }
}

// The MFMA attention backward: the dK/dV kernel's report, and a line for each other kernel of its
// plan (D and dQ), each with its registers, LDS, scratch (none) and occupancy; MFMAs in both
// main kernels' hot loops.
TEST_F(CliTest, InspectMetaReportsEveryKernelOfTheMfmaAttentionBackward) {
  KILN_REQUIRE_LLVM();
  for (const char* arch : {"gfx942", "gfx950"}) {
    SCOPED_TRACE(arch);
    Output o = kiln_cached({"inspect", "attention_bwd", "-p", "batch=1,seqlen_q=512,seqlen_k=512,heads=8,kv_heads=2,head_dim=128,causal=1",
                            "--dtype", "bf16", "--arch", arch, "--emit", "meta"});
    ASSERT_EQ(o.code, 0) << o.err;
    EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(kernel\s+kiln_attention_bwd_dkdv)"))) << o.out;
    EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(tile config .*MFMA=1)"))) << o.out;
    EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(scratch\s+0 bytes)"))) << o.out;
    EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(hot loop\s+bytes 0x[0-9a-f]+\.\.0x[0-9a-f]+, \d+ instructions: [1-9]\d* MFMA)")))
        << o.out;
    EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(occupancy\s+[1-8] waves per SIMD)"))) << o.out;
    EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(also\s+kiln_attention_bwd_dot: \d+ VGPRs, \d+ AGPRs, \d+ SGPRs, LDS \d+ bytes, scratch 0 bytes per lane, 0 spills, [1-8] waves per SIMD)")))
        << o.out;
    EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(also\s+kiln_attention_bwd_dq: \d+ VGPRs, \d+ AGPRs, \d+ SGPRs, LDS [1-9]\d* bytes, scratch 0 bytes per lane, 0 spills, [1-8] waves per SIMD .*hot loop \d+ instructions, [1-9]\d* MFMA)")))
        << o.out;
  }
}

// A launch line names what changes how it launches: the Hopper attention backward's dK/dV and dq
// launches start as dependents of the previous one (programmatic dependent launch), the cross-entropy
// gradient's row-on-chip form runs in thread-block clusters; a plain launch says neither.
// (deterministic = 1: the ordered dq launch, which the atomic dQ of the default replaces.)
TEST_F(CliTest, InspectMetaNamesDependentAndClusterLaunches) {
  Output o = kiln_cached({"inspect", "attention_bwd", "-p",
                          "batch=1,seqlen_q=512,seqlen_k=512,heads=8,kv_heads=2,head_dim=128,causal=1,deterministic=1",
                          "--dtype", "bf16", "--arch", "sm_90a", "--emit", "meta"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(launch\s+kiln_attention_bwd_dot: grid \S+, block \d+, dynamic shared \d+ bytes\n)")))
      << o.out;
  for (const char* k : {"dkdv", "dq"})
    EXPECT_TRUE(std::regex_search(
        o.out, std::regex(fmt::format(R"(launch\s+kiln_attention_bwd_{}: .*bytes, programmatic dependent launch\n)", k))))
        << o.out;
  Output ce = kiln_cached({"inspect", "cross_entropy", "-p", "tokens=64,vocab=128256,grad_inplace=1", "--dtype", "bf16",
                           "--arch", "sm_90a", "--emit", "meta"});
  ASSERT_EQ(ce.code, 0) << ce.err;
  EXPECT_TRUE(std::regex_search(ce.out, std::regex(R"(launch\s+kiln_cross_entropy_grad_cluster: .*bytes, clusters of 2x1x1\n)")))
      << ce.out;
}

TEST_F(CliTest, InspectLlvmIr) {
  std::vector<std::string> args = {"inspect", "rmsnorm", "--param", "rows=4,hidden=128", "--arch", "gfx942",
                                   "--emit", "llvm"};
  Output o = kiln(args);
#if KILN_WITH_LLVM
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_NE(o.out.find("define"), std::string::npos);
  EXPECT_NE(o.out.find("kiln_rmsnorm"), std::string::npos);
#else
  expect_one_error_line(o, {"LLVM"});
#endif
}

TEST_F(CliTest, RunNeedsAGpu) {
  Output o = kiln_cached({"run", "rmsnorm", "--param", "rows=4,hidden=128"});
  if (o.code == 0) {  // a machine with a GPU: the check ran
    EXPECT_NE(o.out.find("PASS"), std::string::npos) << o.out;
    return;
  }
  expect_one_error_line(o, {"no GPU found: 'kiln run' needs an NVIDIA or AMD GPU"});
}

TEST_F(CliTest, RunBenchTakesNoTune) {
  Output o = kiln_cached({"run", "gemm", "--param", "M=64,N=128,K=32,trans_a=false,trans_b=true", "--bench", "--no-tune"});
  if (o.code == 0) {  // a machine with a GPU: no tuning line, just the benchmark
    EXPECT_EQ(o.out.find("tuning "), std::string::npos) << o.out;
    return;
  }
  expect_one_error_line(o, {"no GPU found: 'kiln run' needs an NVIDIA or AMD GPU"});
}

// ---- kiln run --emulator (skips where the AMD emulator is unavailable) ------------------------

TEST_F(CliTest, RunInTheEmulatorPrintsTheCheckReport) {
  Output o = kiln_env({"run", "swiglu", "-p", "intermediate=7,rows=2", "--dtype", "fp32", "--arch", "gfx950",
                       "--emulator", "--check", "--cache-dir", cache_},
                      {"CACHEDB=" KILN_TEST_EMULATOR_CACHEDB});
  if (o.code != 0 && o.err.find("the AMD emulator is unavailable") != std::string::npos)
    GTEST_SKIP() << o.err;
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("AMD CDNA emulator"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("(gfx950, "), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("PASS swiglu fp32 rows=2 intermediate=7: compared 14 elements"), std::string::npos) << o.out;
}

// The check report names an enumerated parameter's value as -p takes it (dw_dtype=dy). Before
// 2026-11-27 it printed the number (dw_dtype=1); prewarm's table already named it.
TEST_F(CliTest, TheCheckReportNamesEnumeratedValues) {
  Output o = kiln_env({"run", "embedding_bwd", "-p", "tokens=20,vocab=10,hidden=8,dw_dtype=dy", "--dtype", "bf16",
                       "--arch", "gfx950", "--emulator", "--check", "--cache-dir", cache_},
                      {"CACHEDB=" KILN_TEST_EMULATOR_CACHEDB});
  if (o.code != 0 && o.err.find("the AMD emulator is unavailable") != std::string::npos)
    GTEST_SKIP() << o.err;
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_NE(o.out.find("PASS embedding_bwd bf16 tokens=20 vocab=10 hidden=8 dw_dtype=dy:"),
            std::string::npos)
      << o.out;
}

// kiln run --json and kiln ops --json: one document each (docs/json.md), parsed here.
TEST_F(CliTest, JsonOfOpsAndRunParse) {
  Output ops = kiln({"ops", "--json"});
  ASSERT_EQ(ops.code, 0) << ops.err;
  const auto doc = nlohmann::json::parse(ops.out);
  EXPECT_EQ(doc["schema"], "kiln.ops");
  EXPECT_EQ(doc["ops"].size(), kiln::all_ops().size());
  for (const auto& op : doc["ops"]) EXPECT_FALSE(op["tensors"].empty()) << op["name"];
  Output run = kiln_env({"run", "rmsnorm_bwd", "-p", "hidden=7,rows=3", "--dtype", "fp32", "--arch", "gfx950",
                         "--emulator", "--json", "--cache-dir", cache_},
                        {"CACHEDB=" KILN_TEST_EMULATOR_CACHEDB});
  if (run.code != 0 && run.err.find("the AMD emulator is unavailable") != std::string::npos) GTEST_SKIP() << run.err;
  ASSERT_EQ(run.code, 0) << run.out << run.err;
  const auto r = nlohmann::json::parse(run.out);
  EXPECT_EQ(r["schema"], "kiln.run");
  EXPECT_TRUE(r["pass"].get<bool>());
  ASSERT_EQ(r["outputs"].size(), 2u);
  EXPECT_EQ(r["outputs"][1]["name"], "dgamma");
}

TEST_F(CliTest, RunEmulatorUsageErrors) {
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{"--emulator"}, {"--arch", "gfx942"}, {"--emulator", "--arch", "sm_90a"}}) {
    std::vector<std::string> args = {"run", "rmsnorm", "-p", "hidden=7,rows=2"};
    args.insert(args.end(), extra.begin(), extra.end());
    Output o = kiln_cached(args);
    EXPECT_EQ(o.code, 2) << o.err;
    expect_one_error_line(o, {"--emulator", "--arch gfx942"});
  }
  Output o = kiln_cached({"run", "rmsnorm", "-p", "hidden=7,rows=2", "--emulator", "--arch", "gfx942", "--bench"});
  EXPECT_EQ(o.code, 2) << o.err;
  expect_one_error_line(o, {"no timing model"});
}

// `kiln run --help` lists every op's dtypes (fp8 for dequantize_fp8) and says where the emulator
// comes from; a missing emulator is one error line that says how to get it (issue 19).
TEST_F(CliTest, RunHelpAndAMissingEmulatorSayWhatToDo) {
  const Output help = kiln({"run", "--help"});
  ASSERT_EQ(help.code, 0) << help.err;
  // CLI11 wraps long option texts: compare with the whitespace folded.
  const std::string text = std::regex_replace(help.out, std::regex("\\s+"), " ");
  EXPECT_NE(text.find("fp8_e4m3"), std::string::npos) << help.out;
  EXPECT_NE(text.find("fp8_e5m2fnuz (dequantize_fp8"), std::string::npos) << help.out;  // and gemm_fp8
  EXPECT_EQ(text.find("bf16, fp16 or fp32"), std::string::npos) << help.out;
  EXPECT_NE(text.find("KILN_AMD_EMULATOR"), std::string::npos) << help.out;
  EXPECT_NE(text.find("https://github.com/tinygrad/tinygrad at commit a9069c177a"), std::string::npos) << help.out;
  EXPECT_NE(text.find("Getting the emulator"), std::string::npos) << help.out;

  KILN_REQUIRE_LLVM();
  const Output o = kiln_env({"run", "rmsnorm", "-p", "hidden=7,rows=2", "--emulator", "--arch", "gfx942", "--cache-dir",
                             cache_},
                            {"KILN_AMD_EMULATOR=" + path("no-emulator-here")});
  EXPECT_EQ(o.code, 1) << o.err;
  expect_one_error_line(o, {"no AMD emulator at '" + path("no-emulator-here") + "'", "set KILN_AMD_EMULATOR",
                            "https://github.com/tinygrad/tinygrad at commit a9069c177a", "docs/emulator.md"});
}

// Huge sizes are refused with the figures before anything is allocated (issue 19: under an 8 GB
// address-space limit this ended in "internal error: std::bad_alloc", and without one in the OOM
// killer). The issue's command on the fake CUDA device (80 GiB free: the device side fits, the
// host copies do not), then in the emulator where it is available.
TEST_F(CliTest, HugeSizesAreRefusedWithTheMemoryTheyNeedAndTheLimit) {
  as_limit_kib_ = 8L << 20;  // 8 GiB
  const std::vector<std::string> args = {"run",   "gemm", "-p",      "M=65536",   "-p",        "N=65536",
                                         "-p",    "K=65536", "-p",   "trans_a=false", "-p",    "trans_b=true",
                                         "--dtype", "bf16", "--cache-dir", cache_};
  const Output fake = kiln_env(args, {"KILN_CUDA_LIB=" KILN_FAKE_CUDA});
  EXPECT_EQ(fake.code, 1) << fake.out << fake.err;
  EXPECT_EQ(fake.err.find("bad_alloc"), std::string::npos) << fake.err;
  expect_one_error_line(fake, {"gemm bf16", "M=65536", "of host memory", "the inputs as fp32 for the CPU reference 32.0 GiB",
                               "more than this process may still take", "give smaller sizes"});
  if (fake.err.find("MemAvailable") == std::string::npos) {
    EXPECT_NE(fake.err.find("RLIMIT_AS (ulimit -v) of 8.0 GiB"), std::string::npos) << fake.err;
  }

  std::vector<std::string> emulated = args;
  emulated.insert(emulated.end(), {"--emulator", "--arch", "gfx942"});
  const Output emu = kiln_env(emulated, {"CACHEDB=" KILN_TEST_EMULATOR_CACHEDB});
  if (emu.code != 0 && emu.err.find("the AMD emulator is unavailable") != std::string::npos) GTEST_SKIP() << emu.err;
  EXPECT_EQ(emu.code, 1) << emu.out << emu.err;
  EXPECT_EQ(emu.err.find("bad_alloc"), std::string::npos) << emu.err;
  // The emulator keeps device memory in host memory: whichever of the two is short is named.
  expect_one_error_line(emu, {"gemm bf16", "M=65536", "memory", "give smaller sizes"});
}

// ---- tuning ----------------------------------------------------------------------------------

TEST_F(CliTest, PrewarmTuneNeedsAGpuAndLeavesNothing) {
  write(path("small.json"), kSmallManifest);
  Output o = kiln_cached({"prewarm", path("small.json"), "--arch", "sm_90a", "--tune"});
  if (o.code == 0) {  // a machine with a GPU: a progress line per kernel built for it
    EXPECT_NE(o.out.find("tune [1/3]"), std::string::npos) << o.out;
    EXPECT_NE(o.out.find("tuned "), std::string::npos) << o.out;
    return;
  }
  expect_one_error_line(o, {"--tune times kernels on this machine's GPU, and no NVIDIA or AMD GPU was found",
                            "prewarm without --tune"});
  EXPECT_TRUE(o.out.empty()) << o.out;
  EXPECT_FALSE(fs::exists(cache_)) << "nothing was created";
}

TEST_F(CliTest, InspectMetaListsTuningRecords) {
  const std::vector<std::string> args = {"inspect", "gemm", "--param", "M=1024,N=1024,K=1024,trans_a=false,trans_b=true",
                                         "--arch", "sm_90a", "--emit", "meta", "--nvidia-compiler", "nvrtc"};
  Output before = kiln_cached(args);
  ASSERT_EQ(before.code, 0) << before.err;
  EXPECT_NE(before.out.find("tuned         not yet"), std::string::npos) << before.out;
  EXPECT_NE(before.out.find("tile config   BK=64 BM=128 BN=128"), std::string::npos) << before.out;

  // A record from a GPU machine, as Runtime::tune writes it.
  const kiln::KernelSpec spec{"gemm", kiln::DType::bf16, kiln::DType::bf16,
                              {{"M", 1024}, {"N", 1024}, {"K", 1024}, {"trans_a", 0}, {"trans_b", 1}}};
  const kiln::OpTemplate& gemm = **kiln::find_op("gemm");
  const kiln::TargetInfo& sm90 = kiln::testing::target("sm_90a");
  const kiln::KernelConfig winner = gemm.tuning_candidates(spec, sm90).back();
  kiln::TuningRecord r;
  r.key = kiln::TuningKey::make(kiln::tuning_subject(gemm, spec, sm90), sm90, "NVIDIA H200", "nvrtc");
  r.winner = winner;
  r.candidates = {kiln::TuneCandidate{winner, 0.0123, 0.012, 0.013, ""}};
  r.reps = 20;
  r.created_utc = "2025-06-01T12:00:00Z";
  auto cache = kiln::DiskCache::open(cache_);
  ASSERT_TRUE(cache.ok()) << cache.error().message;
  auto stored = kiln::store_tuning(**cache, r);
  ASSERT_TRUE(stored.ok()) << stored.error().message;

  Output after = kiln_cached(args);
  ASSERT_EQ(after.code, 0) << after.err;
  EXPECT_NE(after.out.find("tuned         " + kiln::config_string(winner) +
                           " on NVIDIA H200 (0.0123 ms median, 1 candidate, 2025-06-01T12:00:00Z)"),
            std::string::npos)
      << after.out;
  EXPECT_NE(after.out.find("record        " + *stored), std::string::npos) << after.out;
  // A spec with one configuration has nothing to tune and says nothing about it (rmsnorm with the
  // residual over 16 vectors: every block shape is one wavefront of one access).
  Output plain = kiln_cached(
      {"inspect", "rmsnorm", "--param", "rows=4,hidden=128,residual=true", "--arch", "sm_90a", "--emit", "meta"});
  ASSERT_EQ(plain.code, 0) << plain.err;
  EXPECT_EQ(plain.out.find("tuned"), std::string::npos) << plain.out;
}

// ---- cache archives, gc, verify --fix, record and replay ------------------------------------

/// Entry directories (v1/entries/<xx>/<key>) of a cache.
std::set<std::string> entry_dirs(const std::string& cache) {
  std::set<std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(cache + "/v1/entries", ec);
       !ec && it != fs::recursive_directory_iterator(); ++it)
    if (it.depth() == 1 && it->is_directory()) out.insert(it->path().string());
  return out;
}

uint64_t dir_bytes(const std::string& dir) {
  uint64_t n = 0;
  for (const auto& f : fs::directory_iterator(dir)) n += f.is_regular_file() ? f.file_size() : 0;
  return n;
}

size_t entries_under(const std::string& dir) {
  std::error_code ec;
  size_t n = 0;
  for (const auto& d : fs::directory_iterator(dir, ec)) n += d.is_directory();
  return n;
}

#define SKIP_WITHOUT_LIBARCHIVE(output)                                                  \
  if ((output).err.find("built without libarchive") != std::string::npos) GTEST_SKIP() << (output).err

TEST_F(CliTest, ExportThenImportElsewhereThenPrewarmFindsEverything) {
  KILN_REQUIRE_LLVM();  // prewarms or inspects gfx942
  const std::string file = path("small.json"), archive = path("kiln-cache.tar.zst");
  write(file, kSmallManifest);
  Output built = kiln_cached({"prewarm", file, "--arch", "gfx942,sm_90a"});
  ASSERT_EQ(built.code, 0) << built.out << built.err;

  Output exp = kiln_cached({"cache", "export", archive});
  SKIP_WITHOUT_LIBARCHIVE(exp);
  ASSERT_EQ(exp.code, 0) << exp.out << exp.err;
  EXPECT_TRUE(exp.err.empty()) << exp.err;
  EXPECT_NE(exp.out.find("exported 6 entries"), std::string::npos) << exp.out;
  EXPECT_TRUE(fs::is_regular_file(archive));
  EXPECT_FALSE(fs::exists(archive + ".tmp"));

  // Another cache at another path.
  const std::string b = path("elsewhere/node7/cache");
  Output imp = kiln({"cache", "import", archive, "--cache-dir", b});
  ASSERT_EQ(imp.code, 0) << imp.out << imp.err;
  EXPECT_TRUE(std::regex_search(imp.out, std::regex(R"(imported\s+6\n)"))) << imp.out;
  EXPECT_TRUE(std::regex_search(imp.out, std::regex(R"(rejected\s+0\n)"))) << imp.out;
  EXPECT_EQ(entries_under(b + "/v1/tmp"), 0u) << "the staging directory was left behind";

  Output warm = kiln({"prewarm", file, "--arch", "gfx942,sm_90a", "--cache-dir", b});
  ASSERT_EQ(warm.code, 0) << warm.out << warm.err;
  EXPECT_TRUE(std::regex_search(warm.out, std::regex(R"(compiled\s+0\n)"))) << warm.out;
  EXPECT_TRUE(std::regex_search(warm.out, std::regex(R"(already cached\s+6\n)"))) << warm.out;

  // Importing again adds nothing.
  Output again = kiln({"cache", "import", archive, "--cache-dir", b});
  ASSERT_EQ(again.code, 0) << again.out << again.err;
  EXPECT_TRUE(std::regex_search(again.out, std::regex(R"(imported\s+0\n)"))) << again.out;
  EXPECT_TRUE(std::regex_search(again.out, std::regex(R"(already present\s+6\n)"))) << again.out;
}

TEST_F(CliTest, ImportRejectsATamperedCodeObject) {
  KILN_REQUIRE_LLVM();  // prewarms or inspects gfx942
  const std::string file = path("small.json"), archive = path("plain.tar");
  write(file, kSmallManifest);
  ASSERT_EQ(kiln_cached({"prewarm", file, "--arch", "gfx942,sm_90a"}).code, 0);
  Output exp = kiln_cached({"cache", "export", archive, "--compression", "none"});
  SKIP_WITHOUT_LIBARCHIVE(exp);
  ASSERT_EQ(exp.code, 0) << exp.err;

  // Flip one byte in the middle of one code object, inside the (uncompressed) tar.
  std::string victim_dir;
  for (const std::string& d : entry_dirs(cache_))
    if (fs::exists(d + "/code.hsaco")) victim_dir = d;
  ASSERT_FALSE(victim_dir.empty());
  const std::string code = slurp(victim_dir + "/code.hsaco"), key = fs::path(victim_dir).filename().string();
  std::string tar = slurp(archive);
  const size_t at = tar.find(code);
  ASSERT_NE(at, std::string::npos);
  tar[at + code.size() / 2] = static_cast<char>(tar[at + code.size() / 2] ^ 0x01);
  write(path("tampered.tar"), tar);

  const std::string b = path("b");
  Output imp = kiln({"cache", "import", path("tampered.tar"), "--cache-dir", b});
  expect_one_error_line(imp, {"1 of 6 entries", "failed verification"});
  EXPECT_NE(imp.out.find(key.substr(0, 12)), std::string::npos) << imp.out;
  EXPECT_NE(imp.out.find("code.hsaco fails its SHA-256 check"), std::string::npos) << imp.out;
  EXPECT_FALSE(fs::exists(b + "/v1/entries/" + key.substr(0, 2) + "/" + key)) << "the bad entry was imported";
  EXPECT_EQ(entries_under(b + "/v1/tmp"), 0u);
  Output verify = kiln({"cache", "verify", "--cache-dir", b});
  EXPECT_EQ(verify.code, 0) << verify.out << verify.err;
  EXPECT_NE(verify.out.find("5 ok, 0 corrupt"), std::string::npos) << verify.out;

  // One byte flipped in a compressed archive: whatever it hits, no bad entry gets in.
  const std::string zst = path("c.tar.zst");
  ASSERT_EQ(kiln_cached({"cache", "export", zst}).code, 0);
  std::string z = slurp(zst);
  z[z.size() / 2] = static_cast<char>(z[z.size() / 2] ^ 0x01);
  write(zst, z);
  const std::string c = path("c");
  Output zimp = kiln({"cache", "import", zst, "--cache-dir", c});
  EXPECT_LE(count_lines(zimp.err), 1u) << zimp.err;
  Output zverify = kiln({"cache", "verify", "--cache-dir", c});
  EXPECT_EQ(zverify.code, 0) << zimp.out << zimp.err << zverify.out << zverify.err;
  EXPECT_EQ(entries_under(c + "/v1/tmp"), 0u);
}

TEST_F(CliTest, ImportOfANonArchiveOrATruncatedOneFailsCleanly) {
  const std::string b = path("b");
  write(path("notes.txt"), "these are not the kernels you are looking for\n");
  Output o = kiln({"cache", "import", path("notes.txt"), "--cache-dir", b});
  SKIP_WITHOUT_LIBARCHIVE(o);
  expect_one_error_line(o, {"notes.txt", "is not a kiln cache archive"});
  expect_one_error_line(kiln({"cache", "import", path("absent.tar.zst"), "--cache-dir", b}),
                        {"cannot read archive", "absent.tar.zst"});

  write(path("small.json"), kSmallManifest);
  ASSERT_EQ(kiln_cached({"prewarm", path("small.json"), "--arch", "sm_90a"}).code, 0);
  ASSERT_EQ(kiln_cached({"cache", "export", path("a.tar.zst")}).code, 0);
  const std::string whole = slurp(path("a.tar.zst"));
  write(path("half.tar.zst"), whole.substr(0, whole.size() / 2));
  expect_one_error_line(kiln({"cache", "import", path("half.tar.zst"), "--cache-dir", b}),
                        {"half.tar.zst", "damaged or truncated"});
  EXPECT_TRUE(entry_dirs(b).empty());
  EXPECT_EQ(entries_under(b + "/v1/tmp"), 0u);
}

TEST_F(CliTest, GcEvictsLeastRecentlyUsedFirst) {
  // Four kernels, prewarmed one after the other (the entry's mtime is its last use).
  std::vector<std::string> dirs;
  for (int hidden : {64, 128, 192, 256}) {
    const std::string m = path("k" + std::to_string(hidden) + ".json");
    write(m, R"({"kernels": [{"op": "rmsnorm", "dtype": "bf16", "params": {"rows": 4, "hidden": )" +
                 std::to_string(hidden) + "}}]}");
    const auto before = entry_dirs(cache_);
    Output o = kiln_cached({"prewarm", m, "--arch", "sm_90a"});
    ASSERT_EQ(o.code, 0) << o.out << o.err;
    for (const std::string& d : entry_dirs(cache_))
      if (!before.count(d)) dirs.push_back(d);
    ASSERT_EQ(dirs.size(), static_cast<size_t>(hidden / 64));
  }
  // Using k1 makes it the most recent.
  Output used =
      kiln_cached({"inspect", "rmsnorm", "--param", "rows=4,hidden=64", "--arch", "sm_90a", "--emit", "meta"});
  ASSERT_EQ(used.code, 0) << used.err;
  EXPECT_NE(used.out.find("origin        disk"), std::string::npos) << used.out;

  // No budget at all is a command-line mistake.
  expect_one_error_line(kiln_cached({"cache", "gc"}), {"no byte budget", "--max-size", "KILN_CACHE_MAX_SIZE"});

  const uint64_t budget = dir_bytes(dirs[0]) + dir_bytes(dirs[3]);
  Output gc = kiln_cached({"cache", "gc", "--max-size", std::to_string(budget)});
  ASSERT_EQ(gc.code, 0) << gc.out << gc.err;
  EXPECT_TRUE(std::regex_search(gc.out, std::regex(R"(evicted\s+2 )"))) << gc.out;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(gc.out, m, std::regex(R"(after\s+.*\((\d+) bytes\) in 2 entries)"))) << gc.out;
  EXPECT_LE(std::stoull(m[1].str()), budget);
  EXPECT_TRUE(fs::exists(dirs[0])) << "the most recently used entry was evicted";
  EXPECT_FALSE(fs::exists(dirs[1]));
  EXPECT_FALSE(fs::exists(dirs[2]));
  EXPECT_TRUE(fs::exists(dirs[3]));
  EXPECT_LE(dir_bytes(dirs[0]) + dir_bytes(dirs[3]), budget);

  // KILN_CACHE_MAX_SIZE is the default budget, and cache stat shows it.
  Output stat = kiln_env({"cache", "stat", "--cache-dir", cache_}, {"KILN_CACHE_MAX_SIZE=1G"});
  EXPECT_NE(stat.out.find("budget       1.00 GiB (1073741824 bytes) from KILN_CACHE_MAX_SIZE"), std::string::npos)
      << stat.out;
  Output env_gc = kiln_env({"cache", "gc", "--cache-dir", cache_}, {"KILN_CACHE_MAX_SIZE=1"});
  ASSERT_EQ(env_gc.code, 0) << env_gc.out << env_gc.err;
  EXPECT_TRUE(std::regex_search(env_gc.out, std::regex(R"(after\s+0 B \(0 bytes\) in 0 entries)"))) << env_gc.out;
}

TEST_F(CliTest, VerifyFixRebuildsATruncatedCodeObject) {
  write(path("small.json"), kSmallManifest);
  ASSERT_EQ(kiln_cached({"prewarm", path("small.json"), "--arch", "sm_90a"}).code, 0);
  std::string victim;
  for (const std::string& d : entry_dirs(cache_))
    if (fs::exists(d + "/code.cubin")) victim = d + "/code.cubin";
  ASSERT_FALSE(victim.empty());
  fs::resize_file(victim, fs::file_size(victim) / 3);

  Output bad = kiln_cached({"cache", "verify"});
  expect_one_error_line(bad, {"1 of 3 cache entries failed verification"});
  Output fix = kiln_cached({"cache", "verify", "--fix"});
  ASSERT_EQ(fix.code, 0) << fix.out << fix.err;
  EXPECT_TRUE(fix.err.empty()) << fix.err;
  EXPECT_NE(fix.out.find("fixed 1, removed 0, failed 0"), std::string::npos) << fix.out;
  EXPECT_TRUE(std::regex_search(fix.out, std::regex(R"(\n  fixed    \S+ .* for sm_90a rebuilt)"))) << fix.out;
  Output good = kiln_cached({"cache", "verify"});
  EXPECT_EQ(good.code, 0) << good.out << good.err;
  EXPECT_NE(good.out.find("3 ok, 0 corrupt"), std::string::npos) << good.out;

  // An entry whose meta.json is gone cannot be rebuilt: it is removed, and that is a success too.
  std::string other;
  for (const std::string& d : entry_dirs(cache_))
    if (d != fs::path(victim).parent_path().string()) other = d;
  fs::remove(other + "/meta.json");
  Output removed = kiln_cached({"cache", "verify", "--fix"});
  EXPECT_EQ(removed.code, 0) << removed.out << removed.err;
  EXPECT_NE(removed.out.find("fixed 0, removed 1, failed 0"), std::string::npos) << removed.out;

  Output stat = kiln_cached({"cache", "stat"});
  ASSERT_EQ(stat.code, 0) << stat.err;
  EXPECT_TRUE(std::regex_search(stat.out, std::regex(R"(entries\s+2\n)"))) << stat.out;
  EXPECT_TRUE(std::regex_search(stat.out, std::regex(R"(quarantined\s+2 )"))) << stat.out;
  EXPECT_TRUE(std::regex_search(stat.out, std::regex(R"(temporary\s+0 )"))) << stat.out;
  EXPECT_NE(stat.out.find("budget       unbounded"), std::string::npos) << stat.out;
  EXPECT_TRUE(std::regex_search(stat.out, std::regex(R"(telemetry\s+summed over \d+ runtimes)"))) << stat.out;
  EXPECT_TRUE(std::regex_search(stat.out, std::regex(R"(compiles\s+4 )"))) << stat.out;  // 3 + the rebuild
}

TEST_F(CliTest, RecordThenReplayWithPrewarm) {
  KILN_REQUIRE_LLVM();  // prewarms or inspects gfx942
  const std::string record = path("record.jsonl"), b = path("b");
  const std::vector<std::string> rec_env = {"KILN_RECORD=" + record};
  std::vector<std::string> gemm = {"inspect", "gemm"};
  gemm.insert(gemm.end(), kGemmParams.begin(), kGemmParams.end());
  gemm.insert(gemm.end(), {"--arch", "gfx942", "--emit", "meta"});
  const std::vector<std::string> norm = {"inspect", "rmsnorm", "--param", "rows=4,hidden=128", "--arch", "gfx942",
                                         "--emit", "meta"};
  ASSERT_EQ(kiln_env(gemm, rec_env).code, 0);
  ASSERT_EQ(kiln_env(norm, rec_env).code, 0);
  ASSERT_EQ(kiln_env(gemm, rec_env).code, 0);  // a disk hit: recorded again, replayed once
  EXPECT_EQ(count_lines(slurp(record)), 3u) << slurp(record);

  Output first = kiln({"prewarm", record, "--arch", "sm_90a", "--cache-dir", b});
  ASSERT_EQ(first.code, 0) << first.out << first.err;
  EXPECT_TRUE(first.err.empty()) << first.err;
  EXPECT_NE(first.out.find("2 kernels x 1 target"), std::string::npos) << first.out;
  EXPECT_TRUE(std::regex_search(first.out, std::regex(R"(compiled\s+2\n)"))) << first.out;
  EXPECT_TRUE(std::regex_search(first.out, std::regex(R"(repeated\s+1 )"))) << first.out;
  Output second = kiln({"prewarm", record, "--arch", "sm_90a", "--cache-dir", b});
  ASSERT_EQ(second.code, 0) << second.out << second.err;
  EXPECT_TRUE(std::regex_search(second.out, std::regex(R"(compiled\s+0\n)"))) << second.out;
  EXPECT_TRUE(std::regex_search(second.out, std::regex(R"(already cached\s+2\n)"))) << second.out;
}

TEST_F(CliTest, RecordingWithATornLastLinePrewarmsTheCompleteLines) {
  const std::string record = path("torn.jsonl");
  write(record,
        "{\"op\":\"rmsnorm\",\"dtype\":\"bf16\",\"out_dtype\":\"bf16\",\"params\":{\"hidden\":128,\"rows\":4}}\n"
        "{\"op\":\"swiglu\",\"dtype\":\"fp16\",\"out_dtype\":\"fp16\",\"params\":{\"intermediate\":64,\"rows\":4}}\n"
        "{\"op\":\"gemm\",\"dtype\":\"bf16\",\"out_dtype\":\"bf16\",\"params\":{\"K\":32,\"M\"");
  Output o = kiln_cached({"prewarm", record, "--arch", "sm_90a"});
  ASSERT_EQ(o.code, 0) << o.out << o.err;
  EXPECT_TRUE(std::regex_search(o.out, std::regex(R"(compiled\s+2\n)"))) << o.out;
  EXPECT_EQ(count_lines(o.err), 1u) << o.err;
  EXPECT_EQ(o.err.rfind("kiln: warning: '" + record + "': line 3: skipped the last line", 0), 0u) << o.err;

  // A bad line that is not the last one is an error naming it; nothing is compiled.
  write(path("bad.jsonl"),
        "{\"op\":\"rmsnorm\",\"dtype\":\"bf16\",\"params\":{\"hidden\":128,\"rows\":4}}\n\n"
        "{\"op\":\"rmsnorm\",\"dtype\":\"bf17\",\"params\":{\"hidden\":128,\"rows\":4}}\n");
  expect_one_error_line(kiln({"prewarm", path("bad.jsonl"), "--arch", "sm_90a", "--cache-dir", path("c")}),
                        {"bad.jsonl': line 3: unknown dtype 'bf17'; use one of: fp32, fp16, bf16, fp8_e4m3"});
  EXPECT_TRUE(entry_dirs(path("c")).empty());
}

// The library side of JSON lines: detection, line numbers, de-duplication, the torn last line.
TEST(Manifest, JsonLines) {
  auto m = kiln::parse_manifest(
      "{\"op\":\"gemm\",\"dtype\":\"bf16\",\"out_dtype\":\"fp32\",\"params\":{\"K\":32,\"M\":64,\"N\":64,\"trans_a\":0,"
      "\"trans_b\":1}}\n"
      "\n"
      "{\"op\":\"rmsnorm\",\"dtype\":\"bf16\",\"params\":{\"hidden\":128,\"rows\":4}}\r\n"
      "{\"op\":\"gemm\",\"dtype\":\"bf16\",\"out_dtype\":\"fp32\",\"params\":{\"K\":32,\"M\":64,\"N\":64,\"trans_a\":0,"
      "\"trans_b\":1}}\n"
      "{\"op\":\"rmsnorm\",\"dtype\":\"bf16\",\"params\":{\"hidden\":128,\"rows\":8}}\n"
      "{\"op\":\"swig",
      "rec.jsonl");
  ASSERT_TRUE(m.ok()) << m.error().message;
  ASSERT_EQ(m->kernels.size(), 3u);
  EXPECT_EQ(m->duplicates, 1u);
  EXPECT_EQ(m->kernels[0].line, 1u);
  EXPECT_EQ(m->kernels[0].spec.out_dtype, kiln::DType::f32);
  EXPECT_EQ(m->kernels[0].spec.params.at("trans_b"), 1);
  EXPECT_EQ(m->kernels[1].line, 3u);
  EXPECT_EQ(m->kernels[2].line, 5u);
  EXPECT_EQ(m->kernels[2].spec.params.at("rows"), 8);
  ASSERT_EQ(m->warnings.size(), 1u);
  EXPECT_NE(m->warnings[0].find("'rec.jsonl': line 6: skipped the last line"), std::string::npos) << m->warnings[0];

  auto bad = kiln::parse_manifest(
      "{\"op\":\"rmsnorm\",\"dtype\":\"bf16\",\"params\":{\"hidden\":128,\"rows\":4}}\n{\"op\":\"rmsnorm\",,}\n"
      "{\"op\":\"rmsnorm\",\"dtype\":\"bf16\",\"params\":{\"hidden\":128,\"rows\":4}}\n",
      "rec.jsonl");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("'rec.jsonl': line 2, column"), std::string::npos) << bad.error().message;
  auto field = kiln::parse_manifest("{\"op\":\"rmsnorm\",\"dtype\":\"bf16\",\"prams\":{}}\n", "rec.jsonl");
  ASSERT_FALSE(field.ok());
  EXPECT_NE(field.error().message.find("'rec.jsonl': line 1: unknown field 'prams'"), std::string::npos)
      << field.error().message;
  // A document on one line is still a document; validation names JSON lines by line.
  auto doc = kiln::parse_manifest(
      R"({"kernels": [{"op": "rmsnorm", "dtype": "bf16", "params": {"rows": 1, "hidden": 64}}]})", "doc.json");
  ASSERT_TRUE(doc.ok()) << doc.error().message;
  EXPECT_EQ(doc->kernels[0].line, 0u);
  auto zero =
      kiln::parse_manifest("\n\n{\"op\":\"rmsnorm\",\"dtype\":\"bf16\",\"params\":{\"hidden\":0,\"rows\":4}}\n", "r");
  ASSERT_TRUE(zero.ok()) << zero.error().message;
  const kiln::TargetInfo* sm90 = kiln::find_target("sm_90a").value();
  auto valid = kiln::validate_manifest(*zero, std::span<const kiln::TargetInfo* const>(&sm90, 1), "r");
  ASSERT_FALSE(valid.ok());
  EXPECT_EQ(valid.error().message.rfind("'r': line 3: ", 0), 0u) << valid.error().message;
}

}  // namespace

namespace {

// ---- Input and configuration are validated (issue 10, section 3) ----

TEST_F(CliTest, ADeeplyNestedManifestIsAnErrorNotACrash) {
  write(path("deep.json"), std::string(100000, '['));
  expect_one_error_line(kiln({"prewarm", path("deep.json"), "--arch", "sm_90a"}), {"deep.json", "nested deeper than"});
  write(path("deep2.json"), std::string(100000, '[') + std::string(100000, ']'));
  expect_one_error_line(kiln({"prewarm", path("deep2.json"), "--arch", "sm_90a"}), {"deep2.json", "nested deeper than"});
  write(path("deep.jsonl"), R"({"op": "swiglu", "dtype": "bf16", "params": )" + std::string(50000, '[') + "\n");
  const Output lines = kiln({"prewarm", path("deep.jsonl"), "--arch", "sm_90a"});
  EXPECT_LT(lines.code, 128) << "crashed: " << lines.err;
}

TEST_F(CliTest, ManifestsAreRegularFilesWithoutDuplicateKeys) {
  time_limit_s_ = 20;
  ASSERT_EQ(::mkfifo(path("fifo.json").c_str(), 0600), 0);
  expect_one_error_line(kiln({"prewarm", path("fifo.json"), "--arch", "sm_90a"}), {"fifo.json", "not a regular file"});
  expect_one_error_line(kiln({"prewarm", "/dev/zero", "--arch", "sm_90a"}), {"/dev/zero", "not a regular file"});
  write(path("dup.json"), R"({"kernels": [{"op": "swiglu", "dtype": "bf16", "dtype": "fp16",
      "params": {"rows": 1, "intermediate": 64}}]})");
  expect_one_error_line(kiln({"prewarm", path("dup.json"), "--arch", "sm_90a"}), {"dup.json", "duplicate key \"dtype\""});
}

TEST_F(CliTest, ControlCharactersInLabelsArePrintedEscaped) {
  write(path("label.json"), R"({"kernels": [{"op": "swiglu", "dtype": "bf16", "label": "a\u001b[2Jb\u0000c",
      "params": {"rows": 1, "intermediate": 64}}]})");
  const Output o = kiln_cached({"prewarm", path("label.json"), "--arch", "sm_90a"});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(o.out.find('\x1b'), std::string::npos) << "an ESC byte reached the terminal";
  EXPECT_EQ(o.out.find(std::string(1, '\0')), std::string::npos) << "a NUL byte reached the terminal";
  EXPECT_NE(o.out.find("a\\x1b[2Jb\\x00c"), std::string::npos) << o.out;
}

TEST_F(CliTest, InvalidEnvironmentVariablesAreErrorsNamingVariableAndValue) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"KILN_LOCK_TIMEOUT", "abc"},  {"KILN_LOCK_TIMEOUT", "-5"},      {"KILN_LOCK_TIMEOUT", "nan"},
      {"KILN_LOCK_TIMEOUT", "1e300"}, {"KILN_CACHE_MAX_SIZE", "abc"},  {"KILN_CACHE_MAX_SIZE", "-1"},
      {"KILN_CACHE_MAX_SIZE", "2 GiB"}, {"KILN_CACHE_MAX_SIZE", "1e30"}, {"KILN_CACHE_MAX_SIZE", "nan"},
      {"KILN_CACHE_MAX_SIZE", "0"},  {"KILN_LOG", "wrn"}};
  for (const auto& [name, value] : bad) {
    SCOPED_TRACE(name + "=" + value);
    const Output o = kiln_env({"cache", "stat", "--cache-dir", cache_}, {name + "=" + value});
    EXPECT_EQ(o.code, 2);
    expect_one_error_line(o, {name + "='" + value + "'"});
  }
  // The accepted forms still work.
  for (const char* ok : {"KILN_LOCK_TIMEOUT=2.5", "KILN_CACHE_MAX_SIZE=2GiB", "KILN_CACHE_MAX_SIZE=512M", "KILN_LOG=info"}) {
    const Output o = kiln_env({"cache", "stat", "--cache-dir", cache_}, {ok});
    EXPECT_EQ(o.code, 0) << ok << ": " << o.err;
  }
}

TEST_F(CliTest, ZeroBudgetsAreRefusedAlike) {
  expect_one_error_line(kiln_cached({"cache", "gc", "--max-size", "0"}), {"--max-size 0", "kiln cache clear"});
  expect_one_error_line(kiln_env({"cache", "gc", "--cache-dir", cache_}, {"KILN_CACHE_MAX_SIZE=0"}),
                        {"KILN_CACHE_MAX_SIZE='0'", "positive size"});
}

TEST_F(CliTest, RecordingToAFifoFailsAtOnceInsteadOfHanging) {
  time_limit_s_ = 20;
  ASSERT_EQ(::mkfifo(path("rec").c_str(), 0600), 0);
  const Output o = kiln_env({"inspect", "swiglu", "--param", "rows=1,intermediate=64", "--arch", "sm_90a", "--emit",
                             "meta", "--cache-dir", cache_},
                            {"KILN_RECORD=" + path("rec")});
  EXPECT_NE(o.code, 128 + SIGKILL) << "hung";
  expect_one_error_line(o, {"KILN_RECORD"});
}

// ---- Faults (issue 10, section 2) ----

TEST_F(CliTest, PrewarmThatKeepsNothingSaysSoAndFails) {
  write(path("small.json"), kSmallManifest);
  const Output o = kiln_env({"prewarm", path("small.json"), "--arch", "sm_90a", "--cache-dir", cache_},
                            {"KILN_CACHE_MAX_SIZE=1"});
  EXPECT_EQ(o.code, 1) << o.out << o.err;
  EXPECT_NE(o.out.find("not kept"), std::string::npos) << o.out;
  EXPECT_NE(o.err.find("kept nothing"), std::string::npos) << o.err;
}

TEST_F(CliTest, AFifoInTheCacheNeverHangsTheCacheCommands) {
  time_limit_s_ = 30;
  write(path("small.json"), kSmallManifest);
  ASSERT_EQ(kiln_cached({"prewarm", path("small.json"), "--arch", "sm_90a"}).code, 0);
  const std::set<std::string> entries = entry_dirs(cache_);
  ASSERT_GE(entries.size(), 2u);
  const std::string first = *entries.begin(), second = *std::next(entries.begin());
  ASSERT_EQ(::unlink((first + "/meta.json").c_str()), 0);
  ASSERT_EQ(::mkfifo((first + "/meta.json").c_str(), 0600), 0);
  ASSERT_EQ(::unlink((second + "/code.cubin").c_str()), 0);
  ASSERT_EQ(::mkfifo((second + "/code.cubin").c_str(), 0600), 0);
  for (const std::vector<std::string>& cmd : std::vector<std::vector<std::string>>{
           {"cache", "stat"}, {"cache", "ls"}, {"cache", "verify"}, {"cache", "gc", "--max-size", "1G"},
           {"cache", "export", path("out.tar.zst")}, {"prewarm", path("small.json"), "--arch", "sm_90a"},
           {"cache", "verify", "--fix"}, {"cache", "clear"}}) {
    std::vector<std::string> args = cmd;
    args.insert(args.end(), {"--cache-dir", cache_});
    const Output o = kiln(args);
    EXPECT_LT(o.code, 128) << fmt::format("{}", fmt::join(cmd, " ")) << " hung or crashed: " << o.err;
  }
}

TEST_F(CliTest, ExportNeverFollowsAPlantedSymlink) {
  write(path("small.json"), kSmallManifest);
  ASSERT_EQ(kiln_cached({"prewarm", path("small.json"), "--arch", "sm_90a"}).code, 0);
  write(path("victim"), "precious");
  const std::string archive = path("out.tar.zst");
  ASSERT_EQ(::symlink(path("victim").c_str(), (archive + ".tmp").c_str()), 0);
  const Output o = kiln_cached({"cache", "export", archive});
  ASSERT_EQ(o.code, 0) << o.err;
  EXPECT_EQ(slurp(path("victim")), "precious") << "the export wrote through a planted symlink";
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(archive)));
  struct stat st{};
  ASSERT_EQ(::stat(archive.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077 & ~0044, 0u) << "group/others may not write the archive";
}

TEST_F(CliTest, AReadOnlyCacheCanBeAudited) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  const std::string mnt = path("ro");
  fs::create_directories(mnt);
  if (system(("mount -t tmpfs -o size=16m,mode=0700 tmpfs " + mnt + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "this machine does not allow mounting a tmpfs";
  write(path("small.json"), kSmallManifest);
  const Output warm = kiln({"prewarm", path("small.json"), "--arch", "sm_90a", "--cache-dir", mnt});
  EXPECT_EQ(warm.code, 0) << warm.err;
  ASSERT_EQ(system(("mount -o remount,ro " + mnt).c_str()), 0);
  for (const char* sub : {"stat", "ls", "verify"}) {
    const Output o = kiln({"cache", sub, "--cache-dir", mnt});
    EXPECT_EQ(o.code, 0) << sub << ": " << o.err;
  }
  const Output fix = kiln({"cache", "verify", "--fix", "--cache-dir", mnt});
  EXPECT_NE(fix.code, 0) << "--fix writes, and the cache is read-only";
  EXPECT_EQ(system(("umount " + mnt).c_str()), 0);
}

// ---- Trust: signed archives (issue 10, section 1) ----

TEST_F(CliTest, WithTrustedKeysOnlyArchivesSignedByThemAreImported) {
  if (system("openssl version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl command to make keys";
  for (const char* who : {"alice", "mallory"}) {
    ASSERT_EQ(system(fmt::format("openssl genpkey -algorithm ed25519 -out {0}/{1}.pem 2>/dev/null && openssl pkey -in "
                                 "{0}/{1}.pem -pubout -out {0}/{1}.pub 2>/dev/null",
                                 dir_, who)
                         .c_str()),
              0);
  }
  write(path("small.json"), kSmallManifest);
  ASSERT_EQ(kiln_cached({"prewarm", path("small.json"), "--arch", "sm_90a"}).code, 0);
  const Output signed_by_alice = kiln_cached({"cache", "export", path("a.tar.zst"), "--sign", path("alice.pem")});
  ASSERT_EQ(signed_by_alice.code, 0) << signed_by_alice.err;
  EXPECT_NE(signed_by_alice.out.find("signed   ed25519 key"), std::string::npos) << signed_by_alice.out;
  ASSERT_EQ(kiln_cached({"cache", "export", path("m.tar.zst"), "--sign", path("mallory.pem")}).code, 0);
  ASSERT_EQ(kiln_cached({"cache", "export", path("u.tar.zst")}).code, 0);
  expect_one_error_line(kiln_cached({"cache", "export", path("x.tar.zst"), "--sign", path("alice.pub")}),
                        {"not an Ed25519 private key"});

  const std::string other = path("other");
  auto import = [&](const std::string& archive) {
    return kiln_env({"cache", "import", archive, "--cache-dir", other}, {"KILN_TRUSTED_KEYS=" + path("alice.pub")});
  };
  expect_one_error_line(import(path("u.tar.zst")), {"is not signed", "KILN_TRUSTED_KEYS"});
  expect_one_error_line(import(path("m.tar.zst")), {"not by a key in KILN_TRUSTED_KEYS"});
  EXPECT_FALSE(fs::exists(other + "/v1/entries") && !fs::is_empty(other + "/v1/entries")) << "nothing imported";
  const Output good = import(path("a.tar.zst"));
  ASSERT_EQ(good.code, 0) << good.err;
  EXPECT_NE(good.out.find("signed by"), std::string::npos) << good.out;
  EXPECT_FALSE(fs::is_empty(other + "/v1/entries"));
  // Without trusted keys, an unsigned archive is imported as before.
  const Output plain = kiln({"cache", "import", path("u.tar.zst"), "--cache-dir", path("third")});
  EXPECT_EQ(plain.code, 0) << plain.err;
  // A key file that is not a key: a clear error.
  write(path("junk.pub"), "junk");
  expect_one_error_line(kiln_env({"cache", "import", path("a.tar.zst"), "--cache-dir", other},
                                 {"KILN_TRUSTED_KEYS=" + path("junk.pub")}),
                        {"KILN_TRUSTED_KEYS", "junk.pub"});
}

}  // namespace
// --json (docs/json.md): each reporting command prints one document that parses, with its schema
// name and version, integer counts, and nothing on stderr when it succeeds.
TEST_F(CliTest, JsonReportsOfPrewarmAndCacheStatLsVerifyParse) {
  const std::string target = kiln::testing::compilable_target();
  const std::string file = path("small.json");
  write(file, R"({"kernels": [
    {"op": "rmsnorm", "dtype": "bf16", "label": "norm", "params": {"rows": 4, "hidden": 128}},
    {"op": "swiglu", "dtype": "fp16", "params": {"rows": 4, "intermediate": 64}},
    {"op": "swiglu", "dtype": "bf16", "params": {"rows": 4, "intermediate": 96}}]})");
  auto parse = [](const Output& o) {
    auto doc = nlohmann::json::parse(o.out, nullptr, /*allow_exceptions=*/false);
    EXPECT_TRUE(doc.is_object()) << o.out;
    return doc;
  };
  Output first = kiln_cached({"prewarm", file, "--arch", target, "--json"});
  ASSERT_EQ(first.code, 0) << first.out << first.err;
  EXPECT_TRUE(first.err.empty()) << first.err;
  auto doc = parse(first);
  EXPECT_EQ(doc["schema"], "kiln.prewarm");
  EXPECT_EQ(doc["schema_version"], 1);
  for (const char* count : {"compiled", "already_cached", "failed", "remote_hits"})
    EXPECT_TRUE(doc["summary"][count].is_number_unsigned()) << count << ": " << doc["summary"].dump();
  EXPECT_EQ(doc["summary"]["compiled"], 3);
  EXPECT_EQ(doc["summary"]["already_cached"], 0);
  EXPECT_EQ(doc["summary"]["failed"], 0);
  EXPECT_EQ(doc["summary"]["remote_hits"], 0);
  ASSERT_EQ(doc["kernels"].size(), 3u);
  EXPECT_EQ(doc["kernels"][0]["label"], "norm");
  EXPECT_EQ(doc["kernels"][0]["target"], target);
  EXPECT_EQ(doc["kernels"][0]["origin"], "compiled");
  EXPECT_GT(doc["kernels"][0]["bytes"].get<uint64_t>(), 0u);
  EXPECT_TRUE(doc["failures"].empty());

  Output second = kiln({"prewarm", file, "--arch", target, "--json"});
  ASSERT_EQ(second.code, 0) << second.err;
  EXPECT_EQ(parse(second)["summary"]["already_cached"], 3);

  Output stat = kiln_cached({"cache", "stat", "--json"});
  ASSERT_EQ(stat.code, 0) << stat.err;
  doc = parse(stat);
  EXPECT_EQ(doc["schema"], "kiln.cache.stat");
  EXPECT_EQ(doc["entries"], 3);
  EXPECT_EQ(doc["by_target"][target], 3);
  EXPECT_TRUE(doc["total_bytes"].is_number_unsigned());
  EXPECT_GE(doc["telemetry"]["runtimes"].get<int>(), 2);
  EXPECT_EQ(doc["telemetry"]["counters"]["compiles"], 3);

  Output ls = kiln_cached({"cache", "ls", "--json"});
  ASSERT_EQ(ls.code, 0) << ls.err;
  doc = parse(ls);
  EXPECT_EQ(doc["schema"], "kiln.cache.ls");
  ASSERT_EQ(doc["entries"].size(), 3u);
  const std::string entry_path = doc["entries"][0]["path"];
  EXPECT_EQ(doc["entries"][0]["key"].get<std::string>().size(), 64u);

  // A truncated code object: verify reports it in the document and exits 1 with one error line.
  for (const auto& f : fs::directory_iterator(entry_path))
    if (f.path().filename().string().rfind("code.", 0) == 0) fs::resize_file(f.path(), 10);
  Output verify = kiln_cached({"cache", "verify", "--json"});
  EXPECT_EQ(verify.code, 1);
  EXPECT_EQ(count_lines(verify.err), 1u) << verify.err;
  doc = parse(verify);
  EXPECT_EQ(doc["schema"], "kiln.cache.verify");
  EXPECT_EQ(doc["entries"], 3);
  EXPECT_EQ(doc["ok"], 2);
  ASSERT_EQ(doc["corrupt"].size(), 1u);
  EXPECT_EQ(doc["corrupt"][0]["path"], entry_path);
  EXPECT_TRUE(doc["fix"].is_null());
}

TEST_F(CliTest, JsonOfManifestListAndInspectMetaParse) {
  Output list = kiln({"manifest", "--list", "--json"});
  ASSERT_EQ(list.code, 0) << list.err;
  auto doc = nlohmann::json::parse(list.out, nullptr, false);
  ASSERT_TRUE(doc.is_object()) << list.out;
  EXPECT_EQ(doc["schema"], "kiln.manifest.list");
  EXPECT_EQ(doc["schema_version"], 1);
  bool llama = false;
  for (const auto& m : doc["models"]) llama |= m["name"] == "llama3.1-8b" && m["hidden"] == 4096;
  EXPECT_TRUE(llama) << list.out;
  EXPECT_FALSE(doc["gemms"].empty());
  EXPECT_EQ(doc["fp8"], nlohmann::json({"tensorwise", "rowwise", "block", "block1x128", "block128x128"}));
  expect_one_error_line(kiln({"manifest", "llama3.1-8b", "--json"}), {"--json goes with --list"});

  const std::string target = kiln::testing::compilable_target();
  Output meta = kiln_cached({"inspect", "rmsnorm", "--param", "rows=4,hidden=128", "--dtype", "bf16", "--arch", target,
                             "--emit", "meta", "--json"});
  ASSERT_EQ(meta.code, 0) << meta.err;
  doc = nlohmann::json::parse(meta.out, nullptr, false);
  ASSERT_TRUE(doc.is_object()) << meta.out;
  EXPECT_EQ(doc["schema"], "kiln.inspect.meta");
  EXPECT_EQ(doc["target"], target);
  EXPECT_EQ(doc["origin"], "compiled");
  EXPECT_GT(doc["bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(doc["cache_key"].get<std::string>().size(), 64u);
  ASSERT_TRUE(doc["launches"].is_array());
  EXPECT_TRUE(doc["launches"][0]["grid"].is_array());
  expect_one_error_line(kiln_cached({"inspect", "rmsnorm", "--param", "rows=4,hidden=128", "--arch", target, "--emit",
                                     "source", "--json"}),
                        {"--json goes with --emit meta"});
}
