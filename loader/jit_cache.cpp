#include "loader/jit_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/base/guarded_root.h"
#include "hub/base/log.h"

namespace kh {

namespace {

// 8 bytes; the \r\n and \x1a catch text-mode and truncating transfers, like PNG's signature.
constexpr char kMagic[8] = {'K', 'H', 'J', 'I', 'T', '\r', '\n', '\x1a'};
constexpr uint64_t kMaxEntrySize = uint64_t{1} << 30;

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_le(std::string_view in, size_t offset, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i)
    v |= uint64_t{static_cast<unsigned char>(in[offset + i])} << (8 * i);
  return v;
}

// Length-prefixed field: u64 size + bytes, so no two tuples hash the same stream.
void field(Sha256& h, std::string_view bytes) {
  std::string len;
  put_u64(len, bytes.size());
  h.update(len);
  h.update(bytes);
}

std::string raw_sha256(std::string_view payload) {
  Digest d = sha256_of(payload);
  std::string raw;
  for (size_t i = 0; i < d.hex.size(); i += 2)
    raw.push_back(static_cast<char>(std::stoi(d.hex.substr(i, 2), nullptr, 16)));
  return raw;
}

// The shared mode: the cache's root is guarded as shared, or (a directory under no guarded root)
// KERNEL_HUB_SHARED_CACHE asks for it.
bool shared_mode(const std::filesystem::path& dir) {
  if (auto root = fs::guarded_root_of(dir)) return root->sharing == fs::Sharing::kShared;
  return fs::cache_sharing_from_env() == fs::Sharing::kShared;
}

// Opens the per-user directory (created when missing) and checks through its descriptor that
// this user owns it and no one else may write it; made 0700 when it is ours but looser.
fs::Fd open_private_dir(const std::filesystem::path& dir) {
  std::optional<fs::Fd> fd = fs::open_dir(dir, /*create=*/true);
  if (!fd) throw_errno("cannot open the JIT cache directory " + dir.string());
  struct stat st {};
  if (::fstat(fd->get(), &st) != 0) throw_errno("cannot stat " + dir.string());
  if (st.st_uid != ::geteuid()) {
    throw Error(ErrorKind::kRefused,
                fmt::format("the JIT cache directory {} is owned by uid {}, not by you (uid {}): "
                            "in a shared cache each user's compiled device code lives in a "
                            "directory only that user can write, and kernel-hub will not load "
                            "code another user could have placed. Remove {} (another member of "
                            "the cache's group renamed or made it)",
                            dir.string(), st.st_uid, ::geteuid(), dir.string()));
  }
  if ((st.st_mode & 077) != 0 && ::fchmod(fd->get(), 0700) != 0)
    throw_errno("cannot make the JIT cache directory " + dir.string() + " private");
  return std::move(*fd);
}

}  // namespace

Digest jit_cache_key(const JitKeyInput& in) {
  Sha256 h;
  field(h, "kernel-hub jit key");
  field(h, std::to_string(kJitKeyFormatVersion));
  field(h, std::to_string(in.abi_major));
  field(h, in.source);
  auto headers = in.headers;
  std::sort(headers.begin(), headers.end());
  field(h, std::to_string(headers.size()));
  for (const auto& [name, contents] : headers) {
    field(h, name);
    field(h, contents);
  }
  auto options = in.options;
  std::sort(options.begin(), options.end());
  field(h, std::to_string(options.size()));
  for (const auto& o : options) field(h, o);
  field(h, fmt::format("{}.{}", in.nvrtc_major, in.nvrtc_minor));
  field(h, in.target);
  return h.finish();
}

std::string encode_jit_entry(std::string_view payload) {
  std::string out(kMagic, sizeof(kMagic));
  put_u32(out, kJitEntryFormatVersion);
  put_u32(out, 0);
  put_u64(out, payload.size());
  out += raw_sha256(payload);
  out += payload;
  return out;
}

std::optional<std::string> decode_jit_entry(std::string_view entry, std::string* why) {
  auto fail = [&](std::string text) -> std::optional<std::string> {
    if (why) *why = std::move(text);
    return std::nullopt;
  };
  if (entry.size() < kJitEntryHeaderSize)
    return fail(fmt::format("truncated: {} bytes, shorter than the {}-byte header", entry.size(),
                            kJitEntryHeaderSize));
  if (std::memcmp(entry.data(), kMagic, sizeof(kMagic)) != 0) return fail("bad magic");
  uint64_t version = get_le(entry, 8, 4);
  if (version != kJitEntryFormatVersion)
    return fail(fmt::format("format version {} (expected {})", version, kJitEntryFormatVersion));
  if (get_le(entry, 12, 4) != 0) return fail("reserved header field is not zero");
  uint64_t size = get_le(entry, 16, 8);
  if (size != entry.size() - kJitEntryHeaderSize)
    return fail(fmt::format("payload size {} in the header but {} bytes present", size,
                            entry.size() - kJitEntryHeaderSize));
  std::string_view payload = entry.substr(kJitEntryHeaderSize);
  if (raw_sha256(payload) != entry.substr(24, 32)) return fail("payload sha256 mismatch");
  return std::string(payload);
}

JitCache::JitCache(const std::filesystem::path& dir)
    : dir_(std::filesystem::absolute(dir)), per_user_(shared_mode(dir_)) {
  // Beneath the cache a Store guards, it is covered; alone (a process that JIT-compiles without
  // having opened the cache: the device API, a local package's bind), it is guarded itself, so
  // that no link in it is followed and a directory others may write is refused.
  if (!fs::guarded_root_of(dir_)) fs::guard_root(dir_, fs::cache_sharing_from_env(), "JIT cache");
  if (per_user_) dir_ /= "u" + std::to_string(::geteuid());
}

std::filesystem::path JitCache::entry_path(const Digest& key) const {
  return dir_ / (key.hex + ".cubin");
}

// Shared mode: the entry read relative to the checked private directory, a regular file this user
// owns; a foreign, special or oversized file is removed (the directory is ours) and is a miss.
std::optional<std::string> JitCache::read_private_entry(const Digest& key) const {
  fs::Fd dir = open_private_dir(dir_);
  const std::string name = key.hex + ".cubin";
  fs::Fd fd(::openat(dir.get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  if (!fd) {
    if (errno == ENOENT) return std::nullopt;
    if (errno != ELOOP) throw_errno("cannot open " + entry_path(key).string());
  }
  struct stat st {};
  std::string foreign;
  if (!fd) {
    foreign = "a symbolic link";
  } else if (::fstat(fd.get(), &st) != 0) {
    throw_errno("cannot stat " + entry_path(key).string());
  } else if (!S_ISREG(st.st_mode) || st.st_uid != ::geteuid()) {
    foreign = fmt::format("a {} owned by uid {}", fs::file_type_name(st.st_mode), st.st_uid);
  } else if (static_cast<uint64_t>(st.st_size) > kMaxEntrySize) {
    foreign = fmt::format("{} bytes, over the limit of {}", st.st_size, kMaxEntrySize);
  }
  if (!foreign.empty()) {
    log_line(kLogWarn, fmt::format("JIT cache entry {} is not one of yours ({}); deleting and "
                                   "rebuilding it",
                                   entry_path(key).string(), foreign));
    ::unlinkat(dir.get(), name.c_str(), 0);
    return std::nullopt;
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd.get(), out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw_errno("cannot read " + entry_path(key).string());
    if (n == 0) break;
    got += static_cast<size_t>(n);
  }
  out.resize(got);
  return out;
}

std::optional<std::string> JitCache::read_entry(const Digest& key) const {
  if (per_user_) return read_private_entry(key);
  return fs::read_file_if_exists(entry_path(key), kMaxEntrySize);
}

std::optional<std::string> JitCache::lookup(const Digest& key) const {
  std::filesystem::path path = entry_path(key);
  std::optional<std::string> bytes;
  try {
    bytes = read_entry(key);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kRefused && per_user_) throw;  // not our directory: say so
    log_line(kLogWarn, fmt::format("JIT cache entry {} unreadable ({}); rebuilding it",
                                   path.string(), e.what()));
    fs::remove_tree(path);  // no link followed on the way
    return std::nullopt;
  }
  if (!bytes) return std::nullopt;
  std::string why;
  auto payload = decode_jit_entry(*bytes, &why);
  if (!payload) {
    log_line(kLogWarn, fmt::format("JIT cache entry {} is damaged ({}); deleting and "
                                   "rebuilding it",
                                   path.string(), why));
    fs::remove_tree(path);  // no link followed on the way
  }
  return payload;
}

void JitCache::store(const Digest& key, std::string_view payload) const {
  if (per_user_) open_private_dir(dir_);  // created private before anything is written in it
  fs::TempFile tmp(dir_, key.hex);
  tmp.write(encode_jit_entry(payload));
  tmp.commit(entry_path(key), 0644);
}

JitCache::Result JitCache::get_or_build(const Digest& key,
                                        const std::function<std::string()>& build) const {
  if (auto hit = lookup(key)) return {std::move(*hit), false};
  fs::FileLock lock = fs::FileLock::acquire(dir_ / "locks" / (key.hex + ".lock"));
  if (auto hit = lookup(key)) return {std::move(*hit), false};  // another process built it
  Result r{build(), true};
  try {
    store(key, r.payload);
  } catch (const Error& e) {  // a full or read-only disk costs a rebuild later, nothing more
    log_line(kLogWarn, fmt::format("JIT cache: could not store {} ({}); continuing without "
                                   "caching it",
                                   entry_path(key).string(), e.what()));
  }
  return r;
}

}  // namespace kh
