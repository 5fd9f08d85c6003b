// The device API's memory pool (kh_device_pool_*, kernel_hub.h): a caching allocator. Requests
// are rounded up to a size class; a freed block goes to its class's free list and serves the next
// request of that class without a driver call; the backing allocation (cuMemAlloc) runs only on
// a miss, and when it fails for lack of memory the cached blocks are released and it is tried
// once more. Why not the driver's stream-ordered pools (cuMemAllocAsync): the runtime captures
// its steps in CUDA graphs, and a captured cuMemAllocAsync becomes a graph allocation node whose
// address the graph owns; blocks of this pool keep their addresses across replays, and reusing a
// cached block needs no driver call, so it is allowed during a capture.
//
// Ordering: a block freed while kernels on a stream still use it may be handed out again at
// once. That is safe when every user of the pool's blocks runs on one stream (the runtime's)
// or the caller synchronizes before freeing; the pool records no streams.
//
// CachingPool knows nothing of CUDA (its backing is two functions), so its rules are tested on
// the CPU: rounding, reuse, statistics, and the refusals (double free, a pointer the pool never
// handed out, a range past a block's end, a freed block).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace kh {

struct PoolStats {
  uint64_t current_bytes = 0;   // in blocks handed out (size classes)
  uint64_t peak_bytes = 0;      // the largest current_bytes so far
  uint64_t reserved_bytes = 0;  // held from the backing: handed out + cached
  uint64_t cached_bytes = 0;    // freed, kept for reuse
  uint64_t allocations = 0;     // allocate calls that succeeded
  uint64_t reuses = 0;          // of those, served from the cache
  uint64_t backing_allocations = 0;
};

class CachingPool {
 public:
  // `allocate` returns the address of `bytes` new bytes or throws kh::Error, setting
  // `out_of_memory` when a retry after releasing the cache may succeed.
  struct Backing {
    std::function<uint64_t(size_t bytes, bool& out_of_memory)> allocate;
    std::function<void(uint64_t address)> release;  // must not throw
  };

  // `label` names the pool in messages ("device pool on CUDA device 0").
  CachingPool(std::string label, Backing backing);
  // Releases every block, cached or handed out.
  ~CachingPool();
  CachingPool(const CachingPool&) = delete;
  CachingPool& operator=(const CachingPool&) = delete;

  // Blocks are at least this large and aligned to it (the backing aligns more: cuMemAlloc 256 B;
  // 512 B keeps vectorized accesses and TMA happy).
  static constexpr size_t kMinBlock = 512;
  // The size class of a request: multiples of 512 B up to 4 KiB, then four classes per power of
  // two (2^k, 1.25, 1.5, 1.75 x 2^k), so rounding wastes less than a quarter.
  static size_t size_class(size_t bytes);

  // A block of at least `bytes` (> 0, else kInvalidInput).
  uint64_t allocate(size_t bytes);
  // Returns a block to the cache. kInvalidInput for a double free, an interior pointer or a
  // pointer this pool never handed out (the message says which).
  void free(uint64_t address);
  // Whether [address, address + bytes) lies in one of this pool's blocks: false when no block of
  // the pool contains `address`; true when a live block holds the whole range; kInvalidInput when
  // the range runs past the block's end or the block was freed. `what` names the access.
  bool check_range(uint64_t address, size_t bytes, const std::string& what) const;
  // Releases the cached blocks to the backing; returns the bytes released.
  uint64_t trim();
  PoolStats stats() const;
  const std::string& label() const { return label_; }
  // Blocks handed out and not freed.
  size_t live_blocks() const;

 private:
  struct Block {
    size_t size = 0;       // the size class
    size_t requested = 0;  // what the caller asked for (the last time it was handed out)
    bool live = false;
  };
  uint64_t trim_locked();
  const Block* containing(uint64_t address, uint64_t& base) const;

  std::string label_;
  Backing backing_;
  mutable std::mutex mutex_;
  std::map<uint64_t, Block> blocks_;                // by address: every block the pool holds
  std::map<size_t, std::vector<uint64_t>> cached_;  // free lists by size class
  PoolStats stats_;
};

}  // namespace kh
