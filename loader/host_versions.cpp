#include "loader/host_versions.h"

#include <link.h>

#include <charconv>
#include <cstring>
#include <string_view>

#include "hub/base/fs.h"
#include "loader/elf_reader.h"

namespace kh {

namespace {

// The prefixes whose needs the preflight compares against this host.
constexpr const char* kCheckedPrefixes[] = {"GLIBC", "GLIBCXX", "CXXABI"};

bool has_basename(std::string_view path, std::string_view base) {
  return path.size() >= base.size() && path.substr(path.size() - base.size()) == base &&
         (path.size() == base.size() || path[path.size() - base.size() - 1] == '/');
}

std::vector<std::string> loaded_runtime_libraries() {
  std::vector<std::string> found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        auto* out = static_cast<std::vector<std::string>*>(data);
        std::string_view name = info->dlpi_name ? info->dlpi_name : "";
        if (has_basename(name, "libc.so.6") || has_basename(name, "libstdc++.so.6"))
          out->emplace_back(name);
        return 0;
      },
      &found);
  return found;
}

}  // namespace

std::optional<SymbolVersion> SymbolVersion::parse(const std::string& name) {
  auto us = name.rfind('_');
  if (us == std::string::npos || us == 0 || us + 1 >= name.size()) return std::nullopt;
  SymbolVersion v;
  v.prefix = name.substr(0, us);
  std::string_view rest(name);
  rest.remove_prefix(us + 1);
  while (!rest.empty()) {
    unsigned n = 0;
    auto [p, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), n);
    if (ec != std::errc() || p == rest.data()) return std::nullopt;
    v.numbers.push_back(n);
    rest.remove_prefix(p - rest.data());
    if (rest.empty()) break;
    if (rest.front() != '.' || rest.size() == 1) return std::nullopt;
    rest.remove_prefix(1);
  }
  return v;
}

std::string SymbolVersion::str() const {
  std::string s = prefix + "_";
  for (size_t i = 0; i < numbers.size(); ++i) {
    if (i) s += '.';
    s += std::to_string(numbers[i]);
  }
  return s;
}

HostVersions HostVersions::from_libraries(const std::vector<std::string>& paths) {
  HostVersions hv;
  for (const auto& path : paths) {
    std::string bytes;
    try {
      bytes = fs::read_file(path, 64ull << 20);
    } catch (const std::exception&) {
      continue;  // unreadable: its prefixes stay absent and needs of them are refused
    }
    elf::ElfInfo info;
    auto span = std::span(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    if (elf::parse(span, info)) continue;
    for (const auto& name : info.version_definitions) {
      auto v = SymbolVersion::parse(name);
      if (!v) continue;
      bool checked = false;
      for (const char* p : kCheckedPrefixes) checked = checked || v->prefix == p;
      if (!checked) continue;
      auto it = hv.max.find(v->prefix);
      if (it == hv.max.end() || it->second < *v) {
        hv.max[v->prefix] = *v;
        hv.provider[v->prefix] = path;
      }
    }
  }
  return hv;
}

const HostVersions& HostVersions::current() {
  static const HostVersions versions = from_libraries(loaded_runtime_libraries());
  return versions;
}

}  // namespace kh
