// Wall-clock time in unix seconds, for what is compared with other machines' clocks or kept on
// disk: ref record ages, signature serials and expiry, mirror timestamps.
#pragma once

#include <chrono>
#include <cstdint>

namespace kh {

inline int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace kh
