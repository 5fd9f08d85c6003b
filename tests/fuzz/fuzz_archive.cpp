// Fuzz target: package archives are untrusted until extracted under our limits. Whatever the
// bytes, extraction either succeeds inside dest or fails leaving nothing at all, and reading one
// member agrees with what extraction wrote.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

#include "hub/base/error.h"
#include "hub/store/archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path root = [] {
    char templ[] = "/tmp/kh-fuzz-archive.XXXXXX";
    return std::filesystem::path(mkdtemp(templ));
  }();
  auto input = root / "in.tar";
  auto dest = root / "out";
  {
    std::ofstream f(input, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  kh::ArchiveLimits limits;
  limits.max_total_bytes = 1 << 20;
  limits.max_entries = 64;
  bool ok = true;
  try {
    kh::extract_archive(input, dest, limits);
  } catch (const kh::Error&) {
    ok = false;
  }
  std::error_code ec;
  if (!ok && std::filesystem::exists(dest, ec)) __builtin_trap();  // refused: nothing left
  // Nothing may appear beside dest.
  for (auto& e : std::filesystem::directory_iterator(root)) {
    auto name = e.path().filename();
    if (name != "in.tar" && name != "out") __builtin_trap();
  }
  if (ok) {
    // What read_archive_member reads (kernel.json's digest for an old index) is what extraction
    // wrote: the two apply one set of path rules.
    std::optional<std::string> member;
    try {
      member = kh::read_archive_member(input, "kernel.json", 1 << 20, limits);
    } catch (const kh::Error&) {
      __builtin_trap();  // extraction accepted what the reader refused
    }
    std::error_code missing;
    const bool written = std::filesystem::is_regular_file(dest / "kernel.json", missing);
    if (member.has_value() != written) __builtin_trap();
    if (written) {
      std::ifstream f(dest / "kernel.json", std::ios::binary);
      std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
      if (bytes != *member) __builtin_trap();
    }
    for (auto it = std::filesystem::recursive_directory_iterator(dest, ec);
         it != std::filesystem::recursive_directory_iterator(); ++it) {
      if (it->is_directory())
        std::filesystem::permissions(it->path(), std::filesystem::perms::owner_all,
                                     std::filesystem::perm_options::add);
    }
    std::filesystem::permissions(dest, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::add, ec);
    std::filesystem::remove_all(dest, ec);
  }
  return 0;
}
