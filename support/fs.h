// Small POSIX file helpers with errors as values.
//
// Files Kiln did not write itself (cache entries, manifests, archives) are opened through these:
// never following a symlink where that matters (O_NOFOLLOW), never blocking on a FIFO or a device
// (O_NONBLOCK, then fstat: only regular files are read), and read with a size bound. Nothing here
// throws: directories are listed with readdir, not std::filesystem's throwing iterators.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/result.h"

namespace kiln {

/// A file descriptor, closed on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();
  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

/// The outcome of open_regular_at: a descriptor of a regular file, or why not.
struct OpenedFile {
  UniqueFd fd;
  struct stat st {};
  int err = 0;               ///< errno of a failed openat or fstat (ELOOP: a symlink was refused).
  bool not_regular = false;  ///< It exists but is a directory, FIFO, socket or device.
  bool ok() const { return static_cast<bool>(fd); }
};
/// Opens `name` relative to the directory `dirfd` (AT_FDCWD: relative to the working directory)
/// with `flags` (O_RDONLY by default) plus O_CLOEXEC and O_NONBLOCK, and O_NOFOLLOW unless
/// `follow`; then fstat: anything but a regular file is closed and refused (`not_regular`).
/// O_NONBLOCK is cleared again on the returned descriptor unless `clear_nonblock` is false (it has
/// no effect on a regular file's reads; a caller that only reads may keep it and save two fcntl
/// calls). Never blocks on a FIFO.
OpenedFile open_regular_at(int dirfd, const char* name, int flags = 0, bool follow = false, bool clear_nonblock = true);

/// Opens the directory `name` relative to `dirfd`, never following a symlink; -1 with errno set.
int open_dir_at(int dirfd, const char* name);

/// Reads all of `fd` (from its current offset), at most `max_bytes`. `what` names it in errors.
/// `st`: the file's fstat when the caller has it (the read then sizes its buffer by it without
/// another fstat); a file that has grown or shrunk since is still read to its end.
/// Errors: Errc::io_error (read error; errno kept in `*err` when given), Errc::invalid_argument
/// (more than `max_bytes`).
Result<std::string> read_fd(int fd, std::string_view what, uint64_t max_bytes, int* err = nullptr,
                            const struct stat* st = nullptr);
/// Reads `fd` (from its current offset) into `buf` until its end or until `buf` is full, and
/// returns how many bytes it read: a caller that expects n bytes passes n + 1 bytes of room, so
/// that one read both fills and proves the end (n + 1 bytes read: the file is longer). `what`
/// names it in errors. Errors: Errc::io_error (errno kept in `*err` when given).
Result<size_t> read_fd_upto(int fd, std::span<uint8_t> buf, std::string_view what, int* err = nullptr);

/// The default bound of read_file: 1 GiB.
inline constexpr uint64_t kMaxReadBytes = uint64_t{1} << 30;

/// Reads a regular file (following symlinks; a FIFO, device or directory is refused at once, not
/// read), at most `max_bytes`. Errors: Errc::io_error ("cannot read '<path>': ...").
Result<std::string> read_file(const std::string& path, uint64_t max_bytes = kMaxReadBytes);

/// One name in a directory listing.
struct DirEntryName {
  std::string name;
  unsigned char type = 0;  ///< d_type (DT_DIR, DT_REG, ...; DT_UNKNOWN on some file systems).
};
/// The names in directory `path` (without "." and ".."), or in `dirfd` when `path` is empty.
/// Errors: Errc::io_error (ENOENT included; `*err` gets errno when given).
Result<std::vector<DirEntryName>> list_dir(const std::string& path, int* err = nullptr);
Result<std::vector<DirEntryName>> list_dir_fd(int dirfd, int* err = nullptr);

/// Opens `path` for appending (created 0644 if missing): a regular file only, never blocking (a
/// FIFO without a reader is refused at once, one with a reader too). `what` names it in errors:
/// "KILN_RECORD='x': ...". Errors: Errc::io_error.
Result<UniqueFd> open_for_append(const std::string& path, std::string_view what);

/// Removes a file or a directory tree without following symlinks; best effort, never throws.
/// Returns false when something could not be removed.
bool remove_tree(const std::string& path);

/// Whether `err` (an errno) is a fault of the moment or of the environment (a descriptor limit,
/// memory, an I/O or network file system error), not a property of the file's content.
bool transient_errno(int err);

/// Creates `path` and its parents with `mode` (existing directories are left as they are).
Result<void> make_dirs(const std::string& path, unsigned mode = 0700);
/// Writes `bytes` to a new file and fsyncs it.
Result<void> write_file_synced(const std::string& path, std::span<const uint8_t> bytes);
inline Result<void> write_file_synced(const std::string& path, const std::string& text) {
  return write_file_synced(path, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}
/// Writes all of `bytes` to `fd`. Errors: Errc::io_error naming `what`.
Result<void> write_all(int fd, std::span<const uint8_t> bytes, std::string_view what);
/// fsyncs a directory, making a rename inside it durable.
Result<void> sync_dir(const std::string& path);
/// A random name part of `n` characters from [a-z0-9] (getrandom), for private temporary names.
std::string random_tag(size_t n = 12);
/// This host's name as temporary-file names spell it ('.' and '/' replaced by '_'). Never part of
/// a cache key, and never used to decide whether a writer is alive (see DiskCache's temporaries).
const std::string& host_tag();
/// "strerror(errno)" with the path: "'/x/y': Permission denied".
std::string errno_message(const std::string& path);

/// Text from outside (a label, a file name, a JSON value) made safe to print on a terminal:
/// control characters (ESC, NUL, newlines, DEL) are written as \xNN, and text past `max_chars`
/// bytes is cut with "...".
std::string printable(std::string_view text, size_t max_chars = 200);
}  // namespace kiln
