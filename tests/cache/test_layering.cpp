// Layering: cache/ sits below runtime/. Its files include nothing from runtime/ and not the public
// kiln/runtime.h, directly or through another header of the tree; the code-object types and the
// Compiler interface it needs are in codegen/code_object.h, the autotuner's types in kiln/tune.h.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

bool forbidden_in_cache(const std::string& include) {
  return include.starts_with("runtime/") || include == "kiln/runtime.h";
}

// The quoted includes of a file of the tree ("x/y.h"), resolved against the source root and then
// include/; an include found in neither (a generated header) is left out.
std::vector<std::string> includes_of(const std::string& rel) {
  static const std::regex include_line("^\\s*#\\s*include\\s*\"([^\"]+)\"");
  std::vector<std::string> out;
  std::ifstream in(fs::path(KILN_SOURCE_DIR) / rel);
  std::string line;
  std::smatch m;
  while (std::getline(in, line)) {
    if (!std::regex_search(line, m, include_line)) continue;
    const std::string inc = m[1].str();
    if (fs::exists(fs::path(KILN_SOURCE_DIR) / inc)) {
      out.push_back(inc);
    } else if (fs::exists(fs::path(KILN_SOURCE_DIR) / "include" / inc)) {
      out.push_back(inc);
    }
  }
  return out;
}

fs::path resolve(const std::string& inc) {
  const fs::path direct = fs::path(KILN_SOURCE_DIR) / inc;
  return fs::exists(direct) ? fs::path(inc) : fs::path("include") / inc;
}

// Every forbidden include reachable from `start`, each with the chain of files that leads to it.
std::vector<std::string> violations_from(const std::string& start) {
  std::vector<std::string> found;
  std::map<std::string, std::string> chain{{start, start}};  // file -> "a -> b -> file"
  std::vector<std::string> todo{start};
  while (!todo.empty()) {
    const std::string file = todo.back();
    todo.pop_back();
    for (const std::string& inc : includes_of(file)) {
      const std::string path = resolve(inc).string();
      if (forbidden_in_cache(inc)) found.push_back(chain[file] + " -> " + inc);
      if (chain.emplace(path, chain[file] + " -> " + inc).second) todo.push_back(path);
    }
  }
  return found;
}

TEST(Layering, CacheIncludesNothingFromRuntime) {
  int files = 0;
  for (const auto& e : fs::directory_iterator(fs::path(KILN_SOURCE_DIR) / "cache")) {
    const std::string ext = e.path().extension().string();
    if (!e.is_regular_file() || (ext != ".cpp" && ext != ".h")) continue;
    ++files;
    const std::string rel = fs::relative(e.path(), KILN_SOURCE_DIR).string();
    for (const std::string& v : violations_from(rel))
      ADD_FAILURE() << v << ": cache/ may not include runtime/ or kiln/runtime.h (put the type in a leaf header, "
                    << "as codegen/code_object.h and kiln/tune.h are)";
  }
  EXPECT_GE(files, 10);
}

// The walk finds what it looks for: runtime/runtime.cpp reaches both kinds of include.
TEST(Layering, TheIncludeWalkSeesRuntimeIncludes) {
  bool private_header = false, public_header = false;
  for (const std::string& v : violations_from("runtime/runtime.cpp")) {
    private_header |= v.ends_with("-> runtime/compile/compiler.h");
    public_header |= v.ends_with("-> kiln/runtime.h");
  }
  EXPECT_TRUE(private_header);
  EXPECT_TRUE(public_header);
}

}  // namespace
