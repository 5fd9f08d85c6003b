#include "loader/package_dir.h"

#include <algorithm>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/base/log.h"
#include "loader/cuda_arch.h"
#include "loader/verified_file.h"

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

// Only a plain file name inside the package: no absolute paths, no "..", no subfolders.
std::filesystem::path file_in_package(const std::filesystem::path& dir, const std::string& name,
                                      const char* what, const std::filesystem::path& file) {
  std::filesystem::path p = name;
  // A NUL would cut the name where the file is opened but not where its digest is looked up,
  // so that file would load unchecked; control bytes have no place in a file name either.
  const bool control = std::any_of(name.begin(), name.end(), [](char c) {
    return static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
  });
  if (name.empty() || control || p.has_parent_path() || p.is_absolute() || p == "." || p == "..")
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{}: {} \"{}\" must be a file name inside the package directory",
                            file.string(), what, terminal_safe(name)));
  return dir / p;
}

void read_device_code(const nlohmann::json& j, const std::filesystem::path& file, PackageDir& p) {
  if (auto it = j.find("cubins"); it != j.end()) {
    if (!it->is_object())
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("{}: \"cubins\" must be an object mapping a target such as \"90\" "
                              "to a cubin file name",
                              file.string()));
    for (const auto& [target, name] : it->items()) {
      if (!CudaArch::parse(target) || target.starts_with("sm_"))
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("{}: cubin target \"{}\" is not a CUDA architecture like \"90\" "
                                "or \"90a\"",
                                file.string(), target));
      if (!name.is_string())
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("{}: cubins[\"{}\"] must be a file name", file.string(), target));
      p.cubins[target] = file_in_package(p.dir, name.get<std::string>(), "cubin", file);
    }
  }
  if (auto it = j.find("cuda_source"); it != j.end()) {
    if (!it->is_string())
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("{}: \"cuda_source\" must be a file name", file.string()));
    p.cuda_source = file_in_package(p.dir, it->get<std::string>(), "cuda_source", file);
  }
}

}  // namespace

std::optional<Digest> PackageDir::expected_digest(const std::filesystem::path& file) const {
  auto it = files.find(file.filename().string());
  if (it == files.end()) return std::nullopt;
  return it->second;
}

PackageDir read_package_dir(const std::filesystem::path& dir,
                            const std::optional<Digest>& manifest_digest) {
  std::filesystem::path file = dir / "kernel.json";
  std::string text;
  Digest digest;
  try {
    VerifiedFile f = open_verified(file, manifest_digest);
    text = f.read_all(1 << 20);
    digest = f.digest;
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
  // Only a plain file name inside the package: no absolute paths, no "..", no subfolders.
  p.host_library =
      file_in_package(dir, required_string(j, "host_library", file), "host_library", file);
  read_device_code(j, file, p);
  p.manifest_digest = digest;
  if (auto it = j.find("files"); it != j.end() && it->is_object()) {
    for (const auto& [name, d] : it->items()) {
      if (!d.is_string())
        throw Error(
            ErrorKind::kInvalidInput,
            fmt::format("{}: files.{} must be a \"sha256:<hex>\" string", file.string(), name));
      p.files.emplace(name, Digest::parse(d.get<std::string>()));
    }
  }
  return p;
}

}  // namespace kh
