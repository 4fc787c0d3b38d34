// kiln inspect: one kernel's generated source, LLVM IR, assembly (AMDGPU ISA; PTX and SASS) or
// metadata (compiled through the Runtime, so the cache is used and filled).
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cache/tuning.h"
#include "codegen/codegen.h"
#include "compile/amdgpu_code_report.h"
#include "compile/compiler.h"
#include "templates/registry.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {
namespace {

struct InspectOptions {
  SpecOptions spec;
  std::string arch;
  std::string emit = "source";
  std::string cache_dir;
  std::string nvidia_compiler;
  bool json = false;  ///< --emit meta as one JSON document (docs/json.md)
  std::vector<std::string> config;  ///< --config: KEY=VALUE items of a tile configuration
};

/// The tile configuration of --config ("THREADS=512 ITEMS=4", "THREADS=512,ITEMS=4", or one item
/// per option), or nullopt without one. Errors name the item and the form.
Result<std::optional<KernelConfig>> parse_config(const std::vector<std::string>& items) {
  if (items.empty()) return std::optional<KernelConfig>();
  KernelConfig config;
  for (const std::string& given : items) {
    std::string text = given;
    std::replace(text.begin(), text.end(), ',', ' ');
    std::istringstream words(text);
    for (std::string item; words >> item;) {
      const size_t eq = item.find('=');
      int64_t value = 0;
      const char* end = item.data() + item.size();
      const auto [ptr, ec] = eq == std::string::npos ? std::from_chars_result{end, std::errc::invalid_argument}
                                                     : std::from_chars(item.data() + eq + 1, end, value);
      if (eq == 0 || eq == std::string::npos || eq + 1 == item.size() || ec != std::errc() || ptr != end)
        return make_error(Errc::invalid_argument,
                          fmt::format("--config: '{}' is not KEY=INTEGER (e.g. --config 'THREADS=512 ITEMS=4', as "
                                      "'kiln inspect --emit meta' prints a tile config and its fallbacks)",
                                      item));
      if (!config.emplace(item.substr(0, eq), value).second)
        return make_error(Errc::invalid_argument, fmt::format("--config: '{}' is given twice", item.substr(0, eq)));
    }
  }
  if (config.empty()) return make_error(Errc::invalid_argument, "--config: no KEY=VALUE item given");
  return std::optional<KernelConfig>(std::move(config));
}

bool executable(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

/// The first of `names` found on PATH or in /usr/local/cuda/bin, or "".
std::string find_tool(std::initializer_list<const char*> names, std::string* which = nullptr) {
  std::vector<std::string> dirs;
  if (const char* path = std::getenv("PATH")) {
    std::string p = path;
    for (size_t start = 0; start <= p.size();) {
      size_t end = p.find(':', start);
      if (end == std::string::npos) end = p.size();
      if (end > start) dirs.push_back(p.substr(start, end - start));
      start = end + 1;
    }
  }
  dirs.emplace_back("/usr/local/cuda/bin");
  for (const char* name : names)
    for (const std::string& dir : dirs)
      if (executable(dir + "/" + name)) {
        if (which) *which = name;
        return dir + "/" + name;
      }
  return {};
}

/// Runs `argv` and returns its stdout and stderr. Errors: io_error (could not start), the exit status.
Result<std::string> capture(const std::vector<std::string>& argv) {
  std::string cmd;
  for (const std::string& a : argv) {
    std::string quoted = "'";
    for (char c : a) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
    cmd += (cmd.empty() ? "" : " ") + quoted + "'";
  }
  cmd += " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return make_error(Errc::io_error, fmt::format("cannot run {}: {}", argv[0], std::strerror(errno)));
  std::string out;
  char buf[65536];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  const int status = ::pclose(p);
  if (status != 0)
    return make_error(Errc::io_error, fmt::format("{} exited with status {}: {}", argv[0],
                                                  WIFEXITED(status) ? WEXITSTATUS(status) : status, first_line(out)));
  return out;
}

/// SASS of a cubin through cuobjdump -sass (or nvdisasm), via a private temporary file.
std::string sass_of(std::span<const uint8_t> cubin) {
  std::string which;
  const std::string tool = find_tool({"cuobjdump", "nvdisasm"}, &which);
  if (tool.empty())
    return "// SASS: not shown: neither cuobjdump nor nvdisasm was found on PATH or in /usr/local/cuda/bin\n";
  const char* tmpdir = std::getenv("TMPDIR");
  std::string path = fmt::format("{}/kiln-inspect-XXXXXX.cubin", tmpdir && *tmpdir ? tmpdir : "/tmp");
  const int fd = ::mkstemps(path.data(), 6);
  if (fd < 0) return fmt::format("// SASS: not shown: cannot create a temporary file: {}\n", std::strerror(errno));
  bool written = true;
  for (size_t done = 0; done < cubin.size();) {
    const ssize_t n = ::write(fd, cubin.data() + done, cubin.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      written = false;
      break;
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  std::string out;
  if (!written) {
    out = fmt::format("// SASS: not shown: cannot write '{}'\n", path);
  } else {
    auto r = which == "cuobjdump" ? capture({tool, "-sass", path}) : capture({tool, path});
    out = r ? fmt::format("// SASS ({} of the cubin)\n{}", tool, *r)
            : fmt::format("// SASS: not shown: {}\n", first_line(r.error().message));
  }
  ::unlink(path.c_str());
  return out;
}

// A runtime without a device on the command's cache and NVIDIA compiler: inspect goes through the
// cache like any application would.
Result<std::unique_ptr<Runtime>> compile_only_runtime(const InspectOptions& o) {
  RuntimeOptions ro;
  ro.backend = "none";
  ro.cache_dir = cache_root(o.cache_dir);
  ro.nvidia_compiler = nvidia_compiler(o.nvidia_compiler);
  return Runtime::create(ro);
}

std::string entry_dir(const std::string& cache, const std::string& key) {
  if (cache.empty() || key.size() < 2) return "(memory only: the disk cache is off or unusable)";
  return fmt::format("{}/v1/entries/{}/{}", cache, key.substr(0, 2), key);
}

// The tuning records of the spec in the cache, whatever GPU they were timed on: the configuration
// kernel() compiles there instead of the heuristic's ("tile config", which compile() shows).
template <class Line>
void print_tunings(const KernelSpec& spec, const TargetInfo& target, const std::string& cache_dir,
                   const InspectOptions& o, const Line& line) {
  const OpTemplate* op = *find_op(spec.op);  // validated by the caller
  if (op->tuning_candidates(op->baked_spec(spec), target).size() < 2) return;  // nothing to tune
  const std::string compiler = target.vendor == Vendor::nvidia ? nvidia_compiler(o.nvidia_compiler) : "clang";
  std::vector<FoundTuning> found;
  if (!cache_dir.empty())
    if (auto cache = DiskCache::open(cache_dir, /*read_only=*/true)) found = tunings_of(**cache, tuning_subject(*op, spec, target), target, compiler);
  if (found.empty()) line("tuned", "not yet ('kiln run --bench' or 'kiln prewarm --tune' on the GPU tunes it)");
  for (const FoundTuning& f : found) {
    const TuneCandidate& w = *std::find_if(f.record.candidates.begin(), f.record.candidates.end(),
                                           [&](const TuneCandidate& c) { return c.config == f.record.winner; });
    const size_t n = f.record.candidates.size();
    line("tuned", fmt::format("{} on {} ({:.4f} ms median, {} candidate{}, {})", config_string(f.record.winner),
                              f.record.key.device, w.median_ms, n, n == 1 ? "" : "s", f.record.created_utc));
    line("record", f.path);
  }
}

// AMD targets: AGPRs, the hot loop's instruction mix (the code object disassembled), occupancy,
// and the op's throughput model where it has one (modelled, not measured: the MFMA GEMM's).
template <class Line>
void print_amd_report(const KernelSpec& spec, const TargetInfo& target, const KernelConfig& config,
                      const LaunchGeometry& g, std::span<const uint8_t> code, const std::string& kernel,
                      const Line& line) {
  auto report = amdgpu_code_report(code, kernel, target, static_cast<int>(g.block.x));
  if (!report) {
    line("hot loop", "not shown: " + first_line(report.error().message));
    return;
  }
  const AmdgpuCodeReport& r = *report;
  line("AGPRs", known(r.meta.agprs));
  auto mix = [](const InstructionMix& m) {
    return fmt::format("{} instructions: {} MFMA, {} LDS, {} global, {} s_waitcnt, {} s_barrier, {} other VALU, "
                       "{} other SALU",
                       m.total, m.mfma, m.lds, m.global, m.waitcnt, m.barrier, m.valu, m.salu);
  };
  if (r.hot_loop.found)
    line("hot loop", fmt::format("bytes {:#x}..{:#x}, {}", r.hot_loop.begin, r.hot_loop.end, mix(r.hot_loop.mix)));
  else
    line("hot loop", "none (no backward branch)");
  line("kernel mix", mix(r.kernel));
  line("occupancy", fmt::format("{} waves per SIMD ({} per CU; limited by {}; {} threads per workgroup, {} KiB LDS per CU)",
                                r.waves_per_simd, r.waves_per_cu, r.occupancy_limit, g.block.x,
                                amd_lds_bytes_per_cu(target) / 1024));
  const int regs = std::max(r.meta.registers, 0) + std::max(r.meta.agprs, 0);
  auto op = find_op(spec.op);
  if (op)
    for (const ModelLine& m : (*op)->throughput_model(spec, config, target, regs)) line(m.label, m.text);
}

// The kernel of the heuristic's configuration, or of `config` (--config).
Result<std::shared_ptr<const CompiledKernel>> compile_kernel(Runtime& rt, const KernelSpec& spec, const TargetInfo& target,
                                                             const std::optional<KernelConfig>& config) {
  return config ? rt.compile(spec, target.name, *config) : rt.compile(spec, target.name);
}

int print_meta(const KernelSpec& spec, const TargetInfo& target, const InspectOptions& o,
               const std::optional<KernelConfig>& config) {
  auto rt = compile_only_runtime(o);
  if (!rt) return fail(rt.error());
  auto compiled = compile_kernel(**rt, spec, target, config);
  if (!compiled) return fail(compiled.error());
  const KernelInfo& i = (*compiled)->info();
  const bool amd = target.vendor == Vendor::amd;
  auto line = [](std::string_view name, const std::string& value) { fmt::print("{:<13} {}\n", name, value); };
  line("spec", spec_text(spec));
  line("kernel", i.kernel);
  line("target", fmt::format("{} ({})", i.target, target.gpus));
  line("compiler", i.compiler);
  line("code", fmt::format("{}, {} bytes", i.code_format, i.code_bytes));
  if (amd) {
    line("registers", fmt::format("{} VGPRs, {} SGPRs (AGPRs below)", known(i.registers), known(i.sgprs)));
    line("LDS", fmt::format("{} bytes", known(i.shared_bytes)));
    line("scratch", fmt::format("{} bytes per lane", known(i.scratch_bytes)));
    line("spills", fmt::format("{} (VGPR+SGPR spill count)", known(i.spill_stores)));
  } else {
    line("registers", fmt::format("{} per thread", known(i.registers)));
    line("shared", fmt::format("{} bytes (static, per block)", known(i.shared_bytes)));
    line("stack frame", fmt::format("{} bytes per thread", known(i.scratch_bytes)));
    line("spills", fmt::format("{} bytes stored, {} bytes loaded", known(i.spill_stores), known(i.spill_loads)));
  }
  line("wave size", known(i.wave_size));
  line("tile config", config ? i.config + " (--config)" : i.config);
  // The plan of the configuration: what one call of this spec launches.
  const OpTemplate* op = *find_op(spec.op);
  const KernelSpec call = op->with_defaults(spec);
  const std::vector<KernelConfig> variants = op->variants(op->baked_spec(spec), target);
  const KernelConfig& chosen = config ? *config : variants.front();
  const Plan plan = op->plan(call, chosen);
  const std::vector<TensorInfo> tensors = op->tensors(call);
  if (plan.launches.empty()) line("launch", "none (a call of size 0 launches nothing)");
  for (const Launch& l : plan.launches) {
    const LaunchGeometry& g = l.geometry;
    const std::string grid = g.persistent ? fmt::format("persistent, {} tiles over at most one block per SM", g.grid.x)
                                          : fmt::format("grid {}x{}x{}", g.grid.x, g.grid.y, g.grid.z);
    std::string extra;
    if (g.cluster.x * g.cluster.y * g.cluster.z > 1)
      extra += fmt::format(", clusters of {}x{}x{}", g.cluster.x, g.cluster.y, g.cluster.z);
    // sm_90a: may start while the previous launch finishes (the kernel waits for what it reads).
    if (g.programmatic_dependent_launch && !amd) extra += ", programmatic dependent launch";
    line("launch", fmt::format("{}: {}, block {}, dynamic {} {} bytes{}", l.kernel, grid, g.block.x,
                               amd ? "LDS" : "shared", g.dynamic_shared_bytes, extra));
    std::string maps;
    for (const KernelArg& a : l.args)
      if (a.kind == KernelArg::Kind::tensor_map)
        maps += fmt::format("{}{} (box {}x{})", maps.empty() ? "" : ", ", tensors.at(a.index).name, a.map.box_inner,
                            a.map.box_outer);
    if (!maps.empty()) line("tensor maps", maps + ": TMA, encoded at each launch");
  }
  if (plan.workspace_bytes) line("workspace", fmt::format("{} bytes", plan.workspace_bytes));
  if (!config)
    for (size_t v = 1; v < variants.size(); ++v) line("fallback", config_string(variants[v]));
  print_tunings(spec, target, (*rt)->cache_dir(), o, line);
  line("cache key", i.cache_key);
  line("compile ms", fmt::format("{:.1f}", i.compile_ms));
  line("origin", std::string((*compiled)->origin()));
  line("entry", entry_dir((*rt)->cache_dir(), i.cache_key));
  if (amd && !plan.launches.empty()) {
    // The launch of the compiled kernel (the first where none is named so).
    auto it = std::find_if(plan.launches.begin(), plan.launches.end(), [&](const Launch& l) { return l.kernel == i.kernel; });
    const Launch& l = it != plan.launches.end() ? *it : plan.launches.front();
    print_amd_report(spec, target, chosen, l.geometry, (*compiled)->code_object(), i.kernel, line);
    // The plan's other kernels (the same code object; e.g. attention_bwd's dot and dq launches):
    // registers, LDS, scratch, occupancy and the hot loop of each, once per name.
    std::vector<std::string> seen = {i.kernel};
    for (const Launch& other : plan.launches) {
      if (std::find(seen.begin(), seen.end(), other.kernel) != seen.end()) continue;
      seen.push_back(other.kernel);
      auto r = amdgpu_code_report((*compiled)->code_object(), other.kernel, target, static_cast<int>(other.geometry.block.x));
      if (!r) {
        line("also", fmt::format("{}: not shown: {}", other.kernel, first_line(r.error().message)));
        continue;
      }
      line("also", fmt::format("{}: {} VGPRs, {} AGPRs, {} SGPRs, LDS {} bytes, scratch {} bytes per lane, {} spills, "
                               "{} waves per SIMD ({} per CU; limited by {}; {} threads per workgroup); hot loop {}",
                               other.kernel, known(r->meta.registers), known(r->meta.agprs), known(r->meta.sgprs),
                               known(r->meta.shared_bytes), known(r->meta.scratch_bytes), known(r->meta.spill_stores),
                               r->waves_per_simd, r->waves_per_cu, r->occupancy_limit,
                               other.geometry.block.x,
                               r->hot_loop.found ? fmt::format("{} instructions, {} MFMA, {} LDS, {} other VALU",
                                                               r->hot_loop.mix.total, r->hot_loop.mix.mfma,
                                                               r->hot_loop.mix.lds, r->hot_loop.mix.valu)
                                                 : std::string("none")));
    }
  }
  if (!i.assembler_report.empty() && globals().verbose) fmt::print("assembler report:\n{}\n", i.assembler_report);
  return 0;
}

// --emit meta --json: the same facts as one document (docs/json.md, kiln.inspect.meta).
int print_meta_json(const KernelSpec& spec, const TargetInfo& target, const InspectOptions& o,
                    const std::optional<KernelConfig>& chosen) {
  auto rt = compile_only_runtime(o);
  if (!rt) return fail(rt.error());
  auto compiled = compile_kernel(**rt, spec, target, chosen);
  if (!compiled) return fail(compiled.error());
  const KernelInfo& i = (*compiled)->info();
  auto known_or_null = [](int v) { return v < 0 ? nlohmann::json(nullptr) : nlohmann::json(v); };
  const OpTemplate* op = *find_op(spec.op);
  const KernelSpec call = op->with_defaults(spec);
  const KernelConfig config = chosen ? *chosen : op->choose_config(op->baked_spec(spec), target);
  const Plan plan = op->plan(call, config);
  const std::vector<TensorInfo> tensors = op->tensors(call);
  nlohmann::json maps = nlohmann::json::array();
  nlohmann::json launches = nlohmann::json::array();
  for (const Launch& l : plan.launches) {
    const LaunchGeometry& g = l.geometry;
    launches.push_back({{"kernel", l.kernel},
                        {"persistent", g.persistent},
                        {"grid", {g.grid.x, g.grid.y, g.grid.z}},
                        {"block", {g.block.x, g.block.y, g.block.z}},
                        {"dynamic_shared_bytes", g.dynamic_shared_bytes}});
    for (const KernelArg& a : l.args)
      if (a.kind == KernelArg::Kind::tensor_map)
        maps.push_back({{"tensor", tensors.at(a.index).name}, {"box_inner", a.map.box_inner}, {"box_outer", a.map.box_outer}});
  }
  nlohmann::json tunings = nlohmann::json::array();
  print_tunings(spec, target, (*rt)->cache_dir(), o,
                [&](std::string_view name, const std::string& value) { tunings.push_back(fmt::format("{}: {}", name, value)); });
  nlohmann::json doc = {{"schema", "kiln.inspect.meta"},
                        {"schema_version", 1},
                        {"spec", to_string(spec)},
                        {"kernel", i.kernel},
                        {"target", i.target},
                        {"gpus", std::string(target.gpus)},
                        {"compiler", i.compiler},
                        {"format", i.code_format},
                        {"bytes", i.code_bytes},
                        {"registers", known_or_null(i.registers)},
                        {"sgprs", known_or_null(i.sgprs)},
                        {"shared_bytes", known_or_null(i.shared_bytes)},
                        {"scratch_bytes", known_or_null(i.scratch_bytes)},
                        {"spill_stores", known_or_null(i.spill_stores)},
                        {"spill_loads", known_or_null(i.spill_loads)},
                        {"wave_size", known_or_null(i.wave_size)},
                        {"config", config},
                        {"launches", launches},
                        {"workspace_bytes", plan.workspace_bytes},
                        {"tensor_maps", maps},
                        {"tunings", tunings},
                        {"cache_key", i.cache_key},
                        {"compile_ms", i.compile_ms},
                        {"origin", std::string((*compiled)->origin())},
                        {"entry", (*rt)->cache_dir().empty() ? nlohmann::json(nullptr)
                                                             : nlohmann::json(entry_dir((*rt)->cache_dir(), i.cache_key))}};
  fmt::print("{}\n", doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
  return 0;
}

int run_inspect(const InspectOptions& o) {
  auto spec = make_spec(o.spec);
  if (!spec) return fail(spec.error());
  auto target = find_target(o.arch);
  if (!target) return fail("--arch: " + target.error().message, 2);
  auto op = find_op(spec->op);
  if (!op) return fail(op.error());
  if (auto valid = (*op)->validate(*spec, **target); !valid) return fail(valid.error());

  if (o.json && o.emit != "meta") return fail("--json goes with --emit meta (the other outputs are code)", 2);
  auto config = parse_config(o.config);
  if (!config) return fail(config.error().message, 2);
  if (o.emit == "meta")
    return o.json ? print_meta_json(*spec, **target, o, *config) : print_meta(*spec, **target, o, *config);
  auto src = generate(*spec, **target, *config ? &**config : nullptr);
  if (!src) return fail(src.error());
  if (o.emit == "source") {
    fmt::print("{}", src->text);
    if (!src->text.empty() && src->text.back() != '\n') fmt::print("\n");
    return 0;
  }
  if (o.emit == "llvm") {
    auto clang = clang_compiler();
    if (!clang) return fail("--emit llvm needs clang: " + clang.error().message);
    auto ir = (*clang)->emit(*src, Emit::llvm_ir);
    if (!ir) return fail(ir.error());
    fmt::print("{}", *ir);
    return 0;
  }
  // asm
  auto compiler = compiler_for(**target, nvidia_compiler(o.nvidia_compiler));
  if (!compiler) return fail(compiler.error());
  auto text = (*compiler)->emit(*src, Emit::assembly);
  if (!text) return fail(text.error());
  if ((*target)->vendor == Vendor::amd) {
    fmt::print("{}", *text);
    return 0;
  }
  fmt::print("// PTX ({} {})\n{}\n", (*compiler)->name(), (*compiler)->version(), *text);
  // SASS of the cubin the runtime would load (through the cache).
  auto rt = compile_only_runtime(o);
  if (!rt) return fail(rt.error());
  auto compiled = compile_kernel(**rt, *spec, **target, *config);
  if (!compiled) return fail(compiled.error());
  if ((*compiled)->info().code_format != "cubin") {
    fmt::print("// SASS: not shown: the code object is {}, not a cubin\n", (*compiled)->info().code_format);
    return 0;
  }
  fmt::print("{}", sass_of((*compiled)->code_object()));
  return 0;
}

}  // namespace

Command add_inspect_command(CLI::App& app) {
  auto o = std::make_shared<InspectOptions>();
  auto* cmd = app.add_subcommand("inspect", "Show one kernel's source, LLVM IR, assembly or metadata");
  add_spec_options(*cmd, o->spec);
  cmd->add_option("--arch", o->arch, "Target: gfx942, gfx950 or sm_90a")->required();
  cmd->add_option("--emit", o->emit,
                  "source: generated code; llvm: LLVM IR (clang); asm: AMDGPU ISA, or PTX and SASS; "
                  "meta: compile (through the cache) and show registers, LDS/shared memory, spills, cache entry")
      ->check(CLI::IsMember({"source", "llvm", "asm", "meta"}))
      ->capture_default_str();
  add_cache_dir_option(*cmd, o->cache_dir);
  add_nvidia_compiler_option(*cmd, o->nvidia_compiler);
  cmd->add_flag("--json", o->json, "With --emit meta: one JSON document on stdout (schema: docs/json.md)");
  cmd->add_option("--config", o->config,
                  "A tile configuration instead of the heuristic's, as --emit meta prints them (KEY=VALUE items, "
                  "space- or comma-separated, e.g. 'THREADS=512 ITEMS=4 VEC=8'): one of the op's variants or "
                  "tuning candidates; --emit meta then shows that kernel and its launches");
  return [o] { return run_inspect(*o); };
}

}  // namespace kiln::cli
