#include "support/fs.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace kiln {

const std::string& host_tag() {
  static const std::string name = [] {
    char buf[256] = {0};
    if (::gethostname(buf, sizeof(buf) - 1) != 0 || !buf[0]) return std::string("host");
    std::string h(buf);
    for (char& c : h)
      if (c == '.' || c == '/') c = '_';
    return h;
  }();
  return name;
}

std::string errno_message(const std::string& path) { return fmt::format("'{}': {}", path, std::strerror(errno)); }

Result<void> make_dirs(const std::string& path, unsigned mode) {
  if (path.empty()) return ok();
  std::string partial;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    partial = path.substr(0, pos);
    if (partial.empty()) continue;
    if (mkdir(partial.c_str(), mode) != 0 && errno != EEXIST)
      return make_error(Errc::io_error, "cannot create directory " + errno_message(partial));
  }
  struct stat st{};
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return make_error(Errc::io_error, fmt::format("'{}' is not a directory", path));
  return ok();
}

Result<void> write_file_synced(const std::string& path, std::span<const uint8_t> bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return make_error(Errc::io_error, "cannot create " + errno_message(path));
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      auto e = make_error(Errc::io_error, "cannot write " + errno_message(path));
      ::close(fd);
      return e;
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) {
    auto e = make_error(Errc::io_error, "cannot fsync " + errno_message(path));
    ::close(fd);
    return e;
  }
  if (::close(fd) != 0) return make_error(Errc::io_error, "cannot close " + errno_message(path));
  return ok();
}

Result<void> sync_dir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return make_error(Errc::io_error, "cannot open directory " + errno_message(path));
  ::fsync(fd);  // best effort: some file systems refuse fsync on directories
  ::close(fd);
  return ok();
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(Errc::io_error, "cannot read " + errno_message(path));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace kiln
