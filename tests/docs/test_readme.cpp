// The README's C++ example is examples/quickstart.cpp, which is built and run as a test: this
// checks that the README shows that file verbatim, so the README cannot rot.
#include <fstream>
#include <sstream>

#include "test_util.h"

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(Readme, ShowsTheQuickstartExampleVerbatim) {
  const std::string readme = slurp(KILN_SOURCE_DIR "/README.md");
  const std::string example = slurp(KILN_SOURCE_DIR "/examples/quickstart.cpp");
  ASSERT_FALSE(example.empty());
  const std::string block = "```cpp\n" + example + "```\n";
  EXPECT_NE(readme.find(block), std::string::npos)
      << "README.md's ```cpp block differs from examples/quickstart.cpp; copy the file into the README";
}

TEST(Readme, OpensWithTheTwoCommandsCiUses) {
  const std::string readme = slurp(KILN_SOURCE_DIR "/README.md");
  const std::string ci = slurp(KILN_SOURCE_DIR "/.ci/run");
  const std::string test_command = "scripts/setup.sh && ctest --test-dir build --output-on-failure -j 2";
  EXPECT_NE(readme.find("```sh\n" + test_command + "\n```"), std::string::npos);
  EXPECT_NE(ci.find(test_command), std::string::npos) << ".ci/run must call the README's test command";
  EXPECT_LT(readme.find("build/kiln prewarm"), readme.find(test_command)) << "main job first, then tests";
}

}  // namespace
