#include "loader/package_dir.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "hub/error.h"
#include "hub/fs.h"

namespace kh {

namespace {

std::string required_string(const nlohmann::json& j, const char* key,
                            const std::filesystem::path& file) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string() || it->get<std::string>().empty())
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{}: \"{}\" must be a non-empty string; add it to the package's "
                            "kernel.json",
                            file.string(), key));
  return it->get<std::string>();
}

}  // namespace

PackageDir read_package_dir(const std::filesystem::path& dir) {
  std::filesystem::path file = dir / "kernel.json";
  std::string text;
  try {
    text = fs::read_file(file, 1 << 20);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kNotFound)
      throw Error(ErrorKind::kNotFound,
                  fmt::format("{} has no kernel.json: not a kernel package directory (pass the "
                              "directory of an unpacked package)",
                              dir.string()));
    throw;
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object())
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{}: not a JSON object; expected {{\"name\", \"version\", "
                            "\"host_library\"}}",
                            file.string()));
  PackageDir p;
  p.dir = dir;
  p.name = required_string(j, "name", file);
  p.version = required_string(j, "version", file);
  std::filesystem::path lib = required_string(j, "host_library", file);
  // Only a plain file name inside the package: no absolute paths, no "..", no subfolders.
  if (lib.has_parent_path() || lib.is_absolute() || lib == "." || lib == "..")
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{}: host_library \"{}\" must be a file name inside the package "
                            "directory",
                            file.string(), lib.string()));
  p.host_library = dir / lib;
  return p;
}

}  // namespace kh
