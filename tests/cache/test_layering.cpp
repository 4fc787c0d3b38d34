// Layering, from the bottom: the op contract (templates/), codegen/, compile/, cache/, runtime/.
//   - cache/ sits below runtime/. Its files include nothing from runtime/ and not the public
//     kiln/runtime.h, directly or through another header of the tree; the code-object types and
//     the Compiler interface it needs are in compile/, the autotuner's types in kiln/tune.h.
//   - cache/ stores what the op layer produced without seeing the op contract: nothing in it
//     reaches templates/op_template.h (or its parts, or the registry). What a key needs of an op
//     comes through codegen's KernelSource and TuningSubject.
//   - compile/ sits below cache/: it reaches nothing from cache/ or runtime/.
//   - The device layer (runtime/device_impl.h: load a code object, launch a kernel) sees the code
//     object (compile/code_object.h) and the launch types (templates/plan.h), not the compilers
//     (compile/compiler.h) nor the op contract.
//   - An op folder (templates/<op>/) includes no other op's folder; what several ops share lives
//     in the library, templates/lib/, which includes no op folder.
//   - Nothing outside templates/ includes an op's header: the rest of Kiln reaches ops through
//     the op contract (templates/op_template.h) and the registry. tests/ may include op headers
//     (tests of an op's own helpers, such as the MFMA GEMM's model).
// KILN_LAYERING_ROOT checks another checkout instead of this one (e.g. an older tree, to see
// these tests fail on it).
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

// The checkout under test.
fs::path root() {
  const char* other = std::getenv("KILN_LAYERING_ROOT");
  return other && *other ? fs::path(other) : fs::path(KILN_SOURCE_DIR);
}

using Rule = bool (*)(const std::string& include);

bool runtime_include(const std::string& include) {
  return include.starts_with("runtime/") || include == "kiln/runtime.h";
}

// The op contract: op_template.h, its three parts and the registry (templates/plan.h, the launch
// types, is a leaf below it).
bool op_contract_include(const std::string& include) {
  return include == "templates/op_template.h" || include == "templates/op_interface.h" ||
         include == "templates/op_codegen.h" || include == "templates/op_testing.h" ||
         include == "templates/registry.h";
}

bool forbidden_in_cache(const std::string& include) { return runtime_include(include) || op_contract_include(include); }

bool forbidden_in_compile(const std::string& include) {
  return runtime_include(include) || include.starts_with("cache/");
}

bool forbidden_in_device_layer(const std::string& include) {
  return include == "compile/compiler.h" || op_contract_include(include);
}

// The quoted includes of a file of the tree ("x/y.h"), resolved against the source root and then
// include/; an include found in neither (a generated header) is left out.
std::vector<std::string> includes_of(const std::string& rel) {
  static const std::regex include_line("^\\s*#\\s*include\\s*\"([^\"]+)\"");
  std::vector<std::string> out;
  std::ifstream in(root() / rel);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (!std::regex_search(line, m, include_line)) continue;
    const std::string inc = m[1].str();
    if (fs::exists(root() / inc)) {
      out.push_back(inc);
    } else if (fs::exists(root() / "include" / inc)) {
      out.push_back(inc);
    }
  }
  return out;
}

fs::path resolve(const std::string& inc) {
  const fs::path direct = root() / inc;
  return fs::exists(direct) ? fs::path(inc) : fs::path("include") / inc;
}

// Every include reachable from `start` that `forbidden` refuses, each with the chain of files that
// leads to it.
std::vector<std::string> violations_from(const std::string& start, Rule forbidden = forbidden_in_cache) {
  std::vector<std::string> found;
  std::map<std::string, std::string> chain{{start, start}};  // file -> "a -> b -> file"
  std::vector<std::string> todo{start};
  while (!todo.empty()) {
    const std::string file = todo.back();
    todo.pop_back();
    for (const std::string& inc : includes_of(file)) {
      const std::string path = resolve(inc).string();
      if (forbidden(inc)) found.push_back(chain[file] + " -> " + inc);
      if (chain.emplace(path, chain[file] + " -> " + inc).second) todo.push_back(path);
    }
  }
  return found;
}

// The .cpp and .h files of a top-level folder, relative to the root (none when it is missing).
std::vector<std::string> files_of(const std::string& folder) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root() / folder, ec)) {
    const std::string ext = e.path().extension().string();
    if (e.is_regular_file() && (ext == ".cpp" || ext == ".h")) out.push_back(fs::relative(e.path(), root()).string());
  }
  return out;
}

TEST(Layering, CacheIncludesNothingFromRuntimeNorTheOpContract) {
  const std::vector<std::string> files = files_of("cache");
  for (const std::string& rel : files)
    for (const std::string& v : violations_from(rel))
      ADD_FAILURE() << v << ": cache/ may not include runtime/, kiln/runtime.h or the op contract (put the type in a "
                    << "leaf header, as compile/code_object.h and kiln/tune.h are, or pass what a key needs, as "
                    << "codegen's TuningSubject does)";
  EXPECT_GE(files.size(), 12u);
}

TEST(Layering, CompileIsOneFolderBelowCache) {
  const std::vector<std::string> files = files_of("compile");
  for (const std::string& rel : files)
    for (const std::string& v : violations_from(rel, forbidden_in_compile))
      ADD_FAILURE() << v << ": compile/ sits below cache/ and runtime/ and includes neither";
  EXPECT_GE(files.size(), 14u);
  // The whole compile stage is there: no compiler, NVRTC loader or code-object type elsewhere.
  for (const char* gone : {"runtime/compile", "runtime/driver/nvrtc_api.h", "codegen/code_object.h"})
    EXPECT_FALSE(fs::exists(root() / gone)) << gone << ": the compile stage lives in compile/";
}

TEST(Layering, TheDeviceLayerSeesNeitherTheCompilersNorTheOpContract) {
  for (const std::string& v : violations_from("runtime/device_impl.h", forbidden_in_device_layer))
    ADD_FAILURE() << v << ": runtime/device_impl.h loads a CodeObject (compile/code_object.h) and launches the "
                  << "launch types (templates/plan.h); it includes neither the compilers nor the op contract";
}

// The walks find what they look for: runtime/runtime.cpp reaches every kind of include.
TEST(Layering, TheIncludeWalkSeesRuntimeIncludes) {
  bool private_header = false, public_header = false, contract = false;
  for (const std::string& v : violations_from("runtime/runtime.cpp")) {
    private_header |= v.ends_with("-> runtime/runtime_impl.h");
    public_header |= v.ends_with("-> kiln/runtime.h");
    contract |= v.ends_with("-> templates/op_template.h");
  }
  EXPECT_TRUE(private_header);
  EXPECT_TRUE(public_header);
  EXPECT_TRUE(contract);
  bool compiler = false, cache = false;
  for (const std::string& v : violations_from("runtime/runtime.cpp", forbidden_in_device_layer))
    compiler |= v.ends_with("-> compile/compiler.h");
  for (const std::string& v : violations_from("runtime/runtime.cpp", forbidden_in_compile))
    cache |= v.ends_with("-> cache/tiers.h");
  EXPECT_TRUE(compiler);
  EXPECT_TRUE(cache);
}

// ---- op folders -----------------------------------------------------------------------------

// The op folder a quoted include names ("templates/gemm/gemm.h" -> "gemm"); "" for anything else,
// including the library (templates/lib/) and the files directly under templates/ (the contract,
// the registry).
std::string op_folder_of(const std::string& include) {
  static const std::regex op_include("^templates/([^/]+)/.+");
  std::smatch m;
  if (!std::regex_match(include, m, op_include) || m[1].str() == "lib") return "";
  return m[1].str();
}

// The quoted includes of a file, as written (whether or not they resolve).
std::vector<std::string> written_includes(const fs::path& file) {
  static const std::regex include_line("^\\s*#\\s*include\\s*\"([^\"]+)\"");
  std::vector<std::string> out;
  std::ifstream in(file);
  std::string line;
  std::smatch m;
  while (std::getline(in, line))
    if (std::regex_search(line, m, include_line)) out.push_back(m[1].str());
  return out;
}

bool is_source(const fs::path& p) {
  const std::string ext = p.extension().string();
  return ext == ".cpp" || ext == ".h" || ext == ".kernel" || ext == ".cu" || ext == ".hpp";
}

TEST(Layering, NoOpFolderIncludesAnotherOpsFolder) {
  int folders = 0;
  for (const auto& dir : fs::directory_iterator(root() / "templates")) {
    if (!dir.is_directory()) continue;
    const std::string folder = dir.path().filename().string();
    ++folders;
    for (const auto& e : fs::recursive_directory_iterator(dir.path())) {
      if (!e.is_regular_file() || !is_source(e.path())) continue;
      for (const std::string& inc : written_includes(e.path())) {
        const std::string other = op_folder_of(inc);
        if (other.empty() || other == folder) continue;
        ADD_FAILURE() << fs::relative(e.path(), root()).string() << " includes " << inc << ": "
                      << (folder == "lib" ? "the library (templates/lib/) includes no op's folder"
                                          : "an op folder includes no other op's folder")
                      << "; move what both need into templates/lib/ (device code: a library part; host "
                      << "helpers: a header there)";
      }
    }
  }
  EXPECT_GE(folders, 8);
}

TEST(Layering, NothingOutsideTemplatesIncludesAnOpHeader) {
  int files = 0;
  for (auto it = fs::recursive_directory_iterator(root()); it != fs::recursive_directory_iterator(); ++it) {
    const fs::path rel = fs::relative(it->path(), root());
    const std::string top = rel.begin()->string();
    // Not ours (build trees, the virtual environment, dot-folders), the op layer itself, and the
    // tests, which may test an op's own helpers.
    if (it->is_directory() && rel.begin() != rel.end() && std::distance(rel.begin(), rel.end()) == 1 &&
        (top.starts_with("build") || top.starts_with(".") || top == "templates" || top == "tests" ||
         top == "third_party" || top == "shared")) {
      it.disable_recursion_pending();
      continue;
    }
    if (it->is_symlink() && it->is_directory()) {
      it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file() || !is_source(it->path())) continue;
    ++files;
    for (const std::string& inc : written_includes(it->path()))
      if (!op_folder_of(inc).empty())
        ADD_FAILURE() << rel.string() << " includes " << inc
                      << ": outside templates/, reach an op through the registry (find_op) and the op contract "
                      << "(templates/op_template.h), or move the helper into templates/lib/";
  }
  EXPECT_GE(files, 50);
}

// The walks find what they look for.
TEST(Layering, TheOpRulesSeeOpIncludes) {
  EXPECT_EQ(op_folder_of("templates/gemm/gemm_mfma.h"), "gemm");
  EXPECT_EQ(op_folder_of("templates/lib/library.h"), "");
  EXPECT_EQ(op_folder_of("templates/op_template.h"), "");
  EXPECT_EQ(op_folder_of("kiln/runtime.h"), "");
  bool seen = false;
  for (const std::string& inc : written_includes(root() / "tests/compile/test_compile.cpp"))
    seen |= op_folder_of(inc) == "gemm";
  EXPECT_TRUE(seen) << "tests/compile/test_compile.cpp includes the MFMA GEMM's header (allowed in tests/)";
}

}  // namespace
