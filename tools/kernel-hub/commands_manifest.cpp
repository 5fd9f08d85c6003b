// manifest: writes a built package directory's kernel.json from a template (name, version,
// host_library, device code...) plus what the build produced: "layers" as the host library's
// module table declares them (read by `check`'s isolated load, so a table the loader would refuse
// fails here with the loader's reasons, and the manifest cannot drift from what the loader binds)
// and "files", the SHA-256 of every file of the directory. The result is validated as the
// registry reads it before it replaces kernel.json (atomically). Package builds run it as their
// last step: kernels/CMakeLists.txt and kernel_hub_add_package (tools/cmake/KernelHubPackage.cmake).
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "loader/package_check.h"
#include "registry/pack.h"
#include "registry/package_manifest.h"
#include "tools/kernel-hub/cli.h"

namespace kh::cli {

namespace {

namespace stdfs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

// The template's fields the build does not produce; kInvalidInput naming the file and the key.
ordered_json read_template(const stdfs::path& file) {
  std::string text = fs::read_file(file, kMaxPackageManifestBytes);
  ordered_json j = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("manifest: {}: not a JSON object; the template is kernel.json without "
                            "\"layers\" and \"files\" (name, version, host_library, ...)",
                            file.string()));
  for (const char* key : {"name", "version", "host_library"}) {
    auto it = j.find(key);
    if (it == j.end() || !it->is_string() || it->get<std::string>().empty())
      throw Error(
          ErrorKind::kInvalidInput,
          fmt::format("manifest: {}: \"{}\" must be a non-empty string", file.string(), key));
  }
  const std::string lib = j["host_library"].get<std::string>();
  if (lib.find('/') != std::string::npos || lib == "." || lib == "..")
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("manifest: {}: host_library '{}' must be a file name in the package "
                            "directory",
                            file.string(), lib));
  return j;
}

// A value on one line, with a space after each ',' and ':' ({"ops": {...}, "dtypes": ["fp32"]}).
std::string one_line(const ordered_json& j) {
  if (!j.is_structured()) return j.dump();
  std::string out = j.is_object() ? "{" : "[";
  size_t i = 0;
  for (auto it = j.begin(); it != j.end(); ++it, ++i) {
    if (i) out += ", ";
    if (j.is_object()) out += ordered_json(it.key()).dump() + ": ";
    out += one_line(*it);
  }
  return out + (j.is_object() ? "}" : "]");
}

// kernel.json as people read it: one line per top-level key, and one line per member of the
// object-valued ones (each layer, each file).
std::string render(const ordered_json& j) {
  std::string out = "{\n";
  size_t i = 0;
  for (auto& [key, value] : j.items()) {
    out += "  " + ordered_json(key).dump() + ": ";
    if (value.is_object() && !value.empty() && (key == "layers" || key == "files")) {
      out += "{\n";
      size_t k = 0;
      for (auto& [member, v] : value.items())
        out += "    " + ordered_json(member).dump() + ": " + one_line(v) +
               (++k < value.size() ? ",\n" : "\n");
      out += "  }";
    } else {
      out += one_line(value);
    }
    out += ++i < j.size() ? ",\n" : "\n";
  }
  return out + "}\n";
}

int run_manifest(Context& ctx, const stdfs::path& dir, stdfs::path template_file) {
  if (!stdfs::is_directory(dir))
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("manifest: {} is not a directory; pass the built package directory "
                            "(host library and device source)",
                            dir.string()));
  if (template_file.empty()) template_file = dir / kPackageManifestName;
  ordered_json j = read_template(template_file);
  const std::string library = j["host_library"].get<std::string>();

  // The loader's own checks, as `kernel-hub check` runs them (the library loads in a child).
  PackageCheck check = check_package(dir / library);
  if (!check.ok()) {
    throw Error(ErrorKind::kRefused,
                fmt::format("manifest {}: the host library failed the loader's checks (run "
                            "`kernel-hub check {}` for the full report); fix the build:{}",
                            dir.string(), (dir / library).string(), check.failures()));
  }
  const ModuleView& module = check.module->view;
  const std::string name = j["name"].get<std::string>(), version = j["version"].get<std::string>();
  if (module.name != name || module.version != version)
    throw Error(
        ErrorKind::kInvalidInput,
        fmt::format("manifest: {} says {} {} but {}'s module table says {} {}; make the "
                    "two agree",
                    template_file.string(), name, version, library, module.name, module.version));

  j["layers"] = ordered_json::parse(serialize_package_layers(package_layers_of(module, dir)));
  ordered_json files = ordered_json::object();
  for (auto& [path, digest] : hash_package_files(dir)) files[path] = digest.str();
  if (files.empty() || !files.contains(library))
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("manifest: {} has no {}", dir.string(), library));
  j["files"] = std::move(files);

  const std::string text = render(j);
  const stdfs::path out = dir / kPackageManifestName;
  PackageManifest m = PackageManifest::parse(text, out.string());  // as the registry reads it
  fs::write_file_atomic(out, text);

  if (ctx.options().json) {
    ctx.print_json(nlohmann::json::parse(text));
  } else {
    std::string layers;
    for (auto& [layer, l] : m.layers) layers += (layers.empty() ? "" : ", ") + layer;
    ctx.say(fmt::format("wrote {}: {} {}, layers {}, {} files", out.string(), m.name, m.version,
                        layers, m.files.size()));
  }
  return 0;
}

}  // namespace

void add_manifest_command(CLI::App& app, Runner& run) {
  auto dir = std::make_shared<std::string>();
  auto template_file = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand(
      "manifest",
      "For package builds: write DIR/kernel.json from a template plus the build's output: "
      "\"layers\" as the host library's module table declares them (read as `check` reads it, "
      "in a child process) and \"files\", the SHA-256 of every file in DIR. The result is "
      "validated as the registry reads it. Exit 1 if the library fails the loader's checks.");
  cmd->add_option("dir", *dir, "Built package directory (host library, device source)")->required();
  cmd->add_option("--template", *template_file,
                  "kernel.json without layers and files (default: DIR/kernel.json, refreshed in "
                  "place)");
  cmd->callback([&run, dir, template_file] {
    run = [dir, template_file](Context& ctx) { return run_manifest(ctx, *dir, *template_file); };
  });
}

}  // namespace kh::cli
