// kiln: the command-line face of the Kiln runtime.
//
//   kiln ops                                  ops, their parameters, dtypes and the targets
//   kiln manifest MODEL -o FILE               the kernels of a model's training step
//   kiln prewarm FILE --arch gfx942,sm_90a    compile a manifest into the cache, in parallel
//   kiln inspect OP --param ... --emit meta   generated source, LLVM IR, assembly, metadata
//   kiln run OP --param ... --check --bench   check (and time) a kernel on this machine's GPU
//   kiln cache stat|ls|verify|clear|gc        the on-disk cache
//   kiln cache export|import FILE             carry a cache to other machines (tar.zst)
//
// Errors are one line on stderr, "kiln: error: ...", and a non-zero exit: 2 for command-line
// mistakes, 1 for everything else.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <exception>
#include <utility>
#include <vector>

#include "support/env.h"
#include "kiln/version.h"
#include "tools/kiln/cli.h"

namespace {

int run_cli(int argc, char** argv) {
  using namespace kiln::cli;
  CLI::App app{"Kiln: JIT kernel generation for GPU training ops (GEMM in bf16/fp16 and fp8, grouped GEMM, "
               "attention, RMSNorm, SwiGLU, RoPE, cross-entropy, embedding, fp8 quantization, MoE routing and "
               "permutation; 'kiln ops' lists them) on AMD gfx942/gfx950 and NVIDIA sm_90a.",
               "kiln"};
  app.set_version_flag("--version", fmt::format("kiln {} (LLVM {})", KILN_VERSION_STRING,
                                                KILN_WITH_LLVM ? "built in" : "not built in"));
  app.add_flag("-v,--verbose", globals().verbose, "Print error details (compiler logs) after the error line");
  app.require_subcommand(1);
  app.fallthrough();  // global flags may follow the command

  std::vector<std::pair<CLI::App*, Command>> commands;
  auto reg = [&](const char* name, Command (*add)(CLI::App&)) {
    Command cmd = add(app);
    commands.emplace_back(app.get_subcommand(name), std::move(cmd));
  };
  reg("ops", add_ops_command);
  reg("manifest", add_manifest_command);
  reg("prewarm", add_prewarm_command);
  reg("inspect", add_inspect_command);
  reg("run", add_run_command);
  reg("cache", add_cache_command);
  app.footer("Run 'kiln COMMAND --help' for a command's options.");  // after the commands: not inherited

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == 0) return app.exit(e);  // other successes (none today)
    if (app.get_subcommands().empty()) {
      std::string names;
      for (const auto& [sub, cmd] : commands) names += (names.empty() ? "" : ", ") + sub->get_name();
      std::string word;
      for (int i = 1; i < argc && word.empty(); ++i)
        if (argv[i][0] != '-') word = argv[i];
      return fail(word.empty() ? fmt::format("no command given; commands: {} (see 'kiln --help')", names)
                               : fmt::format("unknown command '{}'; commands: {} (see 'kiln --help')", word, names),
                  2);
    }
    std::string where = "kiln";
    for (const CLI::App* sub = &app; sub;) {
      auto parsed = sub->get_subcommands();
      sub = parsed.empty() ? nullptr : parsed.front();
      if (sub) where += " " + sub->get_name();
    }
    return fail(fmt::format("{} (see '{} --help')", e.what(), where), 2);
  }
  // An invalid KILN_* variable is an error before any command runs, never a silent default.
  if (auto bad = kiln::env_error()) return fail(*bad, 2);
  for (auto& [sub, cmd] : commands)
    if (sub->parsed()) return cmd();
  return fail("no command given (see 'kiln --help')", 2);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_cli(argc, argv);
  } catch (const std::exception& e) {
    return kiln::cli::fail(fmt::format("internal error: {}", e.what()), 1);
  } catch (...) {
    return kiln::cli::fail("internal error: unknown exception", 1);
  }
}
