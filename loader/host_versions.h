// The newest symbol versions this host's libc and libstdc++ provide (GLIBC_2.36, GLIBCXX_3.4.30,
// CXXABI_1.3.13, ...), read from the version definitions of the copies already loaded in this
// process, and the comparison of a package's version needs against them.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kh {

// "GLIBCXX_3.4.30" -> {"GLIBCXX", {3, 4, 30}}; nullopt when the name is not PREFIX_N(.N)*.
struct SymbolVersion {
  std::string prefix;
  std::vector<unsigned> numbers;
  static std::optional<SymbolVersion> parse(const std::string& name);
  std::string str() const;
  friend bool operator<(const SymbolVersion& a, const SymbolVersion& b) {
    return a.numbers < b.numbers;
  }
};

struct HostVersions {
  // Highest version per prefix ("GLIBC", "GLIBCXX", "CXXABI"), and which library provides it.
  std::map<std::string, SymbolVersion> max;
  std::map<std::string, std::string> provider;  // prefix -> library path

  // Versions of this process's libc.so.6 and libstdc++.so.6 (found via dl_iterate_phdr),
  // computed once. Libraries not loaded leave their prefixes absent.
  static const HostVersions& current();
  // Reads the version definitions of the given shared objects.
  static HostVersions from_libraries(const std::vector<std::string>& paths);
};

}  // namespace kh
