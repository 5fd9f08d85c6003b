// The ELF preflight: the checks a package host library must pass before it may be dlopen'ed
// (REFERENCE §5.3, §7.4). It reads the file with kh::elf's bounds-checked reader, from the
// program headers and dynamic segment as ld.so does, and never loads it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "loader/host_versions.h"

namespace kh {

// One check's result. A refusal's message names the file and the rule.
struct Check {
  std::string name;  // the rule: elf-header, dynamic-segment, needed-libraries, no-rpath,
                     // no-filters, no-audit, no-textrel, no-execstack, no-gnu-unique,
                     // symbol-versions, entry-symbol, exports, ...
  bool passed = false;
  std::string message;
  bool warning = false;  // passed, but the author should look (e.g. extra exports)
};

struct PreflightReport {
  std::string file;
  std::vector<Check> checks;

  bool ok() const;
  // The failed checks' messages, one per line; empty when ok().
  std::string failures() const;
};

// The library names a host library may need. Everything else is refused by name.
const std::vector<std::string>& needed_allowlist();

// Runs every check on the bytes of a host library. `file` names it in messages.
PreflightReport preflight_elf(std::span<const uint8_t> bytes, const std::string& file,
                              const HostVersions& host = HostVersions::current());

// Reads the file (at most 1 GiB) and runs preflight_elf; an unreadable file is a failed
// "readable" check.
PreflightReport preflight_file(const std::filesystem::path& path,
                               const HostVersions& host = HostVersions::current());

}  // namespace kh
