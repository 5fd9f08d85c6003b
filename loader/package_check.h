// What `kernel-hub check` (and later `pack`) runs on a package directory or a host library:
// kernel.json, the ELF preflight, dlopen, the entry call and the module table, without running
// any op. The result prints as text or JSON.
#pragma once

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "loader/module.h"

namespace kh {

struct PackageCheck {
  std::string target;      // what was checked (directory or file)
  PreflightReport report;  // every check, in order; refusals name the file and the rule
  const LoadedModule* module = nullptr;  // when the table was read

  bool ok() const { return module != nullptr && report.ok(); }
  nlohmann::json to_json() const;
  std::string to_text() const;
};

// `target` is a package directory (with kernel.json) or a host library file. Never throws for
// a refused package: the report says why.
PackageCheck check_package(const std::filesystem::path& target);

}  // namespace kh
