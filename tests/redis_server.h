// A real redis-server (Debian's) for the remote-cache tests: started on a free loopback port of its
// own with no persistence, and stopped (SIGTERM, then SIGKILL) within bounded time.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace kiln::testing {

class RedisServer {
 public:
  /// The redis-server binary, or "" when it is not installed (tests then skip).
  static std::string binary() {
    for (const char* p : {"/usr/bin/redis-server", "/usr/local/bin/redis-server"})
      if (::access(p, X_OK) == 0) return p;
    return "";
  }

  /// Starts a server with `dir` as its working directory; false if it did not answer in 5 s.
  bool start(const std::string& dir, const std::vector<std::string>& extra = {}) {
    for (int attempt = 0; attempt < 3 && pid_ < 0; ++attempt) {
      port_ = free_port();
      std::vector<std::string> args = {binary(), "--bind", "127.0.0.1", "--port", std::to_string(port_), "--save", "",
                                       "--appendonly", "no", "--dir", dir, "--loglevel", "warning", "--daemonize", "no"};
      args.insert(args.end(), extra.begin(), extra.end());
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      posix_spawn_file_actions_t actions;
      posix_spawn_file_actions_init(&actions);
      posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
      pid_t pid = -1;
      if (posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ) != 0) pid = -1;
      posix_spawn_file_actions_destroy(&actions);
      if (pid < 0) continue;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (std::chrono::steady_clock::now() < deadline && !answers()) {
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) == pid) {  // exited: the port was taken meanwhile
          pid = -1;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      if (pid > 0 && answers()) pid_ = pid;
      else if (pid > 0) stop_pid(pid);
    }
    return pid_ > 0;
  }
  ~RedisServer() { stop(); }

  /// Stops the server (SIGTERM; SIGKILL after 3 s).
  void stop() {
    if (pid_ > 0) stop_pid(pid_);
    pid_ = -1;
  }
  /// Kills it at once, as a crash would.
  void kill_now() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  void pause() { ::kill(pid_, SIGSTOP); }
  void resume() { ::kill(pid_, SIGCONT); }

  int port() const { return port_; }
  std::string url(int db = 0) const { return "redis://127.0.0.1:" + std::to_string(port_) + "/" + std::to_string(db); }

  /// A loopback port that nothing listens on (just now).
  static int free_port() {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    socklen_t len = sizeof addr;
    int port = 0;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      port = ntohs(addr.sin_port);
    ::close(fd);
    return port;
  }

 private:
  bool answers() const {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(port_));
    bool ok = false;
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      timeval tv{1, 0};
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      const char ping[] = "PING\r\n";
      char buf[16] = {};
      ok = ::write(fd, ping, sizeof ping - 1) == sizeof ping - 1 && ::read(fd, buf, sizeof buf - 1) > 0 &&
           std::string(buf).rfind("+PONG", 0) == 0;
    }
    ::close(fd);
    return ok;
  }
  static void stop_pid(pid_t pid) {
    ::kill(pid, SIGCONT);
    ::kill(pid, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(pid, nullptr, WNOHANG) == pid) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ::kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }

  pid_t pid_ = -1;
  int port_ = 0;
};

#define KILN_REQUIRE_REDIS()                                                                       \
  if (::kiln::testing::RedisServer::binary().empty())                                              \
  GTEST_SKIP() << "redis-server is not installed (Debian: apt-get install redis-server); the remote " \
                  "cache tier needs a real server to test"

}  // namespace kiln::testing
