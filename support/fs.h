// Small POSIX file helpers with errors as values.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "kiln/result.h"

namespace kiln {
/// Creates `path` and its parents with `mode` (existing directories are left as they are).
Result<void> make_dirs(const std::string& path, unsigned mode = 0700);
/// Writes `bytes` to a new file and fsyncs it.
Result<void> write_file_synced(const std::string& path, std::span<const uint8_t> bytes);
inline Result<void> write_file_synced(const std::string& path, const std::string& text) {
  return write_file_synced(path, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}
/// fsyncs a directory, making a rename inside it durable.
Result<void> sync_dir(const std::string& path);
Result<std::string> read_file(const std::string& path);
/// This host's name as temporary-file names spell it ('.' and '/' replaced by '_'); with a pid it
/// tells whether the writer of a leftover is dead. Never part of a cache key.
const std::string& host_tag();
/// "strerror(errno)" with the path: "'/x/y': Permission denied".
std::string errno_message(const std::string& path);
}  // namespace kiln
