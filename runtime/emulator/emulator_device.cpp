// The `emulator` device backend: an AMD gfx942/gfx950 device whose kernels run in tinygrad's CDNA
// ISA emulator, in a Python child process that owns the device memory (runtime/emulator/
// emulator_process.h). Device pointers are addresses in that child; this side checks every copy
// against its allocations, prepares each dispatch (kernarg segment, dispatch packet, user SGPRs)
// from the code object and sends it. Launches are synchronous. The library itself does not depend
// on Python: the child is started only when a runtime asks for this backend.
#include <fmt/format.h>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>

#include "runtime/device_impl.h"
#include "runtime/emulator/emulator_process.h"
#include "support/env.h"
#include "support/log.h"

#if KILN_WITH_LLVM
#include "runtime/emulator/hsaco_image.h"
#endif

namespace kiln {

#if KILN_WITH_LLVM
namespace {

bool is_file(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool executable(const std::string& path) { return ::access(path.c_str(), X_OK) == 0; }

// The folder on PATH (or LLVM's own bin folder) that holds an executable `clang`, "" if none.
std::string find_clang_dir() {
#ifdef KILN_LLVM_TOOLS_DIR
  if (executable(std::string(KILN_LLVM_TOOLS_DIR) + "/clang")) return KILN_LLVM_TOOLS_DIR;
#endif
  const char* path = std::getenv("PATH");
  for (size_t pos = 0, next; path && pos <= std::strlen(path); pos = next + 1) {
    const std::string p(path);
    next = p.find(':', pos);
    if (next == std::string::npos) next = p.size();
    const std::string dir = p.substr(pos, next - pos);
    if (!dir.empty() && executable(dir + "/clang")) return dir;
  }
  return {};
}

Result<void> done(Result<std::vector<uint8_t>> r) {
  if (!r) return r.take_error();
  return ok();
}

std::span<const uint8_t> bytes_of(const uint64_t& v) { return {reinterpret_cast<const uint8_t*>(&v), sizeof(v)}; }

class EmulatorDevice;

class EmulatorModule final : public KernelFunction {
 public:
  EmulatorModule(EmulatorDevice& device, std::string kernel, HsacoKernel k, uint64_t image, uint64_t region)
      : device_(device), kernel_(std::move(kernel)), k_(std::move(k)), image_(image), region_(region) {}
  ~EmulatorModule() override;
  Result<void> launch(const LaunchGeometry& g, void** args, Stream stream) const override;
  void* function() const override { return nullptr; }

  // The dispatch region: kernarg segment, then the 64-byte packet, then a zeroed queue stand-in.
  static uint64_t packet_offset(const HsacoKernel& k) { return (uint64_t{k.kernarg_bytes} + 63) / 64 * 64 + 64; }
  static uint64_t region_bytes(const HsacoKernel& k) { return packet_offset(k) + 64 + 256; }

 private:
  EmulatorDevice& device_;
  std::string kernel_;
  HsacoKernel k_;  // without its image, which lives in the child at image_
  uint64_t image_, region_;
  mutable std::mutex mu_;  // one launch at a time uses the dispatch region
};

class EmulatorDevice final : public DeviceImpl {
 public:
  EmulatorDevice(std::unique_ptr<EmulatorProcess> process, const TargetInfo* target)
      : process_(std::move(process)), target_(target) {}

  std::string name() const override {
    return fmt::format("AMD CDNA emulator ({})", process_->versions());
  }
  const TargetInfo& target() const override { return *target_; }
  int compute_units() const override { return target_->compute_units; }

  std::optional<MemoryLimit> free_memory() override {
    auto host = host_available_memory();  // the emulator's device memory is the host's
    if (host) host->source += " (the emulator keeps device memory in host memory)";
    return host;
  }
  Result<void*> malloc(size_t bytes) override {
    KILN_ASSIGN_OR_RETURN(auto reply, process_->call(EmulatorProcess::kMalloc, bytes_of(bytes), {},
                                                     fmt::format("malloc of {} bytes", bytes)));
    if (reply.size() != 8) return make_error(Errc::driver_error, "the emulator's malloc answered out of protocol");
    uint64_t address = 0;
    std::memcpy(&address, reply.data(), 8);
    std::lock_guard lock(mu_);
    allocations_[address] = std::max<uint64_t>(bytes, 1);
    return reinterpret_cast<void*>(address);
  }
  Result<void> free(void* ptr) override {
    if (!ptr) return ok();
    const uint64_t address = reinterpret_cast<uint64_t>(ptr);
    {
      std::lock_guard lock(mu_);
      auto it = allocations_.find(address);
      if (it == allocations_.end())
        return make_error(Errc::invalid_argument, fmt::format("free({}): not an allocation of this emulated device", ptr));
      allocations_.erase(it);
    }
    return done(process_->call(EmulatorProcess::kFree, bytes_of(address), {}, "free"));
  }
  Result<void> copy_to_device(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return ok();
    KILN_TRY(check_range(dst, bytes, "copy_to_device"));
    const uint64_t address = reinterpret_cast<uint64_t>(dst);
    return done(process_->call(EmulatorProcess::kWrite, bytes_of(address), {static_cast<const uint8_t*>(src), bytes},
                               fmt::format("copy of {} bytes to the device", bytes)));
  }
  Result<void> copy_to_host(void* dst, const void* src, size_t bytes) override {
    if (bytes == 0) return ok();
    KILN_TRY(check_range(src, bytes, "copy_to_host"));
    const uint64_t head[2] = {reinterpret_cast<uint64_t>(src), bytes};
    KILN_ASSIGN_OR_RETURN(auto data, process_->call(EmulatorProcess::kRead, {reinterpret_cast<const uint8_t*>(head), 16},
                                                    {}, fmt::format("copy of {} bytes to the host", bytes)));
    if (data.size() != bytes) return make_error(Errc::driver_error, "the emulator's read answered out of protocol");
    std::memcpy(dst, data.data(), bytes);
    return ok();
  }
  Result<void> memset(void* dst, uint8_t value, size_t bytes) override {
    if (bytes == 0) return ok();
    KILN_TRY(check_range(dst, bytes, "memset"));
    uint8_t head[17];
    const uint64_t address = reinterpret_cast<uint64_t>(dst), size = bytes;
    std::memcpy(head, &address, 8);
    std::memcpy(head + 8, &size, 8);
    head[16] = value;
    return done(process_->call(EmulatorProcess::kMemset, head, {}, fmt::format("memset of {} bytes", bytes)));
  }
  Result<void> synchronize(Stream) override { return ok(); }  // launches and copies are synchronous
  Result<float> time_ms(Stream, const std::function<Result<void>()>&) override {
    return make_error(Errc::unsupported,
                      "the emulator has no timing model: it runs a kernel for its results, not its speed (time "
                      "kernels on a GPU)");
  }

  Result<std::unique_ptr<KernelFunction>> load(const CodeObject& code, const std::string& kernel) override {
    KILN_ASSIGN_OR_RETURN(HsacoKernel k, read_hsaco_kernel(code.bytes, kernel));
    if (!k.target.empty() && k.target != target_->name)
      return make_error(Errc::invalid_argument, fmt::format("kernel '{}' is {} code; this emulated device is {}", kernel,
                                                            k.target, target_->name));
    std::vector<uint8_t> image = std::move(k.image);
    k.image.clear();
    KILN_ASSIGN_OR_RETURN(void* image_ptr, malloc(image.size()));
    auto loaded = copy_to_device(image_ptr, image.data(), image.size());
    auto region = loaded ? malloc(EmulatorModule::region_bytes(k)) : Result<void*>(loaded.take_error());
    if (!region) {
      (void)free(image_ptr);
      return region.take_error();
    }
    return std::unique_ptr<KernelFunction>(new EmulatorModule(*this, kernel, std::move(k),
                                                            reinterpret_cast<uint64_t>(image_ptr),
                                                            reinterpret_cast<uint64_t>(*region)));
  }

  EmulatorProcess& process() { return *process_; }

 private:
  // [p, p + bytes) must lie inside one allocation: the emulator itself checks nothing, and a
  // stray address would kill it.
  Result<void> check_range(const void* p, size_t bytes, const char* what) const {
    const uint64_t a = reinterpret_cast<uint64_t>(p);
    std::lock_guard lock(mu_);
    auto it = allocations_.upper_bound(a);
    if (it != allocations_.begin()) {
      --it;
      if (a >= it->first && bytes <= it->second && a - it->first <= it->second - bytes) return ok();
    }
    return make_error(Errc::invalid_argument,
                      fmt::format("{} of {} bytes at {}: not inside an allocation of this emulated device", what, bytes, p));
  }

  std::unique_ptr<EmulatorProcess> process_;
  const TargetInfo* target_;
  mutable std::mutex mu_;
  std::map<uint64_t, uint64_t> allocations_;  // address -> bytes
};

EmulatorModule::~EmulatorModule() {
  (void)device_.free(reinterpret_cast<void*>(region_));
  (void)device_.free(reinterpret_cast<void*>(image_));
}

Result<void> EmulatorModule::launch(const LaunchGeometry& g, void** args, Stream) const {
  if (g.cluster.x != 1 || g.cluster.y != 1 || g.cluster.z != 1)
    return make_error(Errc::unsupported, "thread-block clusters (LaunchGeometry::cluster) exist only on NVIDIA sm_90a");
  DispatchShape shape;
  shape.grid[0] = g.grid.x, shape.grid[1] = g.grid.y, shape.grid[2] = g.grid.z;
  shape.block[0] = g.block.x, shape.block[1] = g.block.y, shape.block[2] = g.block.z;
  shape.dynamic_lds_bytes = g.dynamic_shared_bytes;
  const uint64_t packet = region_ + packet_offset(k_);
  KILN_ASSIGN_OR_RETURN(Dispatch d, prepare_dispatch(k_, args, shape, region_, packet, packet + 64));
  const std::string what = fmt::format("launch of {} (grid {}x{}x{}, block {}x{}x{})", kernel_, g.grid.x, g.grid.y,
                                       g.grid.z, g.block.x, g.block.y, g.block.z);
  std::lock_guard lock(mu_);
  // Kernarg segment and packet in one write; the queue stand-in stays zero.
  std::vector<uint8_t> dispatch(packet_offset(k_) + 64, 0);
  std::memcpy(dispatch.data(), d.kernarg.data(), std::min<size_t>(d.kernarg.size(), k_.kernarg_bytes));
  std::memcpy(dispatch.data() + packet_offset(k_), d.packet.data(), d.packet.size());
  KILN_TRY(device_.copy_to_device(reinterpret_cast<void*>(region_), dispatch.data(), dispatch.size()));

  std::vector<uint8_t> run(16 + 9 * 4 + 4 * d.user_sgprs.size());
  const uint64_t entry = image_ + k_.entry;
  const uint32_t fields[9] = {g.grid.x, g.grid.y, g.grid.z, g.block.x, g.block.y, g.block.z, d.rsrc2,
                              k_.private_segment_bytes, static_cast<uint32_t>(d.user_sgprs.size())};
  std::memcpy(run.data(), &entry, 8);
  std::memcpy(run.data() + 8, &region_, 8);
  std::memcpy(run.data() + 16, fields, sizeof(fields));
  std::memcpy(run.data() + 52, d.user_sgprs.data(), 4 * d.user_sgprs.size());
  KILN_LOG_DEBUG("emulator: {}", what);
  return done(device_.process().call(EmulatorProcess::kRun, run, {}, what));
}

Result<std::unique_ptr<DeviceImpl>> start_emulator(const TargetInfo* target) {
  const Env e = read_env();
  EmulatorConfig config;
  config.emulator_dir = e.amd_emulator;
#ifdef KILN_DEFAULT_AMD_EMULATOR
  if (config.emulator_dir.empty()) config.emulator_dir = KILN_DEFAULT_AMD_EMULATOR;
#endif
  if (config.emulator_dir.empty() || !is_file(config.emulator_dir + "/test/mockgpu/amd/emu.py"))
    return make_error(Errc::driver_unavailable,
                      fmt::format("no AMD emulator at '{}' (test/mockgpu/amd/emu.py is missing): set "
                                  "KILN_AMD_EMULATOR to the folder of tinygrad's CDNA emulator (six files of "
                                  "https://github.com/tinygrad/tinygrad at commit a9069c177a with Kiln's patches; "
                                  "docs/emulator.md, 'Getting the emulator', says how to make it)",
                                  config.emulator_dir));
  config.python = e.emulator_python;
#ifdef KILN_DEFAULT_EMULATOR_PYTHON
  if (config.python.empty() && executable(KILN_DEFAULT_EMULATOR_PYTHON)) config.python = KILN_DEFAULT_EMULATOR_PYTHON;
#endif
  if (config.python.empty()) config.python = "python3";
  config.path_prefix = find_clang_dir();
  if (config.path_prefix.empty())
    return make_error(Errc::driver_unavailable,
                      "the AMD emulator compiles each instruction with 'clang', and none was found (on PATH or in "
                      "LLVM's bin folder): install clang-22");
  config.timeout_s = e.emulator_timeout_s;
  // The emulator decodes fp8 MFMA operands as OCP unless CDNA_FP8=fnuz: gfx942 code takes FNUZ
  // data (shared/AMD-EMULATION.md). One process serves one target, so one decoding.
  const std::string fp8 =
      !e.emulator_fp8.empty() ? e.emulator_fp8 : target->fp8_encoding == Fp8Encoding::fnuz ? "fnuz" : "ocp";
  config.env.push_back("CDNA_FP8=" + fp8);
  KILN_ASSIGN_OR_RETURN(auto process, EmulatorProcess::start(config));
  KILN_LOG_DEBUG("AMD emulator for {} started: {} with {} (fp8 {})", target->name, config.python, config.emulator_dir,
                 fp8);
  return std::unique_ptr<DeviceImpl>(new EmulatorDevice(std::move(process), target));
}

}  // namespace
#endif  // KILN_WITH_LLVM

Result<std::unique_ptr<DeviceImpl>> open_emulator_device(std::string_view target_name) {
  if (target_name.empty())
    return make_error(Errc::invalid_argument,
                      "the emulator backend needs a target: set RuntimeOptions::emulator_target to gfx942 or gfx950");
  auto target = find_target(target_name);
  if (!target || (*target)->vendor != Vendor::amd)
    return make_error(Errc::invalid_argument,
                      fmt::format("emulator target '{}': the emulator runs AMD CDNA code objects, gfx942 or gfx950",
                                  target_name));
#if KILN_WITH_LLVM
  auto device = start_emulator(*target);
#else
  Result<std::unique_ptr<DeviceImpl>> device =
      make_error(Errc::unsupported, "this Kiln was built without LLVM (KILN_WITH_LLVM=OFF), which the emulator "
                                    "backend needs to read AMD code objects (and Kiln to build them)");
#endif
  // Every reason the emulator cannot run here starts the same way (the tests skip on it).
  if (!device && (device.error().code == Errc::driver_unavailable || device.error().code == Errc::unsupported)) {
    Error e = device.take_error();
    e.message = "the AMD emulator is unavailable: " + e.message;
    return e;
  }
  return device;
}

}  // namespace kiln
