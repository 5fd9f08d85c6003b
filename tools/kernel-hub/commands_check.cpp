// check: preflight a package directory or host library and read its module table without
// running any op; prints layers, ops, flags and every check; exit 1 on any failure. The library
// is loaded only in a child process (loader/package_check.h): its crash is a failed check.
#include <iostream>
#include <memory>

#include "loader/package_check.h"
#include "tools/kernel-hub/cli.h"

namespace kh::cli {

namespace {

int run_check(Context& ctx, const std::string& target) {
  PackageCheck result = check_package(target);
  if (ctx.options().json) {
    ctx.print_json(result.to_json());
  } else {
    std::cout << result.to_text();
  }
  if (!result.ok()) {
    for (const auto& c : result.report.checks)
      if (!c.passed) ctx.note("error: " + c.message);
  }
  return result.ok() ? 0 : 1;
}

}  // namespace

void add_check_command(CLI::App& app, Runner& run) {
  auto target = std::make_shared<std::string>();
  auto* check = app.add_subcommand(
      "check",
      "Check a package directory (with kernel.json) or a host library before publishing: ELF "
      "preflight as ld.so reads the file (machine, PT_DYNAMIC, needed libraries, no rpath, "
      "filters, audit libraries, text relocations or executable stack, STB_GNU_UNIQUE, symbol "
      "versions, entry symbol), then load it in a child process and read its module table "
      "without running any op. Exit 1 on any failure.");
  check->add_option("target", *target, "Package directory or host library (.so)")->required();
  check->callback(
      [&run, target] { run = [target](Context& ctx) { return run_check(ctx, *target); }; });
}

}  // namespace kh::cli
