// The content-addressed cache. Correctness rests on unique temp files and rename (or link,
// where the first writer must win); locks only avoid duplicate work.
#include "hub/store/store.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <pwd.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "hub/base/cache_layout.h"
#include "hub/base/digest.h"
#include "hub/base/error.h"
#include "hub/base/guarded_root.h"
#include "hub/base/log.h"
#include "hub/oci/closure.h"

namespace kh {

namespace stdfs = std::filesystem;

namespace {

// Temp files untouched for this long belong to dead processes (a live download writes
// continuously, which keeps its mtime fresh).
constexpr int64_t kStaleTempAgeS = 6 * 3600;
constexpr uint64_t kMaxRefRecordBytes = 64 << 10;

constexpr std::string_view kCacheDirTag =
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by kernel-hub.\n"
    "# For information about cache directory tags, see:\n"
    "#\thttps://bford.info/cachedir/\n";

bool is_blob_hex(std::string_view s) {
  if (s.size() != 64) return false;
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

const std::string& checked_hex(const Digest& d) {
  if (!is_blob_hex(d.hex)) {
    throw Error(ErrorKind::kInvalidInput,
                "invalid digest 'sha256:" + d.hex + "': expected 64 lowercase hex characters");
  }
  return d.hex;
}

int64_t now_s() {
  return static_cast<int64_t>(::time(nullptr));
}

// Modification time: a blob's is when its download finished, an unpacked tree's when its
// last entry was written, a temp file's when its writer last made progress, a ref record's
// when it was last resolved or touched on use.
std::optional<int64_t> touched_at(const stdfs::path& p) {
  struct stat st;
  if (::lstat(p.c_str(), &st) != 0) return std::nullopt;
  return static_cast<int64_t>(st.st_mtim.tv_sec);
}

uint64_t tree_size(const stdfs::path& p) {
  struct stat st;
  if (::lstat(p.c_str(), &st) != 0) return 0;
  if (!S_ISDIR(st.st_mode)) return static_cast<uint64_t>(st.st_size);
  uint64_t total = 0;
  std::error_code ec;
  for (auto it = stdfs::directory_iterator(p, ec); !ec && it != stdfs::directory_iterator();
       it.increment(ec)) {
    total += tree_size(it->path());
  }
  return total;
}

std::vector<std::string> list_names(const stdfs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (auto it = stdfs::directory_iterator(dir, ec); !ec && it != stdfs::directory_iterator();
       it.increment(ec)) {
    names.push_back(it->path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Removes temp entries (files or directories) whose names start with `prefix_dot` rules:
// every entry in tmp/, and hidden ".<...>" entries in unpacked/, untouched for max_age_s.
uint64_t sweep_stale(const stdfs::path& dir, bool hidden_only, int64_t max_age_s, bool dry_run,
                     uint64_t* removed_bytes) {
  uint64_t removed = 0;
  int64_t now = now_s();
  for (const auto& name : list_names(dir)) {
    if (hidden_only && !name.starts_with(".")) continue;
    stdfs::path p = dir / name;
    auto t = touched_at(p);
    // A grace of 0 means every entry: a file's timestamp can read a second ahead of the coarse
    // clock `now` comes from (fine-grained file timestamps), so "age >= 0" is not a given.
    if (!t || (max_age_s > 0 && now - *t < max_age_s)) continue;
    if (removed_bytes) *removed_bytes += tree_size(p);
    if (!dry_run) fs::remove_tree(p);
    ++removed;
  }
  return removed;
}

// One path component for a ref record: [A-Za-z0-9._-] kept, '/' becomes '+', everything else
// (and a leading '.', so that "." and ".." and our hidden temp files cannot collide) is %XX.
std::string encode_component(std::string_view s, std::string_view what) {
  if (s.empty()) {
    throw Error(ErrorKind::kInvalidInput, "ref record: empty " + std::string(what));
  }
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '-' || (c == '.' && i > 0);
    if (plain) {
      out += static_cast<char>(c);
    } else if (c == '/') {
      out += '+';
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

std::string lock_file_name(const std::string& key) {
  std::string out;
  bool changed = false;
  for (char c : key) {
    bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '-' || c == '.';
    out += plain ? c : '_';
    changed |= !plain;
  }
  if (out.empty() || out.starts_with(".")) {
    out = "_" + out;
    changed = true;
  }
  if (out.size() > 120) {
    out.resize(100);
    changed = true;
  }
  // Distinct keys must not share a lock after sanitizing.
  if (changed) out += "-" + sha256_of(key).hex.substr(0, 16);
  return out + ".lock";
}

std::optional<RefRecord> parse_ref_record(const std::string& text, const stdfs::path& path) {
  try {
    auto j = nlohmann::json::parse(text);
    RefRecord r;
    r.hub_id = j.at("hub_id").get<std::string>();
    r.repo = j.at("repo").get<std::string>();
    r.tag = j.at("tag").get<std::string>();
    r.digest = Digest::parse(j.at("digest").get<std::string>());
    r.resolved_at = j.at("resolved_at").get<int64_t>();
    return r;
  } catch (const std::exception& e) {
    log_warning(fmt::format(
        "ignoring damaged ref record {} ({}); the next online resolve of this tag rewrites it",
        path.string(), e.what()));
    return std::nullopt;
  }
}

class StoreBlobWriter final : public BlobWriter {
 public:
  StoreBlobWriter(stdfs::path tmp_dir, stdfs::path dest, oci::Descriptor desc)
      : tmp_dir_(std::move(tmp_dir)), dest_(std::move(dest)), desc_(std::move(desc)) {
    open_temp();
  }

  uint64_t offset() const override { return tmp_ ? tmp_->size() : 0; }

  void write(const char* data, size_t size) override {
    if (!tmp_) fail_closed();
    if (tmp_->size() + size > static_cast<uint64_t>(desc_.size)) {
      uint64_t got = tmp_->size() + size;
      tmp_.reset();  // removes the temp: nothing of it is kept
      throw Error(ErrorKind::kIntegrity,
                  "blob " + desc_.digest.str() + ": received more than the expected " +
                      std::to_string(desc_.size) + " bytes (at least " + std::to_string(got) +
                      "); the server sent different content than its manifest describes");
    }
    tmp_->write(data, size);
    hash_.update(data, size);
    start_writeback();
  }

  void restart() override {
    if (!tmp_) {
      open_temp();
      return;
    }
    tmp_->truncate();
    hash_.reset();
    written_back_ = 0;
  }

  void commit() override {
    if (!tmp_) fail_closed();
    uint64_t got = tmp_->size();
    if (got != static_cast<uint64_t>(desc_.size)) {
      tmp_.reset();
      throw Error(ErrorKind::kIntegrity,
                  "blob " + desc_.digest.str() + ": expected " + std::to_string(desc_.size) +
                      " bytes, received " + std::to_string(got) +
                      "; the download was cut short or the server sent different content");
    }
    Digest actual = hash_.finish();
    if (actual != desc_.digest) {
      tmp_.reset();
      throw Error(ErrorKind::kIntegrity,
                  "blob digest mismatch: expected " + desc_.digest.str() + ", received " +
                      actual.str() + " (" + std::to_string(got) +
                      " bytes); the content was not stored, pull again or check the hub");
    }
    // keep_existing: another process may have stored the same blob first; that is fine.
    tmp_->commit(dest_, 0444, /*keep_existing=*/true);
    tmp_.reset();
  }

 private:
  [[noreturn]] void fail_closed() {
    throw Error(ErrorKind::kIntegrity,
                "blob " + desc_.digest.str() + ": writer already failed or committed; restart it");
  }

  void open_temp() {
    tmp_.emplace(tmp_dir_, desc_.digest.hex);
    hash_.reset();
    written_back_ = 0;
  }

  // Starts writing each full 8 MiB to disk while the rest arrives, so that commit()'s fsync
  // waits for the tail only: fsyncing whole blobs after the download was a fifth of a loopback
  // pull's time (tools/bench/RESULTS.md). Only a hint: errors show at fsync.
  void start_writeback() {
    constexpr uint64_t kWritebackBytes = 8u << 20;
    const uint64_t size = tmp_->size();
    if (size - written_back_ < kWritebackBytes) return;
    ::sync_file_range(tmp_->fd(), static_cast<off_t>(written_back_),
                      static_cast<off_t>(size - written_back_), SYNC_FILE_RANGE_WRITE);
    written_back_ = size;
  }

  stdfs::path tmp_dir_;
  stdfs::path dest_;
  oci::Descriptor desc_;
  std::optional<fs::TempFile> tmp_;
  Sha256 hash_;
  uint64_t written_back_ = 0;  // bytes of the temp file whose writeback was started
};

// ---- gc helpers ----

struct RefEntry {
  RefRecord record;
  stdfs::path path;
  int64_t last_used = 0;  // max(resolved_at, mtime)
};

// Marks everything reachable from a ref record's root: every node of its graph, present or not
// (a missing or damaged document ends its branch), and the unpacked trees of its layers. A graph
// over the limits is refused (kRefused): a partial walk would remove what the rest needs.
void mark_reachable(const Store& store, const RefEntry& ref, const oci::GraphLimits& limits,
                    std::set<std::string>& blobs, std::set<std::string>& unpacked) {
  const RefRecord& r = ref.record;
  Closure c;
  try {
    c = closure_of(store, r.digest, "gc: " + r.repo + "@" + r.tag + " (hub " + r.hub_id + ")",
                   limits);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kRefused) throw;
    throw Error(ErrorKind::kRefused, std::string(e.what()) +
                                         ". gc removed nothing; to collect the rest, remove that "
                                         "ref record (" +
                                         ref.path.string() + ") and run gc again");
  }
  for (const auto* set : {&c.manifests, &c.blobs, &c.missing}) {
    for (const Digest& d : *set) {
      if (is_blob_hex(d.hex)) blobs.insert(d.hex);
    }
  }
  for (const Digest& d : c.layers) {
    if (is_blob_hex(d.hex)) unpacked.insert(d.hex);
  }
}

}  // namespace

// Absolute once: the guard is recorded for this path, and a relative one would name another
// directory (unguarded) after the embedding program changes directory.
Store::Store(stdfs::path root) : root_(stdfs::absolute(root)) {
  // The cache is storage someone else may touch: private (or group-shared) whatever the umask,
  // refused when others could write it, and no link inside it is ever followed.
  fs::guard_root(root_, fs::cache_sharing_from_env(), "cache");
  for (const char* sub : {"blobs/sha256", "tmp", "refs", "unpacked", "locks"}) {
    fs::make_dirs(root_ / sub);
  }
  stdfs::path tag = root_ / "CACHEDIR.TAG";
  std::error_code ec;
  if (!stdfs::exists(tag, ec)) fs::write_file_atomic(tag, kCacheDirTag, 0644);
}

void Store::sweep_before_first_write() {
  std::call_once(swept_, [this] {
    sweep_stale(root_ / "tmp", false, kStaleTempAgeS, false, nullptr);
    sweep_stale(root_ / "unpacked", true, kStaleTempAgeS, false, nullptr);
  });
}

stdfs::path Store::default_root() {
  return cache_layout::default_root();
}

stdfs::path Store::blob_path(const Digest& d) const {
  return root_ / "blobs" / "sha256" / checked_hex(d);
}

bool Store::has_blob(const Digest& d) const {
  struct stat st;
  return ::lstat(blob_path(d).c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool Store::has_intact_blob(const oci::Descriptor& d) {
  const stdfs::path p = blob_path(d.digest);
  fs::Fd fd;
  try {
    fd = fs::open_file(p);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kNotFound) return false;
    throw;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw_errno("cannot stat " + p.string());
  // The content decides, never the descriptor alone: the blob is named by its digest, so a
  // descriptor whose size disagrees with intact content is the manifest's error, and a hub that
  // could delete cached blobs by naming them with a wrong size would be a hostile one's tool.
  const Digest actual = sha256_of_fd(fd.get(), p);
  if (actual == d.digest) {
    if (d.size >= 0 && static_cast<uint64_t>(st.st_size) != static_cast<uint64_t>(d.size))
      throw Error(ErrorKind::kIntegrity,
                  fmt::format("a manifest lists blob {} with size {}, but that blob is {} bytes "
                              "(its content verified); the hub's manifest is wrong",
                              d.digest.str(), d.size, st.st_size));
    return true;
  }
  const std::string outcome = remove_damaged(p, fd.get());
  log_warning(fmt::format("cache entry {} is damaged (content hashes to {}); {}, to fetch it again",
                          p.string(), actual.str(), outcome));
  return false;
}

std::optional<std::string> Store::read_blob(const Digest& d, uint64_t max_size) const {
  stdfs::path p = blob_path(d);
  fs::Fd fd;
  try {
    fd = fs::open_file(p);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kNotFound) return std::nullopt;
    throw;
  }
  std::string bytes = fs::read_all(fd.get(), p, max_size);
  Digest actual = sha256_of(bytes);
  if (actual != d) {
    const std::string outcome = remove_damaged(p, fd.get());
    log_warning(
        fmt::format("cache entry {} is damaged (content hashes to {}); {}, it will be "
                    "fetched again",
                    p.string(), actual.str(), outcome));
    return std::nullopt;
  }
  return bytes;
}

// Only the file that was read: another process may have renamed a good copy into its place
// since (fs::remove_if_unchanged leaves that one).
std::string Store::remove_damaged(const stdfs::path& p, int fd) const {
  struct stat st {};
  if (::fstat(fd, &st) == 0 && fs::remove_if_unchanged(p, root_ / "tmp", st)) return "removed it";
  return "did not remove it (replaced meanwhile, or not removable here: `kernel-hub verify` says "
         "whether it is still damaged)";
}

void Store::put_blob(const oci::Descriptor& desc, std::string_view bytes) {
  sweep_before_first_write();
  stdfs::path dest = blob_path(desc.digest);
  oci::verify_bytes(desc, bytes, "blob " + desc.digest.str());
  if (has_blob(desc.digest)) return;
  fs::TempFile tmp(root_ / "tmp", desc.digest.hex);
  tmp.write(bytes);
  tmp.commit(dest, 0444, /*keep_existing=*/true);
}

std::unique_ptr<BlobWriter> Store::begin_blob(const oci::Descriptor& desc) {
  sweep_before_first_write();
  stdfs::path dest = blob_path(desc.digest);
  if (desc.size < 0) {
    throw Error(ErrorKind::kInvalidInput,
                "blob " + desc.digest.str() + ": negative size in its descriptor");
  }
  require_free_space(static_cast<uint64_t>(desc.size), "blob " + desc.digest.str());
  return std::make_unique<StoreBlobWriter>(root_ / "tmp", dest, desc);
}

void Store::require_free_space(uint64_t bytes, const std::string& what) const {
  struct statvfs vfs;
  if (::statvfs((root_ / "tmp").c_str(), &vfs) != 0) return;
  const uint64_t free_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
  if (free_bytes < bytes)
    throw Error(ErrorKind::kIo, "not enough free space in " + root_.string() + " for " + what +
                                    ": need " + std::to_string(bytes) + " bytes, " +
                                    std::to_string(free_bytes) +
                                    " available; run `kernel-hub gc` or set KERNEL_HUB_CACHE");
}

fs::FileLock Store::lock(const std::string& key) {
  return fs::FileLock::acquire(root_ / "locks" / lock_file_name(key));
}

fs::FileLock Store::lock(const std::string& key, const fs::LockWait& wait) {
  return fs::FileLock::acquire(root_ / "locks" / lock_file_name(key), wait);
}

std::optional<fs::FileLock> Store::try_lock(const std::string& key) {
  return fs::FileLock::try_acquire(root_ / "locks" / lock_file_name(key));
}

std::optional<fs::FileLock> Store::claim_blob(const Digest& d, const fs::LockWait& wait) {
  if (has_blob(d)) return std::nullopt;
  fs::FileLock held = lock("blob-" + checked_hex(d), wait);
  if (has_blob(d)) return std::nullopt;  // stored by the process we waited for
  return held;
}

std::optional<fs::FileLock> Store::try_claim_blob(const Digest& d) {
  auto held = try_lock("blob-" + checked_hex(d));
  if (held && has_blob(d)) return std::nullopt;  // stored while we looked
  return held;
}

namespace {
stdfs::path ref_path(const stdfs::path& root, const std::string& hub_id, const std::string& repo,
                     const std::string& tag) {
  return root / "refs" / encode_component(hub_id, "hub id") / encode_component(repo, "repository") /
         encode_component(tag, "tag");
}

// refs/<hub>/<repo>/<tag>, each level one encoded component; hidden names are temp files.
// The record's own fields are trusted, not the path.
std::vector<std::pair<RefRecord, stdfs::path>> scan_ref_records(const stdfs::path& root) {
  std::vector<std::pair<RefRecord, stdfs::path>> out;
  stdfs::path refs = root / "refs";
  for (const auto& hub : list_names(refs)) {
    if (hub.starts_with(".")) continue;
    for (const auto& repo : list_names(refs / hub)) {
      if (repo.starts_with(".")) continue;
      for (const auto& tag : list_names(refs / hub / repo)) {
        if (tag.starts_with(".")) continue;
        stdfs::path p = refs / hub / repo / tag;
        std::optional<std::string> text;
        try {
          text = fs::read_file_if_exists(p, kMaxRefRecordBytes);
        } catch (const Error& e) {
          log_warning(fmt::format("ignoring unreadable ref record {} ({})", p.string(), e.what()));
          continue;
        }
        if (!text) continue;
        if (auto r = parse_ref_record(*text, p)) out.emplace_back(std::move(*r), p);
      }
    }
  }
  return out;
}
}  // namespace

void Store::write_ref(const RefRecord& r) {
  sweep_before_first_write();
  nlohmann::json j;
  j["hub_id"] = r.hub_id;
  j["repo"] = r.repo;
  j["tag"] = r.tag;
  j["digest"] = r.digest.str();
  j["resolved_at"] = r.resolved_at;
  checked_hex(r.digest);
  fs::write_file_atomic(ref_path(root_, r.hub_id, r.repo, r.tag), j.dump() + "\n", 0644);
}

std::optional<RefRecord> Store::read_ref(const std::string& hub_id, const std::string& repo,
                                         const std::string& tag) const {
  stdfs::path p = ref_path(root_, hub_id, repo, tag);
  std::optional<std::string> text;
  try {
    text = fs::read_file_if_exists(p, kMaxRefRecordBytes);
  } catch (const Error& e) {
    log_warning(fmt::format("ignoring unreadable ref record {} ({})", p.string(), e.what()));
    return std::nullopt;
  }
  if (!text) return std::nullopt;
  auto r = parse_ref_record(*text, p);
  if (r && (r->hub_id != hub_id || r->repo != repo || r->tag != tag)) {
    log_warning(fmt::format("ignoring ref record {}: it describes {} {}@{}", p.string(), r->hub_id,
                            r->repo, r->tag));
    return std::nullopt;
  }
  return r;
}

std::optional<std::string> Store::read_signatures(const Digest& index) const {
  checked_hex(index);
  try {
    return fs::read_file_if_exists(root_ / "signatures" / (index.hex + ".json"), 1 << 20);
  } catch (const Error&) {
    return std::nullopt;  // unreadable or oversized: as if absent (unsigned), never trusted
  }
}

void Store::write_signatures(const Digest& index, std::string_view set_json) {
  sweep_before_first_write();
  checked_hex(index);
  fs::make_dirs(root_ / "signatures");
  fs::write_file_atomic(root_ / "signatures" / (index.hex + ".json"), set_json, 0644);
}

std::optional<int64_t> Store::signatures_written_at_ns(const Digest& index) const {
  struct stat st;
  stdfs::path p = root_ / "signatures" / (checked_hex(index) + ".json");
  if (::lstat(p.c_str(), &st) != 0) return std::nullopt;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

std::vector<RefRecord> Store::list_refs() const {
  std::vector<RefRecord> out;
  for (auto& [record, path] : scan_ref_records(root_)) out.push_back(std::move(record));
  return out;
}

std::optional<stdfs::path> Store::unpacked_path(const Digest& layer) const {
  stdfs::path p = root_ / "unpacked" / checked_hex(layer);
  struct stat st;
  if (::lstat(p.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return p;
  return std::nullopt;
}

stdfs::path Store::unpack(const Digest& layer, const ArchiveLimits& limits, UnpackBudget* budget) {
  if (auto p = unpacked_path(layer)) return *p;
  sweep_before_first_write();
  fs::FileLock held = lock("unpack-" + checked_hex(layer));
  if (auto p = unpacked_path(layer)) return *p;  // another process finished while we waited
  if (!has_blob(layer)) {
    throw Error(ErrorKind::kNotFound, "cannot unpack layer " + layer.str() +
                                          ": the blob is not in the cache at " + root_.string() +
                                          "; pull the package first");
  }
  stdfs::path blob = blob_path(layer);
  // The blob was verified when stored; check again so that a damaged disk never yields code.
  // Opened once: what is extracted below is this descriptor's inode (/proc/self/fd/N), not
  // whatever the name points to after the check.
  fs::Fd blob_fd = fs::open_file(blob);
  Digest actual = sha256_of_fd(blob_fd.get(), blob);
  if (actual != layer) {
    const std::string outcome = remove_damaged(blob, blob_fd.get());
    throw Error(ErrorKind::kIntegrity, "cache entry " + blob.string() +
                                           " is damaged (content hashes to " + actual.str() +
                                           "); " + outcome + ", pull the package again");
  }
  stdfs::path dir = root_ / "unpacked";
  // By descriptor: unpacked/ is opened without following links, and the tree is written and
  // renamed through that descriptor (/proc/self/fd/N names the very directory that was opened),
  // so a link planted at unpacked/ cannot redirect the extraction out of the cache.
  std::optional<fs::Fd> dir_fd = fs::open_dir(dir, true);
  if (!dir_fd) throw Error(ErrorKind::kIo, "cannot open " + dir.string());
  const std::string tmp_name =
      "." + layer.hex + "." + std::to_string(::getpid()) + "." + fs::random_hex(12);
  stdfs::path tmp = dir / tmp_name;
  stdfs::path dest = dir / layer.hex;
  try {
    extract_archive(stdfs::path("/proc/self/fd") / std::to_string(blob_fd.get()),
                    stdfs::path("/proc/self/fd") / std::to_string(dir_fd->get()) / tmp_name, limits,
                    budget);
  } catch (const Error& e) {
    throw Error(e.kind(), "cannot unpack layer " + layer.str() + ": " + e.what());
  }
  if (::renameat2(dir_fd->get(), tmp_name.c_str(), dir_fd->get(), layer.hex.c_str(),
                  RENAME_NOREPLACE) != 0) {
    int e = errno;
    fs::remove_tree(tmp);
    // Lost a race with a process that ignored or could not take the lock: theirs is as good.
    if ((e == EEXIST || e == ENOTEMPTY) && unpacked_path(layer)) return dest;
    errno = e;
    throw_errno("cannot move unpacked layer to " + dest.string());
  }
  fs::fsync_dir(dir);
  return dest;
}

std::vector<StoreEntryDamage> Store::verify() const {
  std::vector<StoreEntryDamage> out;
  stdfs::path blobs = root_ / "blobs";
  for (const auto& name : list_names(blobs)) {
    if (name != "sha256") out.push_back({blobs / name, "stray entry (only sha256/ belongs here)"});
  }
  stdfs::path dir = blobs / "sha256";
  for (const auto& name : list_names(dir)) {
    stdfs::path p = dir / name;
    struct stat st;
    if (::lstat(p.c_str(), &st) != 0) continue;  // removed meanwhile
    if (!S_ISREG(st.st_mode)) {
      out.push_back({p, "stray entry: not a regular file"});
      continue;
    }
    if (!is_blob_hex(name)) {
      out.push_back({p, "stray file: name is not a sha256 digest"});
      continue;
    }
    try {
      Digest actual = sha256_of_file(p);
      if (actual.hex != name) {
        out.push_back({p, "damaged: content hashes to " + actual.str()});
      }
    } catch (const Error& e) {
      out.push_back({p, std::string("unreadable: ") + e.what()});
    }
  }
  stdfs::path unpacked = root_ / "unpacked";
  for (const auto& name : list_names(unpacked)) {
    if (name.starts_with(".")) continue;  // in-flight extraction
    stdfs::path p = unpacked / name;
    if (!is_blob_hex(name) || !stdfs::is_directory(stdfs::symlink_status(p))) {
      out.push_back({p, "stray entry: not an unpacked layer directory"});
    }
  }
  return out;
}

uint64_t Store::blobs_size() const {
  uint64_t total = 0;
  stdfs::path dir = root_ / "blobs" / "sha256";
  for (const auto& name : list_names(dir)) {
    struct stat st;
    if (::lstat((dir / name).c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      total += static_cast<uint64_t>(st.st_size);
    }
  }
  return total;
}

// The cache size that max_size bounds is blobs plus unpacked trees (both removable here).
GcResult Store::gc(const GcOptions& options) {
  GcResult result;
  const int64_t now = now_s();
  // Whether something last used at `t` is past the grace period. A grace of 0 means everything:
  // a file's timestamp can read a second ahead of the coarse clock `now` comes from (as in
  // sweep_stale), so "now - t >= 0" is not a given.
  auto past_grace = [&](int64_t t) { return options.grace_s <= 0 || now - t >= options.grace_s; };
  auto young = [&](const stdfs::path& p) {
    auto t = touched_at(p);
    return !t || !past_grace(*t);
  };

  // Ref records, with their last use.
  std::vector<RefEntry> refs;
  for (auto& [record, path] : scan_ref_records(root_)) {
    RefEntry e;
    e.path = path;
    e.last_used = std::max(record.resolved_at, touched_at(path).value_or(0));
    e.record = std::move(record);
    refs.push_back(std::move(e));
  }
  std::sort(refs.begin(), refs.end(), [](const RefEntry& a, const RefEntry& b) {
    return a.last_used < b.last_used;  // oldest first
  });

  std::vector<RefEntry> dropped;
  auto drop_ref = [&](RefEntry e) { dropped.push_back(std::move(e)); };
  if (options.older_than_s) {
    std::vector<RefEntry> kept;
    for (auto& e : refs) {
      bool old = now - e.last_used > *options.older_than_s;
      if (old && past_grace(e.last_used)) {
        drop_ref(std::move(e));
      } else {
        kept.push_back(std::move(e));
      }
    }
    refs = std::move(kept);
  }

  // Candidate entries with their sizes; removal is simulated in memory (dry_run) then applied.
  struct Entry {
    stdfs::path path;
    uint64_t size = 0;
    bool young = false;
    bool removed = false;
  };
  std::map<std::string, Entry> blobs;
  std::map<std::string, Entry> trees;
  stdfs::path blob_dir = root_ / "blobs" / "sha256";
  for (const auto& name : list_names(blob_dir)) {
    if (!is_blob_hex(name)) continue;  // strays are verify()'s business
    Entry e;
    e.path = blob_dir / name;
    struct stat st;
    if (::lstat(e.path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    e.size = static_cast<uint64_t>(st.st_size);
    e.young = young(e.path);
    blobs.emplace(name, std::move(e));
  }
  stdfs::path tree_dir = root_ / "unpacked";
  for (const auto& name : list_names(tree_dir)) {
    if (!is_blob_hex(name)) continue;
    Entry e;
    e.path = tree_dir / name;
    e.size = tree_size(e.path);
    e.young = young(e.path);
    trees.emplace(name, std::move(e));
  }

  auto sweep_unreachable = [&]() {
    std::set<std::string> live_blobs, live_trees;
    for (const auto& r : refs) {
      mark_reachable(*this, r, options.graph_limits, live_blobs, live_trees);
    }
    for (auto* table : {&blobs, &trees}) {
      const auto& live = table == &blobs ? live_blobs : live_trees;
      for (auto& [hex, e] : *table) {
        if (e.removed || e.young || live.contains(hex)) continue;
        e.removed = true;
        result.removed_bytes += e.size;
        ++result.removed_entries;
      }
    }
  };
  auto kept_size = [&]() {
    uint64_t total = 0;
    for (auto* table : {&blobs, &trees}) {
      for (const auto& [hex, e] : *table) {
        if (!e.removed) total += e.size;
      }
    }
    return total;
  };

  sweep_unreachable();
  if (options.max_size) {
    // LRU: drop the least recently used ref, sweep what only it needed, until small enough.
    while (kept_size() > *options.max_size && !refs.empty() && past_grace(refs.front().last_used)) {
      drop_ref(std::move(refs.front()));
      refs.erase(refs.begin());
      sweep_unreachable();
    }
  }
  result.kept_bytes = kept_size();
  result.removed_entries += dropped.size();

  if (!options.dry_run) {
    // Every removal through descriptors opened without following links (fs::remove_tree): a
    // directory of the path swapped for a link after the scan cannot aim it outside the cache
    // (the removal is refused, naming the link).
    for (const auto& e : dropped) {
      fs::remove_tree(e.path);
      // Empty repo and hub directories go too.
      fs::remove_empty_dir(e.path.parent_path());
      fs::remove_empty_dir(e.path.parent_path().parent_path());
    }
    // Trees first: an unpacked layer without its blob is useless, the reverse is not.
    for (auto& [hex, e] : trees) {
      if (e.removed) fs::remove_tree(e.path);
    }
    for (auto& [hex, e] : blobs) {
      if (e.removed) fs::remove_tree(e.path);
    }
  }
  // Temp files of dead processes (a live download keeps its temp's mtime fresh).
  result.removed_entries +=
      sweep_stale(root_ / "tmp", false, options.grace_s, options.dry_run, &result.removed_bytes);
  result.removed_entries += sweep_stale(root_ / "unpacked", true, options.grace_s, options.dry_run,
                                        &result.removed_bytes);
  return result;
}

}  // namespace kh
