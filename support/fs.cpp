#include "support/fs.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace kiln {

UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

OpenedFile open_regular_at(int dirfd, const char* name, int flags, bool follow, bool clear_nonblock) {
  OpenedFile out;
  const int fd = ::openat(dirfd, name, flags | O_CLOEXEC | O_NONBLOCK | (follow ? 0 : O_NOFOLLOW), 0600);
  if (fd < 0) {
    out.err = errno;
    return out;
  }
  UniqueFd held(fd);
  if (::fstat(fd, &out.st) != 0) {
    out.err = errno;
    return out;
  }
  if (!S_ISREG(out.st.st_mode)) {
    out.not_regular = true;
    out.err = EINVAL;
    return out;
  }
  // Regular files never block; clear the flag so that reads behave as usual.
  if (clear_nonblock) {
    const int fl = ::fcntl(fd, F_GETFL);
    if (fl >= 0) (void)::fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  }
  out.fd = std::move(held);
  return out;
}

Result<UniqueFd> open_for_append(const std::string& path, std::string_view what) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0)
    return make_error(Errc::io_error, fmt::format("{}: cannot open '{}' for appending: {}", what, path, std::strerror(errno)));
  UniqueFd held(fd);
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return make_error(Errc::io_error, fmt::format("{}: '{}' is not a regular file (a FIFO, socket, device or "
                                                  "directory); give the path of a file",
                                                  what, path));
  return held;
}

int open_dir_at(int dirfd, const char* name) {
  return ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

Result<size_t> read_fd_upto(int fd, std::span<uint8_t> buf, std::string_view what, int* err) {
  size_t len = 0;
  while (len < buf.size()) {
    const ssize_t n = ::read(fd, buf.data() + len, buf.size() - len);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      if (err) *err = errno;
      return make_error(Errc::io_error, fmt::format("cannot read '{}': {}", what, std::strerror(errno)));
    }
    len += static_cast<size_t>(n);
  }
  return len;
}

Result<std::string> read_fd(int fd, std::string_view what, uint64_t max_bytes, int* err, const struct stat* known) {
  struct stat st{};
  if (known) st = *known;
  else if (::fstat(fd, &st) != 0) st = {};
  // Read straight into the string: room for the size fstat gave and one byte more, so that the
  // read which finds the end needs no second buffer and no copy; more room if the file grew.
  uint64_t room = 1 << 12;
  if (S_ISREG(st.st_mode) && st.st_size > 0) room = static_cast<uint64_t>(st.st_size) + 1;
  const uint64_t limit = max_bytes == UINT64_MAX ? max_bytes : max_bytes + 1;  // one byte past the bound
  room = std::min(room, limit);
  std::string out;
  size_t len = 0;
  for (;;) {
    out.resize(static_cast<size_t>(room));
    auto n = read_fd_upto(fd, std::span<uint8_t>(reinterpret_cast<uint8_t*>(out.data()) + len, out.size() - len), what, err);
    if (!n) return n.take_error();
    len += *n;
    if (len < out.size()) break;  // the end
    if (len > max_bytes)
      return make_error(Errc::invalid_argument,
                        fmt::format("'{}' is larger than the limit of {} bytes; refusing to read it", what, max_bytes));
    room = std::min(2 * room, limit);
  }
  out.resize(len);
  return out;
}

Result<std::string> read_file(const std::string& path, uint64_t max_bytes) {
  OpenedFile f = open_regular_at(AT_FDCWD, path.c_str(), O_RDONLY, /*follow=*/true);
  if (f.not_regular)
    return make_error(Errc::io_error, fmt::format("cannot read '{}': not a regular file (a directory, FIFO, socket "
                                                  "or device)",
                                                  path));
  if (!f.ok()) {
    errno = f.err;
    return make_error(Errc::io_error, "cannot read " + errno_message(path));
  }
  return read_fd(f.fd.get(), path, max_bytes);
}

namespace {
Result<std::vector<DirEntryName>> list_dir_owned(int fd, const std::string& what, int* err) {
  DIR* d = ::fdopendir(fd);
  if (!d) {
    if (err) *err = errno;
    auto e = make_error(Errc::io_error, "cannot list " + errno_message(what));
    ::close(fd);
    return e;
  }
  std::vector<DirEntryName> out;
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (name != "." && name != "..") out.push_back({std::string(name), e->d_type});
    errno = 0;
  }
  const int failed = errno;
  ::closedir(d);
  if (failed) {
    if (err) *err = failed;
    errno = failed;
    return make_error(Errc::io_error, "cannot list " + errno_message(what));
  }
  return out;
}
}  // namespace

Result<std::vector<DirEntryName>> list_dir(const std::string& path, int* err) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (err) *err = errno;
    return make_error(Errc::io_error, "cannot list " + errno_message(path));
  }
  return list_dir_owned(fd, path, err);
}

Result<std::vector<DirEntryName>> list_dir_fd(int dirfd, int* err) {
  // fdopendir takes the descriptor over: give it a copy (whose offset is shared, so rewind).
  const int fd = ::openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    if (err) *err = errno;
    return make_error(Errc::io_error, fmt::format("cannot list a directory: {}", std::strerror(errno)));
  }
  return list_dir_owned(fd, "(directory)", err);
}

bool remove_tree(const std::string& path) {
  struct stat st{};
  if (::lstat(path.c_str(), &st) != 0) return errno == ENOENT;
  if (!S_ISDIR(st.st_mode)) return ::unlink(path.c_str()) == 0 || errno == ENOENT;
  bool ok = true;
  // Owner write and search, so that a tree made read-only can be removed by its owner.
  if ((st.st_mode & 0700) != 0700) (void)::chmod(path.c_str(), (st.st_mode & 07777) | 0700);
  if (auto names = list_dir(path)) {
    for (const DirEntryName& e : *names) ok = remove_tree(path + "/" + e.name) && ok;
  }
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT) ok = false;
  return ok;
}

bool transient_errno(int err) {
  switch (err) {
    case EMFILE: case ENFILE: case ENOMEM: case EIO: case ESTALE: case EINTR: case EAGAIN: case ENOLCK:
    case ETIMEDOUT: case ENOBUFS: case EACCES: case EPERM: case ENXIO: case ENODEV: case EBUSY:
      return true;
    default:
      return false;
  }
}

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

std::string random_tag(size_t n) {
  static constexpr char kChars[] = "abcdefghijklmnopqrstuvwxyz0123456789";
  std::string out(n, 'x');
  std::vector<unsigned char> raw(n);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::getrandom(raw.data() + got, n - got, 0);
    if (r < 0) {
      if (errno == EINTR) continue;
      break;
    }
    got += static_cast<size_t>(r);
  }
  for (size_t i = 0; i < n; ++i) out[i] = kChars[raw[i] % 36];
  return out;
}

std::string errno_message(const std::string& path) { return fmt::format("'{}': {}", path, std::strerror(errno)); }

std::string printable(std::string_view text, size_t max_chars) {
  std::string out;
  const std::string_view shown = text.substr(0, max_chars);
  for (char c : shown) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u == 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  if (text.size() > max_chars) out += "...";
  return out;
}

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

Result<void> write_all(int fd, std::span<const uint8_t> bytes, std::string_view what) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return make_error(Errc::io_error, fmt::format("cannot write '{}': {}", what, std::strerror(errno)));
    }
    done += static_cast<size_t>(n);
  }
  return ok();
}

Result<void> write_file_synced(const std::string& path, std::span<const uint8_t> bytes) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return make_error(Errc::io_error, "cannot create " + errno_message(path));
  UniqueFd held(fd);
  KILN_TRY(write_all(fd, bytes, path));
  if (::fsync(fd) != 0) return make_error(Errc::io_error, "cannot fsync " + errno_message(path));
  if (::close(held.release()) != 0) return make_error(Errc::io_error, "cannot close " + errno_message(path));
  return ok();
}

Result<void> sync_dir(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return make_error(Errc::io_error, "cannot open directory " + errno_message(path));
  ::fsync(fd);  // best effort: some file systems refuse fsync on directories
  ::close(fd);
  return ok();
}

}  // namespace kiln
