// Cache archives (cache/archive.h) through libarchive: tar (pax), zstd.
#include "cache/archive.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "cache/disk_cache.h"
#include "support/fs.h"
#include "support/json_read.h"
#include "support/sha256.h"
#include "support/signature.h"

#if KILN_WITH_LIBARCHIVE
#include <archive.h>
#include <archive_entry.h>
#endif

namespace fs = std::filesystem;

namespace kiln {

Result<FileSystemSpace> file_system_space(const std::string& dir) {
  struct statvfs v{};
  if (::statvfs(dir.c_str(), &v) != 0)
    return make_error(Errc::io_error, "cannot measure the free space of " + errno_message(dir));
  const uint64_t unit = v.f_frsize ? v.f_frsize : v.f_bsize;
  return FileSystemSpace{static_cast<uint64_t>(v.f_bavail) * unit, static_cast<uint64_t>(v.f_blocks) * unit};
}

#if !KILN_WITH_LIBARCHIVE

bool archive_supported() { return false; }

static Error no_libarchive() {
  return make_error(Errc::unsupported, "cache archives are not available: kiln was built without libarchive (install "
                                       "libarchive-dev and rebuild)");
}

Result<ExportReport> export_cache(const DiskCache&, const std::string&, ArchiveCompression, const std::string&) {
  return no_libarchive();
}
Result<ImportReport> import_cache(const DiskCache&, const std::string&, const ImportLimits&) { return no_libarchive(); }

#else

namespace {

using json = nlohmann::json;

constexpr const char* kTop = "kiln-cache";
constexpr const char* kManifestMember = "kiln-cache/manifest.json";
constexpr const char* kSignatureMember = "kiln-cache/manifest.sig";
constexpr uint64_t kMaxSignatureBytes = 64 << 10;
constexpr const char* kFormat = "kiln-cache-archive";
constexpr int kArchiveVersion = 1;
/// The only file names an entry may hold.
const std::set<std::string> kEntryFiles = {"meta.json", "code.hsaco", "code.cubin", "code.ptx", "source.hip",
                                           "source.cu"};

struct ArchiveWriteDeleter {
  void operator()(archive* a) const { archive_write_free(a); }
};
struct ArchiveReadDeleter {
  void operator()(archive* a) const { archive_read_free(a); }
};
struct EntryDeleter {
  void operator()(archive_entry* e) const { archive_entry_free(e); }
};

std::string archive_message(archive* a) {
  const char* s = archive_error_string(a);
  return s && *s ? std::string(s) : std::string("unknown libarchive error");
}

bool is_hex(std::string_view s, size_t n) {
  return s.size() == n &&
         std::all_of(s.begin(), s.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

/// An entry's files, read under a shared lock on meta.json (eviction skips it meanwhile) and
/// checked against its meta.json.
struct EntryFiles {
  json meta;
  std::map<std::string, std::string> files;  ///< name -> bytes, meta.json included
  time_t mtime = 0;
};

/// Checks shared by export and import, on top of the cache's own: the key is the digest of the key
/// fields, and the entry's files are exactly those meta.json lists, plus meta.json.
Result<void> check_meta(const json& meta, const std::string& key, const std::set<std::string>& present) {
  if (!meta.is_object() || !meta.contains("key_fields") || !meta.contains("files") || !meta["files"].is_object())
    return make_error(Errc::corrupt, "meta.json is malformed");
  if (sha256_hex(meta["key_fields"].dump()) != key)
    return make_error(Errc::corrupt, "meta.json's key fields do not hash to the entry's key");
  std::set<std::string> listed = {"meta.json"};
  for (const auto& [name, _] : meta["files"].items()) listed.insert(name);
  for (const std::string& name : present)
    if (!listed.count(name))
      return make_error(Errc::corrupt, fmt::format("holds '{}', which meta.json does not list", name));
  for (const std::string& name : listed) {
    if (!kEntryFiles.count(name))
      return make_error(Errc::corrupt, fmt::format("meta.json lists an unknown file '{}'", printable(name)));
    if (!present.count(name)) return make_error(Errc::corrupt, fmt::format("{} is missing", name));
  }
  return ok();
}

Result<EntryFiles> read_entry_files(const DiskCache& cache, const std::string& key) {
  EntryFiles out;
  KILN_ASSIGN_OR_RETURN(out.files, cache.read_entry_files(key, &out.mtime));
  auto meta_it = out.files.find("meta.json");
  if (meta_it == out.files.end()) return make_error(Errc::corrupt, "meta.json is missing");
  KILN_ASSIGN_OR_RETURN(out.meta, parse_json(meta_it->second, "meta.json"));
  std::set<std::string> present;
  for (const auto& [name, _] : out.files) present.insert(name);
  KILN_TRY(check_meta(out.meta, key, present));
  try {
    for (const auto& [name, want] : out.meta["files"].items()) {
      const std::string& data = out.files.at(name);
      if (!want.at("bytes").is_number_unsigned() || data.size() != want.at("bytes").get<uint64_t>() ||
          sha256_hex(data) != want.at("sha256").get<std::string>())
        return make_error(Errc::corrupt, fmt::format("{} changed while exporting", name));
    }
  } catch (const json::exception& e) {
    return make_error(Errc::corrupt, fmt::format("meta.json is malformed: {}", e.what()));
  }
  return out;
}

Result<void> write_member(archive* a, const std::string& name, const std::string& data, time_t mtime,
                          const std::string& archive_path) {
  std::unique_ptr<archive_entry, EntryDeleter> e(archive_entry_new());
  archive_entry_set_pathname(e.get(), name.c_str());
  archive_entry_set_filetype(e.get(), AE_IFREG);
  archive_entry_set_perm(e.get(), 0600);
  archive_entry_set_size(e.get(), static_cast<la_int64_t>(data.size()));
  archive_entry_set_mtime(e.get(), mtime, 0);
  if (archive_write_header(a, e.get()) != ARCHIVE_OK ||
      (!data.empty() && archive_write_data(a, data.data(), data.size()) != static_cast<la_ssize_t>(data.size())))
    return make_error(Errc::io_error, fmt::format("cannot write '{}': {}", archive_path, archive_message(a)));
  return ok();
}

/// Removes a directory tree when it goes out of scope (unless released).
class TreeGuard {
 public:
  explicit TreeGuard(std::string path) : path_(std::move(path)) {}
  ~TreeGuard() {
    if (path_.empty()) return;
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TreeGuard(const TreeGuard&) = delete;
  TreeGuard& operator=(const TreeGuard&) = delete;

 private:
  std::string path_;
};

/// What a member of an archive is, after its name was checked against the layout.
struct Member {
  enum Kind { a_directory, the_manifest, the_signature, a_file } kind = a_directory;
  std::string key, file;
};

Result<Member> classify(std::string_view name, bool is_dir) {
  auto bad = [&](std::string_view why) {
    return make_error(Errc::corrupt, fmt::format("member '{}' {}", printable(name), why));
  };
  if (name.empty()) return bad("has an empty name");
  if (name.front() == '/') return bad("is an absolute path");
  std::vector<std::string_view> parts;
  std::string_view rest = name;
  if (rest.back() == '/') {
    if (!is_dir) return bad("names a directory but is not one");
    rest.remove_suffix(1);
  }
  for (size_t pos = 0; pos <= rest.size();) {
    size_t end = rest.find('/', pos);
    if (end == std::string_view::npos) end = rest.size();
    parts.push_back(rest.substr(pos, end - pos));
    pos = end + 1;
  }
  for (std::string_view p : parts) {
    if (p == "..") return bad("has a '..' component");
    if (p.empty() || p == ".") return bad("has an empty or '.' component");
  }
  const std::string_view layout = "is outside the layout of a kiln cache archive (kiln-cache/manifest.json and "
                                  "kiln-cache/v1/entries/<xx>/<key>/<file>)";
  if (parts[0] != kTop) return bad(layout);
  if (parts.size() == 2 && parts[1] == "manifest.json" && !is_dir) return Member{Member::the_manifest, {}, {}};
  if (parts.size() == 2 && parts[1] == "manifest.sig" && !is_dir) return Member{Member::the_signature, {}, {}};
  if (parts.size() >= 2 && parts[1] != "v1") return bad(layout);
  if (parts.size() >= 3 && parts[2] != "entries") return bad(layout);
  if (parts.size() >= 4 && !is_hex(parts[3], 2)) return bad(layout);
  if (parts.size() >= 5 && (!is_hex(parts[4], 64) || parts[4].substr(0, 2) != parts[3])) return bad(layout);
  if (parts.size() <= 5) {
    if (!is_dir) return bad(layout);
    return Member{Member::a_directory, {}, {}};
  }
  if (parts.size() == 6 && !is_dir) {
    if (!kEntryFiles.count(std::string(parts[5])))
      return bad(fmt::format("is not a file of a cache entry (one of: {})", fmt::join(kEntryFiles, ", ")));
    return Member{Member::a_file, std::string(parts[4]), std::string(parts[5])};
  }
  return bad(layout);
}

}  // namespace

bool archive_supported() { return true; }

Result<ExportReport> export_cache(const DiskCache& cache, const std::string& path, ArchiveCompression compression,
                                  const std::string& sign_key) {
  ExportReport report;
  if (!sign_key.empty()) KILN_TRY(sign_ed25519(sign_key, "kiln: check the signing key"));  // before any file
  // A new file of a private name beside the archive, created exclusively (O_EXCL, O_NOFOLLOW):
  // never a file or a symlink someone planted there. Mode 0666 less the umask, as any file the
  // user creates; renamed over `path` when complete.
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    tmp = fmt::format("{}.{}.tmp", path, random_tag(10));
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) return make_error(Errc::io_error, "cannot create " + errno_message(tmp));
  bool done = false;
  struct Cleanup {
    int& fd;
    const std::string& tmp;
    bool& done;
    ~Cleanup() {
      if (fd >= 0) ::close(fd);
      if (!done) ::unlink(tmp.c_str());
    }
  } cleanup{fd, tmp, done};

  std::unique_ptr<archive, ArchiveWriteDeleter> a(archive_write_new());
  if (!a) return make_error(Errc::io_error, "libarchive: out of memory");
  if (archive_write_set_format_pax_restricted(a.get()) != ARCHIVE_OK)
    return make_error(Errc::unsupported, "libarchive cannot write tar: " + archive_message(a.get()));
  if (compression == ArchiveCompression::zstd && archive_write_add_filter_zstd(a.get()) != ARCHIVE_OK)
    return make_error(Errc::unsupported, "this libarchive cannot write zstd: " + archive_message(a.get()));
  if (archive_write_open_fd(a.get(), fd) != ARCHIVE_OK)
    return make_error(Errc::io_error, fmt::format("cannot write '{}': {}", tmp, archive_message(a.get())));

  json listing = json::array();
  for (const EntryStatus& s : cache.list(/*verify=*/true)) {
    if (!s.ok) {
      report.skipped.push_back({s.key, s.target, s.summary, s.problem});
      continue;
    }
    auto entry = read_entry_files(cache, s.key);
    if (!entry) {
      report.skipped.push_back({s.key, s.target, s.summary, entry.error().message});
      continue;
    }
    const std::string prefix = fmt::format("{}/v1/entries/{}/{}/", kTop, s.key.substr(0, 2), s.key);
    for (const auto& [name, data] : entry->files) {
      KILN_TRY(write_member(a.get(), prefix + name, data, entry->mtime, tmp));
      report.entry_bytes += data.size();
    }
    listing.push_back({{"key", s.key}, {"target", s.target}, {"summary", s.summary}, {"files", entry->meta["files"]}});
    ++report.entries;
  }
  const json manifest = {{"format", kFormat}, {"version", kArchiveVersion}, {"entries", listing}};
  const std::string manifest_text = manifest.dump(1) + "\n";
  KILN_TRY(write_member(a.get(), kManifestMember, manifest_text, ::time(nullptr), tmp));
  if (!sign_key.empty()) {
    // The signature covers manifest.json's exact bytes, which list every entry's key and the
    // SHA-256 of each of its files: the binding of keys to code objects.
    KILN_ASSIGN_OR_RETURN(Signature sig, sign_ed25519(sign_key, manifest_text));
    const json sig_json = {{"format", "kiln-cache-signature"}, {"algorithm", "ed25519"}, {"signs", kManifestMember},
                           {"public_key", sig.public_hex}, {"signature", sig.signature_hex}};
    KILN_TRY(write_member(a.get(), kSignatureMember, sig_json.dump(1) + "\n", ::time(nullptr), tmp));
    report.signer = sig.public_hex;
  }
  if (archive_write_close(a.get()) != ARCHIVE_OK)
    return make_error(Errc::io_error, fmt::format("cannot write '{}': {}", tmp, archive_message(a.get())));
  if (::fsync(fd) != 0) return make_error(Errc::io_error, "cannot fsync " + errno_message(tmp));
  struct stat st{};
  if (::fstat(fd, &st) == 0) report.archive_bytes = static_cast<uint64_t>(st.st_size);
  const int closing = fd;
  fd = -1;
  if (::close(closing) != 0) return make_error(Errc::io_error, "cannot write " + errno_message(tmp));
  if (::rename(tmp.c_str(), path.c_str()) != 0)
    return make_error(Errc::io_error, "cannot create " + errno_message(path));
  done = true;
  const std::string parent = fs::path(path).parent_path().string();
  (void)sync_dir(parent.empty() ? "." : parent);
  return report;
}

Result<ImportReport> import_cache(const DiskCache& cache, const std::string& path, const ImportLimits& limits) {
  if (cache.read_only())
    return make_error(Errc::io_error, fmt::format("cache '{}' is a read-only layer", cache.root()));
  struct stat ast{};
  if (::stat(path.c_str(), &ast) != 0) return make_error(Errc::io_error, "cannot read archive " + errno_message(path));
  if (S_ISDIR(ast.st_mode))
    return make_error(Errc::io_error, fmt::format("cannot read archive '{}': it is a directory", path));

  std::unique_ptr<archive, ArchiveReadDeleter> a(archive_read_new());
  if (!a) return make_error(Errc::io_error, "libarchive: out of memory");
  archive_read_support_filter_all(a.get());
  archive_read_support_format_tar(a.get());
  const std::string not_archive = fmt::format("'{}' is not a kiln cache archive", path);
  const std::string damaged = fmt::format("'{}' is damaged or truncated (nothing was imported)", path);
  // "Unrecognized archive format" means not an archive; other errors (a truncated zstd stream, a
  // bad tar header checksum) a damaged one.
  // (libarchive's ARCHIVE_ERRNO_FILE_FORMAT, not in its public header, is EILSEQ off BSD.)
  auto unrecognized = [&] { return archive_errno(a.get()) == EILSEQ; };
  if (archive_read_open_filename(a.get(), path.c_str(), 1 << 16) != ARCHIVE_OK)
    return make_error(Errc::corrupt,
                      fmt::format("{}: {}", unrecognized() ? not_archive : damaged, archive_message(a.get())));

  // A private staging directory, laid out as a cache root: a temporary of the disk cache, held
  // alive while the import runs (one left by a killed import is removed by the next writer).
  const std::string root = cache.root();
  KILN_TRY(make_dirs(root + "/v1/tmp", 0700));
  KILN_ASSIGN_OR_RETURN(DiskCache::Temporary lease, cache.temporary("import."));
  const std::string staging = lease.path();
  if (::mkdir(staging.c_str(), 0700) != 0) return make_error(Errc::io_error, "cannot create " + errno_message(staging));
  TreeGuard remove_staging(staging);
  const std::string staged_entries = staging + "/v1/entries";

  // What staging may write: the smallest of the fixed bound, the decompression-ratio bound and
  // the free space of the cache's file system less the margin that stays free for others.
  const auto mib = [](uint64_t b) { return fmt::format("{:.1f} MiB", static_cast<double>(b) / (1 << 20)); };
  const uint64_t archive_bytes = static_cast<uint64_t>(std::max<off_t>(ast.st_size, 0));
  const uint64_t ratio_bytes =
      std::max(limits.ratio_floor_bytes, static_cast<uint64_t>(limits.max_ratio * static_cast<double>(archive_bytes)));
  auto space = limits.space ? limits.space(root + "/v1/tmp") : file_system_space(root + "/v1/tmp");
  if (!space) return space.take_error();
  const uint64_t margin = std::max(limits.min_free_bytes,
                                   static_cast<uint64_t>(limits.min_free_fraction * static_cast<double>(space->size)));
  const uint64_t space_bytes = space->available > margin ? space->available - margin : 0;
  // Refuses the archive if `more` bytes would take staging past a bound; checked before writing.
  auto within_bounds = [&](uint64_t staged, uint64_t more) -> Result<void> {
    const uint64_t after = staged + more;
    if (after > limits.max_total_bytes)
      return make_error(Errc::corrupt, fmt::format("'{}' unpacks to more than {} bytes, over the limit of an import; "
                                                   "refusing the archive (nothing was imported)",
                                                   path, limits.max_total_bytes));
    if (after > ratio_bytes)
      return make_error(Errc::corrupt,
                        fmt::format("'{}' unpacks to more than {} bytes ({}) from {} bytes, over the decompression-ratio "
                                    "limit of {:g}x (a decompression bomb, or not a kiln cache archive); refusing the "
                                    "archive (nothing was imported)",
                                    path, ratio_bytes, mib(ratio_bytes), archive_bytes, limits.max_ratio));
    if (after > space_bytes)
      return make_error(Errc::io_error,
                        fmt::format("'{}' unpacks to more than the cache's file system can take: {} of it are free "
                                    "under '{}' and an import leaves {} free for other processes (max({}, {:g}% of its "
                                    "{})), so staging may write {}; refusing the archive (nothing was imported; free "
                                    "space there, e.g. 'kiln cache gc', or import into another --cache-dir)",
                                    path, mib(space->available), root, mib(margin), mib(limits.min_free_bytes),
                                    limits.min_free_fraction * 100, mib(space->size), mib(space_bytes)));
    return {};
  };

  ImportReport report;
  std::map<std::string, std::set<std::string>> staged;  // key -> file names
  std::string manifest_text, signature_text;
  bool have_manifest = false, have_signature = false;
  size_t members = 0;
  uint64_t staged_bytes = 0;
  std::vector<char> buf(1 << 16);
  for (;;) {
    archive_entry* e = nullptr;
    const int r = archive_read_next_header(a.get(), &e);
    if (r == ARCHIVE_EOF) break;
    if (r < ARCHIVE_WARN || !e) {
      return make_error(Errc::corrupt, fmt::format("{}: {}", !members && unrecognized() ? not_archive : damaged,
                                                   archive_message(a.get())));
    }
    ++members;
    const char* raw_name = archive_entry_pathname(e);
    const std::string name = raw_name ? raw_name : "";
    auto refuse = [&](std::string_view why) {
      return make_error(Errc::corrupt, fmt::format("'{}': member '{}' {}; refusing the archive (nothing was imported)",
                                                   path, printable(name), why));
    };
    if (archive_entry_hardlink(e)) return refuse("is a hard link");
    const auto type = archive_entry_filetype(e);
    if (type == AE_IFLNK) return refuse("is a symbolic link");
    if (type != AE_IFREG && type != AE_IFDIR) return refuse("is a device, FIFO or socket, not a regular file");
    auto member = classify(name, type == AE_IFDIR);
    if (!member)
      return make_error(Errc::corrupt, fmt::format("'{}': {}; refusing the archive (nothing was imported)", path,
                                                   member.error().message));
    if (member->kind == Member::a_directory) continue;
    if (archive_entry_size_is_set(e) && static_cast<uint64_t>(archive_entry_size(e)) > limits.max_member_bytes)
      return refuse(fmt::format("is {} bytes, over the limit of {} bytes", archive_entry_size(e), limits.max_member_bytes));
    if (archive_entry_size_is_set(e) && archive_entry_size(e) > 0)
      KILN_TRY(within_bounds(staged_bytes, static_cast<uint64_t>(archive_entry_size(e))));
    if (members > limits.max_members)
      return make_error(Errc::corrupt, fmt::format("'{}' has more than {} members, over the limit; refusing the archive "
                                                   "(nothing was imported)",
                                                   path, limits.max_members));

    // The data: into memory for manifest.json, into a new file of the staging cache otherwise.
    int fd = -1;
    std::string file_path;
    std::string* in_memory = nullptr;
    if (member->kind == Member::the_manifest) {
      if (have_manifest) return refuse("appears twice");
      have_manifest = true;
      in_memory = &manifest_text;
    } else if (member->kind == Member::the_signature) {
      if (have_signature) return refuse("appears twice");
      have_signature = true;
      in_memory = &signature_text;
    } else {
      const std::string dir = fmt::format("{}/{}/{}", staged_entries, member->key.substr(0, 2), member->key);
      KILN_TRY(make_dirs(dir, 0700));
      file_path = dir + "/" + member->file;
      fd = ::open(file_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
      if (fd < 0 && errno == EEXIST) return refuse("appears twice");
      if (fd < 0) return make_error(Errc::io_error, "cannot create " + errno_message(file_path));
      staged[member->key].insert(member->file);
    }
    struct Closer {
      int fd;
      ~Closer() {
        if (fd >= 0) ::close(fd);
      }
    } closer{fd};
    uint64_t total = 0;
    for (;;) {
      const la_ssize_t n = archive_read_data(a.get(), buf.data(), buf.size());
      if (n == 0) break;
      if (n < 0) return make_error(Errc::corrupt, fmt::format("{}: {}", damaged, archive_message(a.get())));
      total += static_cast<uint64_t>(n);
      if (total > limits.max_member_bytes)
        return refuse(fmt::format("is over the limit of {} bytes", limits.max_member_bytes));
      // The whole archive is bounded too, before these bytes are written: a small compressed file
      // must not fill the disk (a member's declared size can lie).
      KILN_TRY(within_bounds(staged_bytes, static_cast<uint64_t>(n)));
      staged_bytes += static_cast<uint64_t>(n);
      if (in_memory) {
        if (in_memory == &signature_text && total > kMaxSignatureBytes) return refuse("is too large for a signature");
        in_memory->append(buf.data(), static_cast<size_t>(n));
        continue;
      }
      for (la_ssize_t off = 0; off < n;) {
        const ssize_t w = ::write(fd, buf.data() + off, static_cast<size_t>(n - off));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return make_error(Errc::io_error, "cannot write " + errno_message(file_path));
        off += w;
      }
    }
    if (fd >= 0 && ::fsync(fd) != 0) return make_error(Errc::io_error, "cannot fsync " + errno_message(file_path));
  }
  if (!have_manifest)
    return make_error(Errc::corrupt, fmt::format("{}: it has no {} (write one with 'kiln cache export')", not_archive,
                                                 kManifestMember));
  // With trusted keys configured, the archive must carry a signature of manifest.json by one of
  // them; checked before anything of the archive is believed.
  if (!limits.trusted_keys.empty()) {
    if (!have_signature)
      return make_error(Errc::corrupt, fmt::format("'{}' is not signed, and KILN_TRUSTED_KEYS accepts only signed "
                                                   "archives; refusing it (nothing was imported; sign with 'kiln "
                                                   "cache export --sign KEY')",
                                                   path));
    auto sig_json = parse_json(signature_text, kSignatureMember);
    Signature sig;
    if (sig_json && sig_json->is_object() && sig_json->value("algorithm", "") == "ed25519") {
      sig.public_hex = sig_json->value("public_key", "");
      sig.signature_hex = sig_json->value("signature", "");
    }
    if (!verify_ed25519(limits.trusted_keys, manifest_text, sig))
      return make_error(Errc::corrupt, fmt::format("'{}': its signature is not by a key in KILN_TRUSTED_KEYS or does "
                                                   "not match its manifest; refusing it (nothing was imported)",
                                                   path));
    report.signer = sig.public_hex;
  }
  auto parsed_manifest = parse_json(manifest_text, kManifestMember);
  const json manifest = parsed_manifest ? std::move(parsed_manifest).value() : json();
  if (!manifest.is_object() || !manifest.contains("format") || manifest["format"] != kFormat ||
      !manifest.contains("entries") || !manifest["entries"].is_array())
    return make_error(Errc::corrupt, fmt::format("{}: its {} is malformed", not_archive, kManifestMember));
  if (!manifest.contains("version") || !manifest["version"].is_number_integer() ||
      manifest["version"].get<int64_t>() != kArchiveVersion)
    return make_error(Errc::unsupported, fmt::format("'{}' is a kiln cache archive of version {}; this kiln reads "
                                                     "version {}",
                                                     path, manifest.value("version", json()).dump(), kArchiveVersion));
  std::map<std::string, json> listed;  // key -> its item of manifest.json
  for (const json& item : manifest["entries"]) {
    if (!item.is_object() || !item.contains("key") || !item["key"].is_string() || !item.contains("files"))
      return make_error(Errc::corrupt, fmt::format("{}: its {} is malformed", not_archive, kManifestMember));
    listed[item["key"].get<std::string>()] = item;
  }
  auto listed_text = [&](const std::string& key, const char* field) {
    const json& item = listed.at(key);
    return item.contains(field) && item[field].is_string() ? item[field].get<std::string>() : std::string();
  };

  // Verify every staged entry as a cache load would, plus the import's own checks.
  auto stage = DiskCache::open(staging);
  if (!stage) return stage.take_error();
  std::vector<std::pair<EntryStatus, ArchiveEntryInfo>> good;
  std::set<std::string> seen;
  for (const EntryStatus& s : (*stage)->list(/*verify=*/true)) {
    seen.insert(s.key);
    ArchiveEntryInfo info{s.key, s.target, s.summary, {}};
    if (!s.ok) {
      info.problem = s.problem;
    } else if (auto it = listed.find(s.key); it == listed.end()) {
      info.problem = "it is not listed in manifest.json";
    } else {
      auto meta = read_file(s.path + "/meta.json", uint64_t{16} << 20);
      auto parsed = meta ? parse_json(*meta, "meta.json") : Result<json>(meta.error());
      const json m = parsed ? std::move(parsed).value() : json();
      if (auto checked = check_meta(m, s.key, staged[s.key]); !checked) info.problem = checked.error().message;
      else if (m["files"] != it->second["files"]) info.problem = "its files disagree with manifest.json";
    }
    if (!info.problem.empty()) report.rejected.push_back(std::move(info));
    else good.emplace_back(s, std::move(info));
  }
  report.members = seen.size();
  for (const auto& [key, item] : listed) {
    if (seen.count(key)) continue;
    report.rejected.push_back({key, listed_text(key, "target"), listed_text(key, "summary"),
                               "listed in manifest.json but not in the archive"});
    ++report.members;
  }

  // Publish: one rename per entry, as a compile's store does; an existing key wins.
  std::set<std::string> parents;
  for (auto& [s, info] : good) {
    const std::string parent = fmt::format("{}/v1/entries/{}", root, s.key.substr(0, 2));
    const std::string dest = parent + "/" + s.key;
    struct stat st{};
    if (::lstat(dest.c_str(), &st) == 0) {
      report.present.push_back(std::move(info));
      continue;
    }
    (void)sync_dir(s.path);
    if (auto made = make_dirs(parent, 0700); !made) return made.take_error();
    if (::rename(s.path.c_str(), dest.c_str()) != 0) {
      if (errno == EEXIST || errno == ENOTEMPTY) {
        report.present.push_back(std::move(info));
        continue;
      }
      return make_error(Errc::io_error, fmt::format("cannot add entry {} to the cache after {} were added: {}", s.key,
                                                    report.imported.size(), errno_message(dest)));
    }
    parents.insert(parent);
    report.imported.push_back(std::move(info));
  }
  for (const std::string& p : parents) (void)sync_dir(p);
  return report;
}

#endif  // KILN_WITH_LIBARCHIVE

}  // namespace kiln
