// Fuzz target: lock files are shared between machines and edited by hand.
#include <cstddef>
#include <cstdint>
#include <string>

#include "hub/base/error.h"
#include "registry/lock_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  kh::LockFile lock;
  try {
    lock = kh::LockFile::parse(text);
  } catch (const kh::Error&) {
    return 0;
  }
  // What parses serializes to a canonical form that parses to the same lock.
  std::string once = lock.serialize();
  kh::LockFile again;
  try {
    again = kh::LockFile::parse(once);
  } catch (const kh::Error&) {
    __builtin_trap();
  }
  if (again.serialize() != once) __builtin_trap();
  for (auto& e : lock.entries)
    if (lock.find(e.ref) == nullptr) __builtin_trap();
  return 0;
}
