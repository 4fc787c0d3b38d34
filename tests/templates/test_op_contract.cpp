// The op contract, held for every op in the registry: specs, signature, plans, references and
// sources agree. A new op is covered here without a line in this file (as ggml's
// test-backend-ops covers every op).
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

#include "codegen/codegen.h"
#include "templates/registry.h"
#include "test_util.h"

namespace kiln {
namespace {

TEST(OpContract, RegistryNamesAreUniqueAndFound) {
  std::set<std::string> names;
  for (const OpTemplate* op : all_ops()) {
    EXPECT_TRUE(names.insert(std::string(op->name())).second) << "two ops named " << op->name();
    auto found = find_op(op->name());
    ASSERT_TRUE(found.ok());
    EXPECT_EQ(*found, op);
  }
  auto missing = find_op("conv2d");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, Errc::not_found);
  for (const std::string& n : names) EXPECT_NE(missing.error().message.find(n), std::string::npos) << "lists " << n;
}

// spec_text (the check report's spec, `kiln run --check`'s PASS line) names an enumerated
// parameter's value as -p takes it, in the op's parameter order; an undeclared one follows by
// number. (Before, the report printed to_string's numbers: granularity=2.)
TEST(OpContract, SpecTextNamesEnumeratedValues) {
  const KernelSpec spec{"gemm_fp8", DType::e4m3, DType::bf16,
                        {{"M", 64}, {"N", 64}, {"K", 256}, {"granularity", 2}, {"b_format", 0}, {"extra", 5}}};
  const OpTemplate* op = *find_op("gemm_fp8");
  std::string granularity;
  for (const ParamInfo& p : op->params())
    if (p.name == "granularity" && p.choices.size() > 2) granularity = std::string(p.choices[2]);
  ASSERT_FALSE(granularity.empty());
  const std::string text = spec_text(spec);
  EXPECT_NE(text.find(" granularity=" + granularity), std::string::npos) << text;
  EXPECT_NE(text.find(" extra=5"), std::string::npos) << text;
  EXPECT_EQ(text.rfind("gemm_fp8 ", 0), 0u) << text;
  EXPECT_LT(text.find(" M=64"), text.find(" K=256")) << "the op's order: " << text;
}

// Every test spec of every op, for every target, with what each check needs.
template <class F>
void for_each_test_spec(F&& f) {
  for (const OpTemplate* op : all_ops())
    for (const TargetInfo& t : all_targets()) {
      const std::vector<TestSpec> specs = op->test_specs(t);
      EXPECT_FALSE(specs.empty()) << op->name() << " has no test specs for " << t.name;
      for (const TestSpec& s : specs) {
        SCOPED_TRACE(fmt::format("{} on {} ({})", to_string(s.spec), t.name, s.why));
        f(*op, t, s.spec);
      }
    }
}

TEST(OpContract, TestSpecsValidateAndPlansMatchTheSignature) {
  for_each_test_spec([](const OpTemplate& op, const TargetInfo& t, const KernelSpec& spec) {
    auto valid = op.validate(spec, t);
    ASSERT_TRUE(valid.ok()) << valid.error().message;
    const KernelSpec full = op.with_defaults(spec);
    const std::vector<TensorInfo> tensors = op.tensors(full);
    bool seen_output = false;
    for (const TensorInfo& tensor : tensors) {
      EXPECT_FALSE(!tensor.output && seen_output) << "inputs come before outputs: " << tensor.name;
      seen_output |= tensor.output;
      for (int64_t d : tensor.shape) EXPECT_GE(d, 0) << tensor.name;
      if (tensor.overwrites >= 0) {  // in place: over an input of the same shape and dtype
        ASSERT_TRUE(tensor.output) << tensor.name;
        const TensorInfo& in = tensors[static_cast<size_t>(tensor.overwrites)];
        EXPECT_FALSE(in.output) << tensor.name << " overwrites " << in.name;
        EXPECT_EQ(in.shape, tensor.shape) << tensor.name << " overwrites " << in.name;
        EXPECT_EQ(in.dtype, tensor.dtype) << tensor.name << " overwrites " << in.name;
      }
    }
    EXPECT_TRUE(seen_output) << "an op writes something";
    const std::vector<KernelConfig> variants = op.variants(op.baked_spec(spec), t);
    ASSERT_FALSE(variants.empty());
    EXPECT_EQ(variants.front(), op.choose_config(op.baked_spec(spec), t)) << "the heuristic's variant comes first";
    for (const KernelConfig& c : variants) {
      const Plan plan = op.plan(full, c);
      for (const Launch& l : plan.launches) {
        EXPECT_LE(l.args.size(), 32u);
        EXPECT_GE(l.geometry.block.x, 1u);
        EXPECT_LE(l.geometry.block.x * l.geometry.block.y * l.geometry.block.z, uint32_t(t.max_threads_per_block));
        EXPECT_GE(uint64_t(l.geometry.grid.x) * l.geometry.grid.y * l.geometry.grid.z, 1u);
        for (const KernelArg& a : l.args) {
          if (a.kind == KernelArg::Kind::tensor || a.kind == KernelArg::Kind::tensor_map) {
            EXPECT_LT(a.index, tensors.size());
          }
          if (a.kind == KernelArg::Kind::scalar) {
            EXPECT_LT(a.index, op.scalars().size());
          }
          if (a.kind == KernelArg::Kind::workspace) {
            EXPECT_LT(uint64_t(a.value), std::max<uint64_t>(plan.workspace_bytes, 1));
          }
        }
      }
    }
  });
}

TEST(OpContract, ReferencesFillEveryOutputWithFiniteValues) {
  std::mt19937_64 rng(std::random_device{}());
  for (const OpTemplate* op : all_ops()) {
    for (const TestSpec& s : op->test_specs(all_targets().back())) {
      SCOPED_TRACE(to_string(s.spec));
      const KernelSpec full = op->with_defaults(s.spec);
      std::vector<TensorInfo> inputs, outputs;
      for (const TensorInfo& t : op->tensors(full)) (t.output ? outputs : inputs).push_back(t);
      std::vector<std::vector<float>> values;
      op->init_inputs(full, inputs, values, rng);
      ASSERT_EQ(values.size(), inputs.size());
      for (size_t i = 0; i < inputs.size(); ++i) {
        ASSERT_EQ(int64_t(values[i].size()), inputs[i].elements()) << inputs[i].name;
        for (float v : values[i]) {
          // Index tensors (ids, positions, cu_seqlens) hold 0 where it is a valid index.
          if (!is_integer(inputs[i].dtype)) {
            ASSERT_NE(v, 0.0f) << inputs[i].name << ": inputs are never zero";
          }
          ASSERT_EQ(v, round_to_dtype(v, inputs[i].dtype)) << inputs[i].name << ": inputs are rounded to their dtype";
        }
      }
      std::vector<RefOutput> refs;
      op->reference(full, {}, values, {}, refs);
      ASSERT_EQ(refs.size(), outputs.size());
      for (size_t i = 0; i < outputs.size(); ++i) {
        const TensorInfo& t = outputs[i];
        const int64_t rows = t.shape.empty() ? 1 : t.shape.front();
        const int64_t per_row = rows ? t.elements() / rows : 0;
        const int64_t expect = refs[i].rows.empty() ? t.elements() : int64_t(refs[i].rows.size()) * per_row;
        EXPECT_EQ(int64_t(refs[i].values.size()), expect) << t.name;
        // Finite, or -inf: the log-sum-exp of an empty set (attention's lse of a row that sees no key),
        // or NaN: an element the op leaves unwritten (attention_bwd's dq columns past the heads of
        // a strided view); not all of an output.
        int64_t unwritten = 0;
        for (double v : refs[i].values) {
          ASSERT_TRUE(std::isfinite(v) || v == -INFINITY || std::isnan(v)) << t.name;
          unwritten += std::isnan(v);
        }
        EXPECT_TRUE(refs[i].values.empty() || unwritten < int64_t(refs[i].values.size())) << t.name;
      }
    }
  }
}

TEST(OpContract, SourcesHoldEveryKernelTheirPlansLaunch) {
  for_each_test_spec([](const OpTemplate& op, const TargetInfo& t, const KernelSpec& spec) {
    const KernelSpec full = op.with_defaults(spec);
    for (const KernelConfig& c : op.variants(op.baked_spec(spec), t)) {
      auto src = generate(spec, t, &c);
      ASSERT_TRUE(src.ok()) << src.error().message;
      EXPECT_NE(src->text.find(fmt::format("constexpr unsigned KILN_DYNAMIC_SHARED_BYTES = {};",
                                           op.dynamic_shared_bytes(op.baked_spec(spec), c))),
                std::string::npos);
      EXPECT_NE(src->text.find(fmt::format("void {}(", op.kernel_name(c))), std::string::npos);
      for (const Launch& l : op.plan(full, c).launches)
        EXPECT_NE(src->text.find(fmt::format("void {}(", l.kernel)), std::string::npos) << l.kernel;
    }
  });
}

// The rule of the contract that keeps an op in its folder: no code outside templates/<op>/
// branches on an op's name.
TEST(OpContract, NothingOutsideAnOpFolderComparesOpNames) {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  for (const OpTemplate* op : all_ops()) names.emplace_back(op->name());
  std::string alternatives;
  for (const std::string& n : names) alternatives += (alternatives.empty() ? "" : "|") + n;
  const std::regex compare("(==|!=)\\s*\"(" + alternatives + ")\"|\"(" + alternatives + ")\"\\s*(==|!=)");
  int files = 0;
  for (const char* dir : {"runtime", "cache", "codegen", "manifest", "check", "tools", "support", "bench", "include", "templates"}) {
    for (const auto& e : fs::recursive_directory_iterator(fs::path(KILN_SOURCE_DIR) / dir)) {
      if (!e.is_regular_file()) continue;
      const std::string ext = e.path().extension().string();
      if (ext != ".cpp" && ext != ".h") continue;
      // An op's own folder may name itself: templates/<op>/...
      const fs::path rel = fs::relative(e.path(), KILN_SOURCE_DIR);
      auto it = rel.begin();
      if (*it == "templates" && std::next(it) != rel.end() && std::next(std::next(it)) != rel.end()) continue;
      std::ifstream in(e.path());
      std::string line;
      int number = 0;
      ++files;
      while (std::getline(in, line)) {
        ++number;
        EXPECT_FALSE(std::regex_search(line, compare)) << rel.string() << ":" << number << ": " << line;
      }
    }
  }
  EXPECT_GT(files, 20);
}

}  // namespace
}  // namespace kiln
