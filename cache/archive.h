// Cache archives: a whole kernel cache in one file, to carry a cache prebuilt on a build host to
// the nodes of a cluster (`kiln cache export` / `kiln cache import`).
//
// An archive is a tar file (pax), zstd-compressed by default, written and read with libarchive:
//   kiln-cache/v1/entries/<key[0:2]>/<key>/<file>   the files of each entry, as in the cache
//                                                  (meta.json, code.<hsaco|cubin|ptx>,
//                                                  source.<hip|cu>)
//   kiln-cache/manifest.json                       {"format": "kiln-cache-archive", "version": 1,
//                                                   "entries": [{"key", "target", "summary",
//                                                   "files": {name: {"sha256", "bytes"}}}]}
// Export writes only entries that verify (as a cache load does), to a new file of a private name
// beside FILE (created exclusively, never through a planted symlink), renamed to FILE when complete. Import is paranoid about the layout: any member outside it (an absolute path, "..", a
// link, a device, an unknown file name, a member over 256 MiB, more than 4 GiB unpacked in all, more
// than the cache's file system can hold with a margin left free, more than 64 times the archive's
// own size: see ImportLimits) refuses the whole archive, as does a damaged or truncated one. The members are extracted into a private directory under the
// destination cache's v1/tmp/, laid out as a cache of its own, and every entry is verified there
// with the checks of a cache load (SHA-256 and size of every file, code-object header, key and
// target), plus: the key is the SHA-256 of the entry's key fields, the entry holds exactly the
// files its meta.json lists, and they agree with manifest.json. Entries that fail are rejected
// (reported with the reason); the others are renamed into v1/entries/ one by one (atomic, as a
// compile's store is), existing keys are kept as they are, and the private directory is removed.
//
// The checks catch damage and malformed or hostile layouts; they cannot tell a malicious producer
// of an unsigned archive. A signed archive (export --sign KEY) carries kiln-cache/manifest.sig, an
// Ed25519 signature of manifest.json (which binds every key to the SHA-256 of its files); with
// KILN_TRUSTED_KEYS set, import refuses archives that are unsigned or not signed by a listed key.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/result.h"
#include "support/signature.h"

namespace kiln {

class DiskCache;

/// Whether this build can write and read archives (false when built without libarchive; then
/// export_cache and import_cache return Errc::unsupported).
bool archive_supported();

enum class ArchiveCompression { zstd, none };

struct ArchiveEntryInfo {
  std::string key;
  std::string target;   ///< May be empty (unreadable meta.json).
  std::string summary;  ///< "gemm bf16 K=32 M=64 ... [clang]"; may be empty.
  std::string problem;  ///< Why it was skipped or rejected; empty otherwise.
};

struct ExportReport {
  size_t entries = 0;                     ///< Entries written.
  uint64_t entry_bytes = 0;               ///< Bytes of their files, uncompressed.
  uint64_t archive_bytes = 0;             ///< Size of the archive file.
  std::vector<ArchiveEntryInfo> skipped;  ///< Entries that failed verification (not exported).
  std::string signer;                     ///< With a signing key: its public key (hex); else empty.
};

/// Writes every entry of `cache` that verifies to the archive `path` (through a private
/// temporary `path`.<random>.tmp, created with O_EXCL).
/// Errors: Errc::unsupported (no libarchive), io_error (cannot write), nothing is left at `path`.
/// `sign_key`: the PEM file of an Ed25519 private key; the archive then carries
/// kiln-cache/manifest.sig, a signature of manifest.json's bytes (see support/signature.h).
Result<ExportReport> export_cache(const DiskCache& cache, const std::string& path,
                                  ArchiveCompression compression = ArchiveCompression::zstd,
                                  const std::string& sign_key = "");

struct ImportReport {
  size_t members = 0;                      ///< Entries in the archive.
  std::vector<ArchiveEntryInfo> imported;  ///< Added to the cache.
  std::vector<ArchiveEntryInfo> present;   ///< Already in the cache (left as they are).
  std::vector<ArchiveEntryInfo> rejected;  ///< Failed verification (problem says why); not added.
  std::string signer;                      ///< The trusted key that signed it (hex), when keys were given.
};

/// Space of a file system, in bytes (statvfs: f_bavail and f_blocks, times f_frsize).
struct FileSystemSpace {
  uint64_t available = 0;  ///< Free to an unprivileged user.
  uint64_t size = 0;       ///< The whole file system.
};

/// The space of the file system that holds `dir` (statvfs(3)); Errc::io_error if it fails.
Result<FileSystemSpace> file_system_space(const std::string& dir);

/// Bounds of an import: what an archive may unpack to before it is refused as a whole. Every
/// bound is checked before the bytes that would cross it are written (a member's declared size
/// first, then each block as it is decompressed), so a refused import never wrote more than its
/// budget; the staging directory is removed.
struct ImportLimits {
  uint64_t max_member_bytes = uint64_t{256} << 20;  ///< One member (a code object, a source).
  uint64_t max_total_bytes = uint64_t{4} << 30;     ///< All members together, as staged on disk.
  /// Decompression ratio: all members together may unpack to at most this many times the
  /// archive file's size (a real cache archive compresses 2-6x; a zstd bomb of zeros,
  /// thousands of times), or `ratio_floor_bytes`, whichever is larger. Errc::corrupt beyond it.
  double max_ratio = 64;
  uint64_t ratio_floor_bytes = uint64_t{16} << 20;
  /// Free space: staging may use the available space of the cache's file system (measured once,
  /// when the import starts) less a margin that stays free for every other process on it:
  /// max(`min_free_bytes`, `min_free_fraction` of the file system's size). Errc::io_error beyond it,
  /// naming the figures.
  uint64_t min_free_bytes = uint64_t{64} << 20;
  double min_free_fraction = 0.02;
  /// How the free space is measured: file_system_space() of the cache's v1/tmp/ when empty. Tests
  /// inject a smaller file system here.
  std::function<Result<FileSystemSpace>(const std::string& dir)> space;
  size_t max_members = 1'000'000;                   ///< Members of any kind (directories included).
  /// Not empty (KILN_TRUSTED_KEYS): the archive must be signed by one of these keys, or it is
  /// refused as a whole (Errc::corrupt), unsigned or mis-signed alike.
  std::vector<TrustedKey> trusted_keys;
};

/// Adds the entries of the archive `path` to `cache` (see above).
/// Errors (nothing is added, nothing is left behind): Errc::unsupported (no libarchive), io_error
/// (unreadable archive, cache not writable), corrupt (not an archive, damaged or truncated, a
/// member outside the layout, no or malformed manifest.json, over a size or ratio bound of
/// `limits`), io_error also when the archive unpacks to more than the cache's file system can take
/// (with the margin of `limits`).
Result<ImportReport> import_cache(const DiskCache& cache, const std::string& path, const ImportLimits& limits = {});

}  // namespace kiln
