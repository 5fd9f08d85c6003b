#include "loader/jit_cache.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "hub/base/error.h"
#include "hub/base/fs.h"
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

JitCache::JitCache(std::filesystem::path dir) : dir_(std::move(dir)) {}

std::filesystem::path JitCache::entry_path(const Digest& key) const {
  return dir_ / (key.hex + ".cubin");
}

std::optional<std::string> JitCache::lookup(const Digest& key) const {
  std::filesystem::path path = entry_path(key);
  std::optional<std::string> bytes;
  try {
    bytes = fs::read_file_if_exists(path, kMaxEntrySize);
  } catch (const Error& e) {
    log_line(kLogWarn, fmt::format("JIT cache entry {} unreadable ({}); rebuilding it",
                                   path.string(), e.what()));
    ::unlink(path.c_str());
    return std::nullopt;
  }
  if (!bytes) return std::nullopt;
  std::string why;
  auto payload = decode_jit_entry(*bytes, &why);
  if (!payload) {
    log_line(kLogWarn, fmt::format("JIT cache entry {} is damaged ({}); deleting and "
                                   "rebuilding it",
                                   path.string(), why));
    ::unlink(path.c_str());
  }
  return payload;
}

void JitCache::store(const Digest& key, std::string_view payload) const {
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
