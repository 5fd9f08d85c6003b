#include "loader/loaded_package.h"

#include <fmt/format.h>

#include "hub/base/error.h"

namespace kh {

LoadedPackage load_package(const std::filesystem::path& package_dir) {
  LoadedPackage p{read_package_dir(package_dir), nullptr};
  p.module = &load_module(p.dir.host_library);
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
