// Loading a package host library: preflight -> dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE) ->
// dlsym(kh_module_v1) -> call it with this package's host table -> validate the table.
// Libraries are never unloaded; each path loads once per process, and two versions of a package
// (two paths) live side by side, each with its own ops.
#pragma once

#include <filesystem>
#include <string>

#include "loader/elf_preflight.h"
#include "loader/host_services.h"
#include "loader/module_table.h"

namespace kh {

struct LoadedModule {
  std::filesystem::path path;  // canonical path of the host library
  ModuleView view;
  HostContext* host = nullptr;  // the table handed to the package
};

struct LoadResult {
  // Preflight checks, then "dlopen", "entry-call", "abi-version", "module-table" as far as the
  // load got. Every failure names the file and the rule.
  PreflightReport report;
  const LoadedModule* module = nullptr;  // set only when every check passed
};

// Loads (or returns the already loaded) module at `library`. Never throws for a refused
// library: the report says why. Thread-safe; dlopen calls are serialized.
LoadResult try_load_module(const std::filesystem::path& library);

// As try_load_module, but throws kh::Error(kRefused) carrying the failed checks' messages.
const LoadedModule& load_module(const std::filesystem::path& library);

}  // namespace kh
