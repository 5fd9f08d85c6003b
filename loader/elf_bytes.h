// The checked byte view the ELF reader parses untrusted files through: every read is bounds
// checked against the buffer and every string is bounded, so malformed input can only make a
// read fail, never reach outside the span. Internal to loader/elf_*.cpp.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>

namespace kh::elf::detail {

// Upper bound on one string's length; it bounds work on hostile input.
constexpr uint64_t kMaxStringLength = 1u << 16;

class Reader {
 public:
  explicit Reader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  // Whether [offset, offset + size) lies inside the buffer (no overflow for any inputs).
  bool fits(uint64_t offset, uint64_t size) const {
    return offset <= bytes_.size() && size <= bytes_.size() - offset;
  }

  template <typename T>
  bool read(uint64_t offset, T& out) const {
    static_assert(std::is_trivially_copyable_v<T>);
    if (!fits(offset, sizeof(T))) return false;
    std::memcpy(&out, bytes_.data() + offset, sizeof(T));
    return true;
  }

  // A NUL-terminated string at `offset` inside [begin, begin + size).
  bool string_in(uint64_t begin, uint64_t size, uint64_t offset, std::string& out) const {
    if (!fits(begin, size) || offset >= size) return false;
    const uint8_t* start = bytes_.data() + begin + offset;
    uint64_t room = std::min<uint64_t>(size - offset, kMaxStringLength);
    const void* nul = std::memchr(start, 0, room);
    if (!nul) return false;
    out.assign(reinterpret_cast<const char*>(start), static_cast<const uint8_t*>(nul) - start);
    return true;
  }

  uint64_t size() const { return bytes_.size(); }

 private:
  std::span<const uint8_t> bytes_;
};

// A string table as a file range: [offset, offset + size).
struct StringTable {
  uint64_t offset = 0;
  uint64_t size = 0;
};

}  // namespace kh::elf::detail
