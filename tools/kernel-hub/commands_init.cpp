// init: scaffolds a kernel package that builds against the installed SDK (find_package(KernelHub),
// kernel_hub_add_package), passes `kernel-hub check` and packs as it is: a C ABI host library
// with one layer (cpu loop and CUDA launch through the loader), a header-free .cu, kernel.json.in
// and a KernelConfig to try it. The files are init_templates/, embedded in the binary.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/base/log.h"
#include "hub/oci/ref.h"
#include "tools/kernel-hub/cli.h"
#include "tools/kernel-hub/init_templates.h"

namespace kh::cli {

namespace {

namespace stdfs = std::filesystem;

// "org/name" as a hub repository (OCI name rules, at least two parts); kInvalidInput otherwise.
void check_package_name(const std::string& name) {
  if (name.find('/') == std::string::npos || !is_valid_repo_name(name))
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("init: '{}' is not a package name: expected org/name (lowercase "
                            "letters, digits and '.', '_', '-' between them, parts joined by '/'), "
                            "e.g. --name acme/scale",
                            terminal_safe(name)));
}

// Refuses a DIR that is not a directory, or a non-empty one without --force.
void check_target(const stdfs::path& dir, bool force) {
  std::error_code ec;
  auto st = stdfs::symlink_status(dir, ec);
  if (ec || st.type() == stdfs::file_type::not_found) return;
  if (st.type() != stdfs::file_type::directory)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("init: {} exists and is not a directory; choose a new directory",
                            dir.string()));
  if (force) return;
  stdfs::directory_iterator it(dir, ec);
  if (ec)
    throw Error(ErrorKind::kIo,
                fmt::format("init: cannot read {}: {}", dir.string(), ec.message()));
  if (it != stdfs::directory_iterator())
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("init: {} is not empty (it holds '{}'); choose a new directory, or "
                            "pass --force to write the scaffold into it (files of the same names "
                            "are replaced, others kept)",
                            dir.string(), it->path().filename().string()));
}

// The scaffold's name for template `name`: "NAME" -> the short name, "dot.x" -> ".x".
std::string output_name(std::string_view name, const std::string& short_name) {
  std::string out(name);
  if (out.starts_with("dot.")) out = out.substr(3);
  if (auto at = out.find("NAME"); at != std::string::npos) out.replace(at, 4, short_name);
  return out;
}

std::string fill(std::string_view text, const std::string& package, const std::string& short_name) {
  std::string out(text);
  for (auto [key, value] :
       {std::pair<std::string_view, const std::string&>{"@KH_PACKAGE@", package},
        {"@KH_NAME@", short_name}}) {
    for (size_t at = out.find(key); at != std::string::npos; at = out.find(key, at + value.size()))
      out.replace(at, key.size(), value);
  }
  return out;
}

// The SDK prefix to pass as CMAKE_PREFIX_PATH: the directory above this binary's bin/ when it is
// installed, else a placeholder (a build-tree binary has no prefix).
std::string sdk_prefix() {
  std::error_code ec;
  stdfs::path exe = stdfs::read_symlink("/proc/self/exe", ec);
  if (!ec && exe.parent_path().filename() == "bin") return exe.parent_path().parent_path().string();
  return "<kernel-hub install prefix>";
}

int run_init(Context& ctx, const stdfs::path& dir, const std::string& package, bool force) {
  check_package_name(package);
  check_target(dir, force);
  const std::string short_name = package.substr(package.rfind('/') + 1);

  fs::make_dirs(dir);
  std::vector<std::string> written;
  for (const InitTemplate& t : init_templates()) {
    std::string name = output_name(t.name, short_name);
    fs::write_file_atomic(dir / name, fill(t.text, package, short_name));
    written.push_back(name);
  }

  if (ctx.options().json) {
    ctx.print_json({{"dir", dir.string()}, {"name", package}, {"files", written}});
    return 0;
  }
  const std::string d = dir.string();
  std::string files;
  for (auto& f : written) files += (files.empty() ? "" : ", ") + f;
  ctx.say(fmt::format("Created {} in {}: {}", package, d, files));
  ctx.say(fmt::format(
      "Next steps:\n"
      "  cmake -S {0} -B {0}/build -DCMAKE_PREFIX_PATH={1}\n"
      "  cmake --build {0}/build            # {0}/build/package: lib{2}.so, {2}.cu, kernel.json\n"
      "  kernel-hub check {0}/build/package\n"
      "  kernel-hub keygen -o publisher.key\n"
      "  kernel-hub pack {0}/build/package --repo {3} -o hub/ --sign publisher.key\n"
      "  kernel-hub trust add publisher.key.pub --for {3}\n"
      "  kernel-hub --hub hub/ resolve --config {0}/kernel-config.json\n"
      "  kernel-hub --hub oci://REGISTRY push hub/{3} {3}@v1",
      d, sdk_prefix(), short_name, package));
  return 0;
}

}  // namespace

void add_init_command(CLI::App& app, Runner& run) {
  auto dir = std::make_shared<std::string>();
  auto name = std::make_shared<std::string>();
  auto force = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand(
      "init",
      "For kernel authors: scaffold a kernel package in DIR that builds against the installed "
      "SDK (find_package(KernelHub)), passes `kernel-hub check` and packs as it is: a host "
      "library with one layer (Scale: cpu loop and CUDA launch through the loader), a "
      "header-free .cu, kernel.json.in, a KernelConfig to try it, and a CMakeLists.txt. "
      "Prints the next steps (build, check, pack, push).");
  cmd->add_option("dir", *dir, "Directory to create (must be empty or absent)")->required();
  cmd->add_option("--name", *name, "Package name, org/name (e.g. acme/scale)")->required();
  cmd->add_flag("--force", *force,
                "Write into a non-empty DIR (files of the same names are replaced, others kept)");
  cmd->callback([&run, dir, name, force] {
    run = [dir, name, force](Context& ctx) { return run_init(ctx, *dir, *name, *force); };
  });
}

}  // namespace kh::cli
