#include "loader/device_pool.h"

#include <algorithm>
#include <bit>
#include <utility>

#include <fmt/format.h>

#include "hub/base/error.h"

namespace kh {

size_t CachingPool::size_class(size_t bytes) {
  constexpr size_t kSmall = 4096;
  if (bytes <= kSmall)
    return std::max<size_t>(kMinBlock, (bytes + kMinBlock - 1) / kMinBlock * kMinBlock);
  const size_t power = std::bit_floor(bytes);
  const size_t step = power / 4;
  return (bytes + step - 1) / step * step;
}

CachingPool::CachingPool(std::string label, Backing backing)
    : label_(std::move(label)), backing_(std::move(backing)) {}

CachingPool::~CachingPool() {
  for (const auto& [address, block] : blocks_) backing_.release(address);
}

uint64_t CachingPool::allocate(size_t bytes) {
  if (bytes == 0)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{}: allocation of 0 bytes; ask for at least one byte", label_));
  const size_t size = size_class(bytes);
  std::lock_guard lock(mutex_);
  if (auto it = cached_.find(size); it != cached_.end() && !it->second.empty()) {
    const uint64_t address = it->second.back();
    it->second.pop_back();
    Block& b = blocks_.at(address);
    b.live = true;
    b.requested = bytes;
    stats_.cached_bytes -= size;
    stats_.current_bytes += size;
    stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
    ++stats_.allocations;
    ++stats_.reuses;
    return address;
  }
  bool out_of_memory = false;
  uint64_t address = 0;
  try {
    address = backing_.allocate(size, out_of_memory);
  } catch (const Error& e) {
    if (!out_of_memory || stats_.cached_bytes == 0)
      throw Error(e.kind(), fmt::format("{}: allocating {} bytes ({} with rounding; {} bytes in "
                                        "use, {} cached): {}",
                                        label_, bytes, size, stats_.current_bytes,
                                        stats_.cached_bytes, e.what()));
    trim_locked();  // cached blocks of other classes may make room
    address = backing_.allocate(size, out_of_memory);
  }
  blocks_[address] = Block{size, bytes, true};
  ++stats_.backing_allocations;
  ++stats_.allocations;
  stats_.reserved_bytes += size;
  stats_.current_bytes += size;
  stats_.peak_bytes = std::max(stats_.peak_bytes, stats_.current_bytes);
  return address;
}

const CachingPool::Block* CachingPool::containing(uint64_t address, uint64_t& base) const {
  auto it = blocks_.upper_bound(address);
  if (it == blocks_.begin()) return nullptr;
  --it;
  if (address >= it->first + it->second.size) return nullptr;
  base = it->first;
  return &it->second;
}

void CachingPool::free(uint64_t address) {
  std::lock_guard lock(mutex_);
  auto it = blocks_.find(address);
  if (it == blocks_.end()) {
    uint64_t base = 0;
    if (containing(address, base))
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("{}: free of 0x{:x}, which points {} bytes into the block at 0x{:x}; "
                              "free the address the allocation returned",
                              label_, address, address - base, base));
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{}: free of 0x{:x}, which this pool never handed out (another "
                            "pool's, or not device memory of this pool); free it where it was "
                            "allocated",
                            label_, address));
  }
  Block& b = it->second;
  if (!b.live)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{}: double free of 0x{:x} ({} bytes): the block was already freed",
                            label_, address, b.requested));
  b.live = false;
  cached_[b.size].push_back(address);
  stats_.current_bytes -= b.size;
  stats_.cached_bytes += b.size;
}

bool CachingPool::check_range(uint64_t address, size_t bytes, const std::string& what) const {
  std::lock_guard lock(mutex_);
  uint64_t base = 0;
  const Block* b = containing(address, base);
  if (!b) return false;
  if (!b->live)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{}: {} 0x{:x}: the block at 0x{:x} was freed (use after free)", label_,
                            what, address, base));
  const uint64_t end = base + b->requested;
  if (bytes > end - address)
    throw Error(
        ErrorKind::kInvalidInput,
        fmt::format("{}: {} of {} bytes at 0x{:x} runs past the end of its allocation "
                    "(0x{:x}, {} bytes) by {} bytes",
                    label_, what, bytes, address, base, b->requested, bytes - (end - address)));
  return true;
}

uint64_t CachingPool::trim_locked() {
  uint64_t released = 0;
  for (auto& [size, list] : cached_) {
    for (uint64_t address : list) {
      backing_.release(address);
      blocks_.erase(address);
      released += size;
    }
    list.clear();
  }
  cached_.clear();
  stats_.cached_bytes -= released;
  stats_.reserved_bytes -= released;
  return released;
}

uint64_t CachingPool::trim() {
  std::lock_guard lock(mutex_);
  return trim_locked();
}

PoolStats CachingPool::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

size_t CachingPool::live_blocks() const {
  std::lock_guard lock(mutex_);
  size_t n = 0;
  for (const auto& [address, block] : blocks_) n += block.live;
  return n;
}

}  // namespace kh
