// Loading a package host library: preflight -> dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) ->
// dlsym(kh_module_v1) -> call it with this package's host table -> validate the table.
// Libraries are never unloaded; each (path, content) loads once per process, and two versions
// of a package live side by side, each with its own ops.
#pragma once

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include "hub/base/digest.h"

#include "loader/elf_preflight.h"
#include "loader/host_services.h"
#include "loader/module_table.h"

namespace kh {

struct VerifiedFile;

struct LoadedModule {
  std::filesystem::path path;          // the host library as it was named
  Digest digest;                       // of the bytes that were preflighted and mapped
  std::shared_ptr<VerifiedFile> file;  // its descriptor, kept open while the library is mapped
  ModuleView view;
  HostContext* host = nullptr;  // the table handed to the package
};

struct LoadResult {
  // Preflight checks, then "dlopen", "entry-call", "abi-version", "module-table" as far as the
  // load got. Every failure names the file and the rule.
  PreflightReport report;
  const LoadedModule* module = nullptr;  // set only when every check passed
};

// Loads (or returns the already loaded) module at `library`: opened once, hashed (and checked
// against `expected` when given), preflighted and dlopen'ed through that one descriptor. Each
// (path, content) loads once per process. Never throws for a refused
// library: the report says why ("digest" when it differs from `expected`). Thread-safe; dlopen
// calls are serialized.
LoadResult try_load_module(const std::filesystem::path& library,
                           const std::optional<Digest>& expected = std::nullopt);

// As try_load_module, but throws kh::Error(kRefused) carrying the failed checks' messages.
const LoadedModule& load_module(const std::filesystem::path& library,
                                const std::optional<Digest>& expected = std::nullopt);

}  // namespace kh
