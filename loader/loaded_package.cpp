#include "loader/loaded_package.h"

#include <fmt/format.h>

#include "hub/base/error.h"

namespace kh {

LoadedPackage load_package(const std::filesystem::path& package_dir,
                           const std::optional<Digest>& manifest_digest) {
  LoadedPackage p{read_package_dir(package_dir, manifest_digest), nullptr};
  // The host library is checked against kernel.json's digest for it, from the descriptor it is
  // then mapped through; device code later against the same kernel.json.
  p.module = &load_module(p.dir.host_library, p.dir.expected_digest(p.dir.host_library));
  p.module->host->package.manifest_digest = p.dir.manifest_digest;
  const ModuleView& v = p.module->view;
  if (v.name != p.dir.name || v.version != p.dir.version)
    throw Error(
        ErrorKind::kRefused,
        fmt::format("{}: refused by rule package-identity: kernel.json says {} {} but "
                    "the host library says {} {}; repack the package",
                    p.dir.host_library.string(), p.dir.name, p.dir.version, v.name, v.version));
  return p;
}

}  // namespace kh
