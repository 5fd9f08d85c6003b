// What `kernel-hub check` and `pack` run on a package directory or a host library: kernel.json,
// the ELF preflight, dlopen, the entry call and the module table, without running any op. The
// result prints as text or JSON.
//
// The library's code never runs in the calling process: kernel.json and the preflight (pure
// parsing) run here; dlopen, kh_module_v1 and reading its table run in a forked child process
// that reports the checks and the table back over a pipe as JSON. A crash, exit or hang of the
// child is a failed check ("the library crashed the checker: SIGSEGV"), never a crash of the
// caller. (The Runtime's real load path, loader/module.h, loads in process, after trust.)
#pragma once

#include <chrono>
#include <deque>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/module.h"

namespace kh {

// The module table the child read, copied into this process and validated again with
// read_module_table. Names, schemas, flags and dtypes are the package's; an op's `call` is a stub
// that returns KH_ERR_UNSUPPORTED, since the library was never loaded here.
struct CheckedModule {
  ModuleView view;
  // What `view` points into.
  kh_module_v1_t table{};
  std::deque<std::string> strings;
  std::vector<kh_layer_v1_t> layers;
  std::vector<kh_op_v1_t> ops;
};

struct PackageCheck {
  std::string target;      // what was checked (directory or file)
  PreflightReport report;  // every check, in order; refusals name the file and the rule
  std::shared_ptr<const CheckedModule> module;  // when the table was read

  bool ok() const { return module != nullptr && report.ok(); }
  // The failed checks' messages, each on a line of its own ("\n  message"), for an error text.
  std::string failures() const;
  nlohmann::json to_json() const;
  std::string to_text() const;
};

// How long the child may take to load the library and report its table.
inline constexpr std::chrono::milliseconds kCheckTimeout{10000};

// `target` is a package directory (with kernel.json) or a host library file. Never throws for
// a refused package: the report says why. A child that does not report within `timeout` is
// killed and the check fails.
PackageCheck check_package(const std::filesystem::path& target,
                           std::chrono::milliseconds timeout = kCheckTimeout);

}  // namespace kh
