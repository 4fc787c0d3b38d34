#include "runtime/emulator/emulator_process.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "support/embedded.h"
#include "support/log.h"

extern char** environ;

namespace kiln {
namespace {

constexpr size_t kStderrTail = 4000;
// A response larger than this is a protocol error, not data (Kiln's tensors are far smaller).
constexpr uint64_t kMaxResponse = 16ull << 30;
// Reads the embedded runner from stdin, so that its tracebacks name kiln_emu.py.
constexpr const char* kBootstrap =
    "import sys;exec(compile(sys.stdin.buffer.read(int(sys.argv[1])),'kiln_emu.py','exec'))";

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int poll_ms(int64_t deadline_ns) {
  const int64_t left = deadline_ns - now_ns();
  if (left <= 0) return 0;
  return static_cast<int>(std::min<int64_t>(left / 1'000'000 + 1, 1000));
}

struct Frame {
  uint32_t status_or_op;
  uint32_t zero;
  uint64_t bytes;
};
static_assert(sizeof(Frame) == 16);

}  // namespace

Result<std::unique_ptr<EmulatorProcess>> EmulatorProcess::start(const EmulatorConfig& config) {
  const std::string_view script = embedded_file("tools/emulator/kiln_emu.py");
  if (script.empty()) return make_error(Errc::corrupt, "this Kiln was built without tools/emulator/kiln_emu.py");

  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return make_error(Errc::driver_error, fmt::format("socketpair: {}", std::strerror(errno)));
  int errp[2];
  if (::pipe2(errp, O_CLOEXEC) != 0) {
    ::close(sv[0]);
    ::close(sv[1]);
    return make_error(Errc::driver_error, fmt::format("pipe: {}", std::strerror(errno)));
  }

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, sv[1], 0);
  posix_spawn_file_actions_adddup2(&actions, sv[1], 1);
  posix_spawn_file_actions_adddup2(&actions, errp[1], 2);
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 34))
  // Nothing else of this process (an application's descriptors, or locks) lives on in the child.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
#endif
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  // Its own process group, so that a kill takes the clang compiles it runs along; default signal
  // handling and an empty mask whatever this process has.
  sigset_t none, defaults;
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  posix_spawnattr_setpgroup(&attr, 0);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

  std::vector<std::string> env_strings;
  for (char** e = environ; e && *e; ++e) {
    std::string_view v(*e);
    if (v.starts_with("PATH=") && !config.path_prefix.empty()) continue;
    if (std::any_of(config.env.begin(), config.env.end(),
                    [&](const std::string& set) { return v.starts_with(set.substr(0, set.find('=') + 1)); }))
      continue;
    env_strings.emplace_back(v);
  }
  for (const std::string& set : config.env) env_strings.push_back(set);
  if (!config.path_prefix.empty()) {
    const char* path = std::getenv("PATH");
    env_strings.push_back("PATH=" + config.path_prefix + (path && *path ? std::string(":") + path : ""));
  }
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  const std::string length = std::to_string(script.size());
  std::vector<std::string> args = {config.python, "-c", kBootstrap, length, config.emulator_dir};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);

  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, config.python.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  ::close(sv[1]);
  ::close(errp[1]);
  if (rc != 0) {
    ::close(sv[0]);
    ::close(errp[0]);
    return make_error(Errc::driver_unavailable,
                      fmt::format("cannot start the AMD emulator's Python '{}': {}; run scripts/setup.sh (it makes the "
                                  "virtual environment .venv with tinygrad==0.14.0 and numpy) or set "
                                  "KILN_EMULATOR_PYTHON",
                                  config.python, std::strerror(rc)));
  }
  std::unique_ptr<EmulatorProcess> p(new EmulatorProcess());
  p->pid_ = pid;
  p->sock_ = sv[0];
  p->stderr_ = errp[0];
  p->timeout_s_ = config.timeout_s;
  ::fcntl(p->sock_, F_SETFL, ::fcntl(p->sock_, F_GETFL) | O_NONBLOCK);
  ::fcntl(p->stderr_, F_SETFL, ::fcntl(p->stderr_, F_GETFL) | O_NONBLOCK);

  const int64_t deadline = now_ns() + static_cast<int64_t>(config.timeout_s * 1e9);
  const std::string what = fmt::format("the start of the AMD emulator ({} with {})", config.python, config.emulator_dir);
  auto sent = p->send_all({reinterpret_cast<const uint8_t*>(script.data()), script.size()}, deadline, what);
  if (!sent) return make_error(Errc::driver_unavailable, sent.error().message);
  auto ready = p->receive(deadline, what);
  if (!ready) {
    Error e = ready.take_error();
    if (e.code != Errc::timeout) e.code = Errc::driver_unavailable;
    if (e.message.find("cannot import") != std::string::npos)
      e.message += "; run scripts/setup.sh (it makes .venv with tinygrad==0.14.0 and numpy), or point "
                   "KILN_EMULATOR_PYTHON at a Python that has them and KILN_AMD_EMULATOR at the emulator's folder";
    p->dead_error_ = e;
    return e;
  }
  // {"tinygrad": "0.14.0", "python": "3.11.2"}
  const auto versions = nlohmann::json::parse(ready->begin(), ready->end(), nullptr, /*allow_exceptions=*/false);
  const std::string tinygrad = versions.is_object() ? versions.value("tinygrad", "?") : "?";
  p->versions_ = fmt::format("tinygrad {}, Python {}", tinygrad,
                             versions.is_object() ? versions.value("python", "?") : "?");
  if (tinygrad != "0.14.0")
    KILN_LOG_WARN("the AMD emulator was checked with tinygrad 0.14.0; {} has tinygrad {}", config.python, tinygrad);
  return p;
}

EmulatorProcess::~EmulatorProcess() {
  if (sock_ >= 0) ::close(sock_);  // the child reads EOF and exits
  if (pid_ > 0) {
    siginfo_t info{};
    for (int i = 0; i < 200; ++i) {  // up to 2 s
      info.si_pid = 0;
      if (::waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid_) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(-pid_, SIGKILL);  // stragglers of its group; the unreaped leader keeps the group id ours
    ::waitpid(pid_, nullptr, 0);
  }
  if (stderr_ >= 0) ::close(stderr_);
}

void EmulatorProcess::drain_stderr() {
  if (stderr_ < 0) return;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::read(stderr_, buf, sizeof(buf));
    if (n > 0) {
      stderr_tail_.append(buf, static_cast<size_t>(n));
      if (stderr_tail_.size() > 2 * kStderrTail) stderr_tail_.erase(0, stderr_tail_.size() - kStderrTail);
      continue;
    }
    if (n == 0) {  // the child closed it: it is exiting
      ::close(stderr_);
      stderr_ = -1;
    }
    return;  // EAGAIN (nothing more now), or an error
  }
}

std::string EmulatorProcess::exit_story() {
  // Give a dying child a moment to finish exiting, so that its signal can be reported.
  int status = 0;
  pid_t r = 0;
  for (int i = 0; i < 100 && (r = ::waitpid(pid_, &status, WNOHANG)) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (r == 0) {
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
    return "it was killed";
  }
  pid_ = -1;
  if (r < 0) return "its status is unknown";
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return fmt::format("it was killed by signal {} ({}){}", sig, strsignal(sig),
                       sig == SIGSEGV || sig == SIGBUS
                           ? ", which is what a kernel that reads or writes outside its buffers does (the emulator has "
                             "no bounds checks)"
                           : "");
  }
  return fmt::format("it exited with status {}", WEXITSTATUS(status));
}

Error EmulatorProcess::fail(Errc code, const std::string& what, const std::string& why) {
  std::string story;
  if (code == Errc::timeout) {
    ::kill(-pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
    story = why;
  } else {
    story = why + "; " + exit_story();
  }
  drain_stderr();
  std::string tail = stderr_tail_.size() > kStderrTail ? stderr_tail_.substr(stderr_tail_.size() - kStderrTail)
                                                        : stderr_tail_;
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == ' ')) tail.pop_back();
  dead_ = true;
  dead_error_ = make_error(code, fmt::format("{}: {}. The emulated device and its memory are gone; create a new "
                                             "runtime{}{}",
                                             what, story, tail.empty() ? "" : ". Its stderr ends with:\n",
                                             tail));
  if (sock_ >= 0) {
    ::close(sock_);
    sock_ = -1;
  }
  return dead_error_;
}

Result<void> EmulatorProcess::send_all(std::span<const uint8_t> bytes, int64_t deadline, const std::string& what) {
  size_t done = 0;
  while (done < bytes.size()) {
    pollfd fds[2] = {{sock_, POLLOUT, 0}, {stderr_, POLLIN, 0}};
    const int n = ::poll(fds, stderr_ >= 0 ? 2 : 1, poll_ms(deadline));
    if (n < 0 && errno != EINTR) return fail(Errc::driver_error, what, fmt::format("poll: {}", std::strerror(errno)));
    if (fds[1].revents) drain_stderr();
    if (fds[0].revents & (POLLOUT | POLLERR | POLLHUP)) {
      const ssize_t w = ::send(sock_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w > 0) done += static_cast<size_t>(w);
      else if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
        return fail(Errc::driver_error, what, "the emulator process stopped reading requests");
    }
    if (done < bytes.size() && now_ns() >= deadline)
      return fail(Errc::timeout, what,
                  fmt::format("no progress within {:.0f} s (KILN_EMULATOR_TIMEOUT); the emulator was killed",
                              timeout_s_));
  }
  return ok();
}

Result<void> EmulatorProcess::recv_all(std::span<uint8_t> out, int64_t deadline, const std::string& what) {
  size_t done = 0;
  while (done < out.size()) {
    pollfd fds[2] = {{sock_, POLLIN, 0}, {stderr_, POLLIN, 0}};
    const int n = ::poll(fds, stderr_ >= 0 ? 2 : 1, poll_ms(deadline));
    if (n < 0 && errno != EINTR) return fail(Errc::driver_error, what, fmt::format("poll: {}", std::strerror(errno)));
    if (fds[1].revents) drain_stderr();
    if (fds[0].revents & (POLLIN | POLLERR | POLLHUP)) {
      const ssize_t r = ::recv(sock_, out.data() + done, out.size() - done, MSG_DONTWAIT);
      if (r > 0) done += static_cast<size_t>(r);
      else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        return fail(Errc::driver_error, what, "the emulator process died");
    }
    if (done < out.size() && now_ns() >= deadline)
      return fail(Errc::timeout, what,
                  fmt::format("no answer within {:.0f} s (KILN_EMULATOR_TIMEOUT); the emulator was killed",
                              timeout_s_));
  }
  return ok();
}

Result<std::vector<uint8_t>> EmulatorProcess::receive(int64_t deadline, const std::string& what) {
  Frame f{};
  KILN_TRY(recv_all({reinterpret_cast<uint8_t*>(&f), sizeof(f)}, deadline, what));
  if (f.status_or_op > 1 || f.bytes > kMaxResponse)
    return fail(Errc::driver_error, what, "the emulator process answered out of protocol");
  std::vector<uint8_t> payload(f.bytes);
  KILN_TRY(recv_all(payload, deadline, what));
  if (f.status_or_op != 0)
    return make_error(Errc::driver_error, fmt::format("{}: {}", what, std::string(payload.begin(), payload.end())));
  return payload;
}

Result<std::vector<uint8_t>> EmulatorProcess::call(Op op, std::span<const uint8_t> head, std::span<const uint8_t> tail,
                                                   const std::string& what) {
  std::lock_guard lock(mu_);
  if (dead_) return dead_error_;
  const int64_t deadline = now_ns() + static_cast<int64_t>(timeout_s_ * 1e9);
  const Frame f{op, 0, head.size() + tail.size()};
  KILN_TRY(send_all({reinterpret_cast<const uint8_t*>(&f), sizeof(f)}, deadline, what));
  KILN_TRY(send_all(head, deadline, what));
  KILN_TRY(send_all(tail, deadline, what));
  return receive(deadline, what);
}

}  // namespace kiln
